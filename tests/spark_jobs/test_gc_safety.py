"""What GC must never do: delete a write racing the run, delete outside the namespace's data,
accept a malformed address, delete after a failed gate; and a sweep killed midway finishes."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from branchwater.engine import GCRunLocked, InvalidAddress, InvalidArgument, NotFound
from branchwater.engine.gc.runlock import GCRunLease
from branchwater.engine.gc.runs import files, plan, statuses
from branchwater.engine.gc.runs.storage import Namespace
from branchwater.engine.gc.tokens import utc_now
from branchwater.engine.graveler import writes
from branchwater.engine.graveler.model import Entry
from branchwater.spark_jobs.gc import inputs, job, packing
from branchwater.spark_jobs.gc.committed import CommittedInput
from tests.helpers.gc import GCLake

pytestmark = [pytest.mark.spark, pytest.mark.slow]

KILLED_FILES = 60
KILLED_LEASE = 5
LEASE = timedelta(seconds=KILLED_LEASE)
KILL_TIMEOUT = 300


def run_to_its_kill(command: list[str], env: dict[str, str], log: Path) -> None:
    """Run `command` (its output to `log`) in a session of its own until the failpoint armed
    in `env` kills it; whatever of it is left is killed by its process group after."""
    with open(log, "wb") as out:
        job = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            job.wait(KILL_TIMEOUT)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(job.pid, signal.SIGKILL)
            job.wait(KILL_TIMEOUT)
    assert job.returncode != 0, log.read_text()


def stage_raw(gc: GCLake, path: str, address: str) -> None:
    """Stage an entry with any address, as no public call would."""
    entry = Entry(path, address, 1, "c", datetime.now(UTC), {})
    writes.stage_entry(gc.lake.graveler, gc.repo.record, "main", entry)


# Races -------------------------------------------------------------------------------------


def test_young_objects_and_an_upload_waiting_for_its_link_survive_the_default_minimum_age(
    local_gc: GCLake,
) -> None:
    garbage = set(local_gc.put_garbage(3))
    main = local_gc.repo.branch("main")
    physical = main.get_physical_address()
    local_gc.objects.put(physical.address, b"uploaded by spark")

    young = local_gc.run(min_age=None)

    assert set(local_gc.data_objects()) == garbage | {physical.address}
    assert not young.min_age_override
    assert young.min_age_seconds == local_gc.lake.gc.settings.default_min_age.total_seconds()
    assert young.volume("candidates").objects == 0
    assert young.volume("young").objects + young.slices["skipped_young"] >= 1
    main.link_physical_address("t/x", physical.token, size=17, checksum="c")
    local_gc.run()
    assert set(local_gc.data_objects()) == {physical.address}
    assert main.read("t/x") == b"uploaded by spark"


def test_a_commit_landing_between_prepare_and_the_committed_listing_is_kept(
    local_gc: GCLake,
) -> None:
    """The object is old, linked only after prepare ran (so prepare missed it) and committed
    before the committed listing: reading committed data after prepare finds it."""
    main = local_gc.repo.branch("main")
    physical = main.get_physical_address()
    local_gc.objects.put(physical.address, b"late")
    garbage = local_gc.put_garbage()

    def commit_after_prepare(event: dict[str, Any]) -> None:
        if event.get("phase") == "prepare" and event.get("state") == "end":
            main.link_physical_address("t/late", physical.token, size=4, checksum="c")
            main.commit("landed during GC")

    summary = local_gc.run(events=commit_after_prepare)

    prepared = local_gc.repo.uncommitted_gc_run(summary.run_id)
    ns = Namespace.of(local_gc.repo.storage_namespace)
    marked = {a for key in prepared.keys for a in ns.read_parquet(key, ["address"])[0].to_pylist()}
    assert physical.address not in marked
    assert set(local_gc.data_objects()) == {physical.address}
    assert summary.volume("deleted").objects == len(garbage)


HOLD_LEASE = """
import sys
from branchwater.engine import Lake
with Lake.connect(sys.argv[1]) as lake:
    lake.repository(sys.argv[2]).lock_gc_run("optimized run by Airflow DAG gc run 7")
    print("held", flush=True)
    sys.stdin.read()
"""


def test_a_run_while_another_process_holds_the_repository_fails_naming_it(
    local_gc: GCLake,
) -> None:
    garbage = set(local_gc.put_garbage(2))
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_LEASE, local_gc.kv_url, local_gc.repo.name],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        with pytest.raises(GCRunLocked, match="holds repository 'sales': optimized run by Airf"):
            local_gc.run()
    finally:
        holder.kill()
        holder.wait(KILL_TIMEOUT)
    assert set(local_gc.data_objects()) == garbage
    assert not list(files.summaries(Namespace.of(local_gc.repo.storage_namespace)))


# Boundaries --------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["local", pytest.param("s3", marks=pytest.mark.s3)])
def test_nothing_outside_the_data_objects_of_the_namespace_is_touched(
    where: str, request: pytest.FixtureRequest
) -> None:
    gc: GCLake = request.getfixturevalue(f"{where}_gc")
    garbage = gc.put_garbage()[0]
    slice_dir = garbage.rsplit("/", 1)[0]
    namespace = gc.repo.storage_namespace
    neighbours = [
        Namespace.of(namespace + "-sibling", gc.s3_options),
        Namespace.of(namespace.rsplit("/", 1)[0] + "/other", gc.s3_options),
    ]
    for ns in neighbours:
        ns.store.put(garbage, b"another namespace's object")
    inside = [
        "_branchwater/retention/keep",
        "_branchwater/data/" + garbage,
        "elsewhere/" + garbage,
        "data/not-a-slice/0123abcd",
        f"{slice_dir}/.tmp-0123abcd.5",
        f"{slice_dir}/nested/0123abcd",
    ]
    for key in inside:
        if where == "local" and "/.tmp-" in key:
            # The local store refuses to write such a key: a write in progress leaves it.
            (Path(gc.objects.uri(key).removeprefix("file://"))).write_bytes(b"in progress")
        else:
            gc.objects.put(key, b"not GC's to delete")

    summary = gc.run()

    assert summary.volume("deleted").objects == 1
    assert not gc.objects.exists(garbage)
    for key in inside:
        assert gc.objects.exists(key), key
    for ns in neighbours:
        assert ns.exists(garbage)
    # The nested folder, and the temporary-looking key where it is an object: a local store
    # does not list its own temporary files.
    assert summary.volume("ignored").objects == (2 if where == "s3" else 1)
    assert summary.slices["ignored_folders"] == 1


@pytest.mark.parametrize("marked_on", ["executors", "driver"])
def test_a_mark_that_missed_a_committed_address_fails_the_gate_and_deletes_nothing(
    local_gc: GCLake, monkeypatch: pytest.MonkeyPatch, marked_on: str
) -> None:
    """The gate's check reads the committed addresses as the ranges gave them (the files
    the range-reading tasks wrote, or the table the driver read), not as the mark received
    them: a mark that lost one is caught, and the files the run needed only while it ran
    are gone afterwards. On the driver: an optimized run after a swept clean run."""
    main = local_gc.repo.branch("main")
    if marked_on == "driver":
        local_gc.run()
    lost = main.upload("kept", b"committed").address
    main.commit("one")
    garbage = set(local_gc.put_garbage(2))
    if marked_on == "driver":
        real_table = inputs.arrow_addresses_read

        def losing_row(table: pa.Table, bit: int) -> pa.Table:
            if bit == plan.NEW_COMMITTED:
                table = table.filter(pc.not_equal(table.column("address"), lost))
            return real_table(table, bit)

        monkeypatch.setattr(inputs, "arrow_addresses_read", losing_row)
    else:
        real_read = job.read_committed

        def losing_read(*args: Any, **kwargs: Any) -> CommittedInput:
            read = real_read(*args, **kwargs)

            def lose(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
                for batch in batches:
                    for _, bit, rows in packing.unpacked(batch):
                        assert rows is not None
                        kept = rows.filter(pc.not_equal(rows.column("address"), lost))
                        yield from packing.pack(kept, bit)

            packed = read.packed
            read.packed = lambda: packed().mapInArrow(lose, packing.PACKED_DDL)
            return read

        monkeypatch.setattr(job, "read_committed", losing_read)
    summary = local_gc.run(mode="clean" if marked_on == "executors" else "optimized")

    assert summary.slices["marked_on"] == marked_on
    assert summary.status == statuses.GATE_FAILED and summary.volume("candidates").objects == 3
    [failed] = summary.failed_expectations()
    assert failed.type == "expect_column_values_to_be_in_set"
    assert failed.kwargs["column"] == "referenced" and failed.observed["unexpected_count"] == 1
    assert set(local_gc.data_objects()) == {lost} | garbage
    scratch = files.run_prefix(summary.run_id) + "scratch/"
    assert list(local_gc.objects.list_objects(scratch)) == []


def test_a_candidate_of_unknown_age_fails_the_gate_and_deletes_nothing(
    local_gc: GCLake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GX's column checks skip nulls, so the age check alone would pass a candidate whose
    modification time the mark lost."""
    garbage = set(local_gc.put_garbage(2))
    unknown = min(garbage)
    real = job.with_age

    def ageless(candidates: DataFrame, start: datetime) -> DataFrame:
        mtime = F.when(F.col("address") != unknown, F.col("mtime"))
        return real(candidates.withColumn("mtime", mtime), start)

    monkeypatch.setattr(job, "with_age", ageless)
    summary = local_gc.run()

    assert summary.status == statuses.GATE_FAILED
    [failed] = summary.failed_expectations()
    assert failed.type == "expect_column_values_to_not_be_null"
    assert failed.kwargs["column"] == "age_seconds" and failed.observed["unexpected_count"] == 1
    assert garbage <= set(local_gc.data_objects())


MALFORMED = ["/etc/passwd", "data/../_branchwater/ranges", "tables/a", "data/x"]


def test_malformed_addresses_in_the_inputs_are_refused_before_anything_is_deleted(
    local_gc: GCLake,
) -> None:
    """Every malformed address is named (the refusal shows up to five), the run is saved as
    failed with nothing of its mark left but its summary and report, and its unfinished
    mark cannot be swept."""
    garbage = set(local_gc.put_garbage(2))
    for number, address in enumerate(MALFORMED):
        stage_raw(local_gc, f"t/foreign-{number}", address)

    with pytest.raises(InvalidAddress, match=r"4 address.*not data/<slice>/<object id>") as refused:
        local_gc.run()

    for address in MALFORMED:
        assert repr(address) in str(refused.value)
    assert garbage <= set(local_gc.data_objects())
    [failed] = files.summaries(Namespace.of(local_gc.repo.storage_namespace))
    assert failed.status == statuses.FAILED and "refuses" in (failed.error or "")
    left = {info.key for info in local_gc.objects.list_objects(files.run_prefix(failed.run_id))}
    assert {key.rsplit("/", 1)[-1] for key in left} == {files.SUMMARY, files.REPORT}
    with pytest.raises(InvalidArgument, match="did not finish marking"):
        local_gc.run(sweep=failed.run_id)
    with pytest.raises(NotFound, match="no summary"):
        local_gc.run(sweep="000000000000-000000")


def test_a_committed_malformed_address_is_refused_too(local_gc: GCLake) -> None:
    garbage = set(local_gc.put_garbage(2))
    """A full URI outside every namespace is an imported object, skipped; one into the
    namespace itself is malformed."""
    stage_raw(local_gc, "t/foreign", f"{local_gc.repo.storage_namespace}/data/x")
    local_gc.repo.branch("main").commit("a foreign address")

    with pytest.raises(InvalidAddress, match="committed"):
        local_gc.run()
    assert garbage <= set(local_gc.data_objects())


TAMPERED = ["_branchwater/ranges/x", "../outside", "data/x/../../y"]


def test_a_tampered_mark_is_refused_before_any_delete(local_gc: GCLake) -> None:
    garbage = set(local_gc.put_garbage(3))
    mark = local_gc.run(dry_run=True)
    ns = Namespace.of(local_gc.repo.storage_namespace)
    key = mark.files[files.CANDIDATES][0]
    table = ns.read_parquet(key)
    extra = pa.table(
        {
            name: TAMPERED if name == "address" else [table[name][0].as_py()] * len(TAMPERED)
            for name in table.schema.names
        },
        schema=table.schema,
    )
    ns.write_parquet(key, pa.concat_tables([table, extra]))

    with pytest.raises(InvalidAddress, match=r"3 address\(es\) that are not data/<slice>/"):
        local_gc.run(sweep=mark.run_id)
    assert set(local_gc.data_objects()) == garbage


# Resuming ----------------------------------------------------------------------------------


def start_sweep(gc: GCLake, mark_id: str, scratch: Path) -> subprocess.Popen[bytes]:
    """`branchwater gc run --sweep` in its own process group (the CLI, spark-submit, its JVM
    and Python workers), one task at a time, with a lease that outlives it by seconds."""
    command = [
        *(sys.executable, "-m", "branchwater.engine.cli", "--kv", gc.kv_url),
        *("gc", "run", gc.repo.name, "--sweep", mark_id, "--lock-ttl", f"{KILLED_LEASE}s"),
        *("--master", "local[1]", "--conf", "spark.ui.enabled=false"),
    ]
    log = open(scratch / "sweep.log", "wb")  # noqa: SIM115 - the job writes it until killed
    env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable}
    return subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
    )


def wait_for(condition: Callable[[], bool], what: str, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + KILL_TIMEOUT
    while not condition():
        assert process.poll() is None, f"the sweep ended before {what}"
        assert time.monotonic() < deadline, f"no {what} within {KILL_TIMEOUT} s"
        time.sleep(0.01)


@pytest.mark.usefixtures("spark_submit_conf")
def test_a_sweep_killed_midway_finishes_when_run_again_with_its_mark_id(
    local_gc: GCLake, tmp_path: Path
) -> None:
    """kill -9 of the whole job (CLI, driver, workers) once its first candidates file is
    swept: the mark stays unswept and its lease names the dead run until it expires; the
    same mark id then finishes the job, skipping the files already recorded."""
    garbage = set(local_gc.put_garbage(KILLED_FILES))
    mark = local_gc.run(dry_run=True, candidates_per_file=1, partitions=KILLED_FILES)
    assert len(mark.files[files.CANDIDATES]) > KILLED_FILES // 3
    ns = Namespace.of(local_gc.repo.storage_namespace)
    deleted_dir = (
        Path(urlsplit(local_gc.repo.storage_namespace).path)
        / files.run_prefix(mark.run_id)
        / files.DELETED
    )

    job = start_sweep(local_gc, mark.run_id, tmp_path)
    try:
        wait_for(lambda: any(deleted_dir.glob("part-*")), "first swept file", job)
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(KILL_TIMEOUT)
    assert job.returncode == -signal.SIGKILL
    recorded_before = len(list(deleted_dir.glob("part-*")))
    unfinished = files.read_summary(ns, mark.run_id)
    assert unfinished.status == statuses.MARKED and recorded_before > 0
    lease = GCRunLease(local_gc.lake.graveler.kv, local_gc.repo.record, utc_now, LEASE)
    held = lease.current()
    assert held is not None and not held.released
    assert held.holder.startswith(f"sweep of {mark.run_id} by ") and " pid " in held.holder

    swept = retry_while_locked(lambda: local_gc.run(sweep=mark.run_id))

    assert swept.status == statuses.SWEPT and swept.error is None
    assert local_gc.data_objects() == {}
    assert swept.volume("deleted").objects == len(garbage)
    recorded = {
        address
        for key in swept.files["deleted"]
        for address in ns.read_parquet(key, ["address"])[0].to_pylist()
    }
    assert recorded == garbage


def retry_while_locked(run: Callable[[], files.RunSummary]) -> files.RunSummary:
    """Run once the killed run's lease has expired (it lasts `KILLED_LEASE` seconds)."""
    deadline = time.monotonic() + KILLED_LEASE * 4
    while True:
        try:
            return run()
        except GCRunLocked:
            assert time.monotonic() < deadline, "the killed run's lease never expired"
            time.sleep(0.5)
