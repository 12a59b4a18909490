"""What GC must never do: delete a write racing the run, delete outside the namespace's data,
accept a malformed address, delete after a failed gate; and a sweep killed midway finishes."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa
import pytest

from branchwater.engine import InvalidAddress, InvalidArgument, NotFound, Unavailable
from branchwater.engine.graveler import writes
from branchwater.engine.graveler.model import Entry
from branchwater.spark_jobs.gc import runs
from branchwater.spark_jobs.gc.storage import Namespace
from tests.helpers import GCLake

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def stage_raw(gc: GCLake, path: str, address: str) -> None:
    """Stage an entry with any address, as no public call would."""
    entry = Entry(path, address, 1, "c", datetime.now(UTC), {})
    writes.stage_entry(gc.lake.graveler, gc.repo.record, "main", entry)


# Races -------------------------------------------------------------------------------------


def test_objects_younger_than_the_minimum_age_are_left_alone(local_gc: GCLake) -> None:
    garbage = set(local_gc.put_garbage(3))

    young = local_gc.run(min_age=timedelta(hours=1))

    assert set(local_gc.data_objects()) == garbage
    assert young.volume("candidates").objects == 0
    assert young.volume("young").objects + young.slices["skipped_young"] >= 1
    local_gc.run()
    assert local_gc.data_objects() == {}


def test_an_upload_waiting_for_its_link_survives_a_run_at_the_default_minimum_age(
    local_gc: GCLake,
) -> None:
    main = local_gc.repo.branch("main")
    physical = main.get_physical_address()
    local_gc.objects.put(physical.address, b"uploaded by spark")

    summary = local_gc.run(min_age=None)

    assert not summary.min_age_override
    assert summary.min_age_seconds == local_gc.lake.gc.settings.default_min_age.total_seconds()
    assert physical.address in local_gc.data_objects()
    main.link_physical_address("t/x", physical.token, size=17, checksum="c")
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
        gc.objects.put(key, b"not GC's to delete")

    summary = gc.run()

    assert summary.volume("deleted").objects == 1
    assert not gc.objects.exists(garbage)
    for key in inside:
        assert gc.objects.exists(key), key
    for ns in neighbours:
        assert ns.exists(garbage)
    assert summary.volume("ignored").objects == 2
    assert summary.slices["ignored_folders"] == 1


@pytest.mark.parametrize(
    "address",
    ["s3://another-bucket/data/x", "/etc/passwd", "data/../_branchwater/ranges", "tables/a"],
)
def test_a_malformed_address_in_the_inputs_is_refused_before_anything_is_deleted(
    local_gc: GCLake, address: str
) -> None:
    garbage = set(local_gc.put_garbage(2))
    stage_raw(local_gc, "t/foreign", address)

    with pytest.raises(InvalidAddress, match="not data/<slice>/<object id>"):
        local_gc.run()

    assert garbage <= set(local_gc.data_objects())
    [latest] = [s for s in runs.summaries(Namespace.of(local_gc.repo.storage_namespace))]
    assert latest.status == runs.FAILED and "refuses" in (latest.error or "")


def test_a_committed_malformed_address_is_refused_too(local_gc: GCLake) -> None:
    garbage = set(local_gc.put_garbage(2))
    stage_raw(local_gc, "t/foreign", "file:///elsewhere/data/x")
    local_gc.repo.branch("main").commit("a foreign address")

    with pytest.raises(InvalidAddress, match="committed"):
        local_gc.run()
    assert garbage <= set(local_gc.data_objects())


@pytest.mark.parametrize("address", ["_branchwater/ranges/x", "../outside", "data/x/../../y"])
def test_a_tampered_mark_is_refused_before_any_delete(local_gc: GCLake, address: str) -> None:
    garbage = set(local_gc.put_garbage(3))
    mark = local_gc.run(dry_run=True)
    ns = Namespace.of(local_gc.repo.storage_namespace)
    [key] = mark.files[runs.CANDIDATES]
    table = ns.read_parquet(key)
    extra = pa.table(
        {
            name: [address if name == "address" else table[name][0].as_py()]
            for name in table.schema.names
        },
        schema=table.schema,
    )
    ns.write_parquet(key, pa.concat_tables([table, extra]))

    with pytest.raises(InvalidAddress, match=r"not data/<slice>/<object id>"):
        local_gc.run(sweep=mark.run_id)
    assert set(local_gc.data_objects()) == garbage


def test_an_unfinished_mark_cannot_be_swept(local_gc: GCLake) -> None:
    stage_raw(local_gc, "t/foreign", "tables/a")
    with pytest.raises(InvalidAddress):
        local_gc.run()
    [failed] = runs.summaries(Namespace.of(local_gc.repo.storage_namespace))

    with pytest.raises(InvalidArgument, match="did not finish marking"):
        local_gc.run(sweep=failed.run_id)
    with pytest.raises(NotFound, match="no summary"):
        local_gc.run(sweep="000000000000-000000")


# Resuming ----------------------------------------------------------------------------------


def test_a_sweep_that_failed_midway_finishes_when_run_again_with_its_mark_id(
    local_gc: GCLake,
) -> None:
    """One object of the mark turns into a folder, so deleting it fails its task (as a
    killed executor would stop one): the other files are swept and recorded, the mark stays
    unswept; once the folder is gone, the same mark id finishes the job."""
    garbage = set(local_gc.put_garbage(12))
    mark = local_gc.run(dry_run=True, candidates_per_file=2, partitions=6)
    assert len(mark.files[runs.CANDIDATES]) > 2
    stuck = sorted(garbage)[5]
    root = Path(urlsplit(local_gc.repo.storage_namespace).path)
    (root / stuck).unlink()
    (root / stuck).mkdir()
    (root / stuck / "inside").write_bytes(b"x")

    with pytest.raises(Unavailable, match=r"[Ii]s a directory"):
        local_gc.run(sweep=mark.run_id)
    ns = Namespace.of(local_gc.repo.storage_namespace)
    unfinished = runs.read_summary(ns, mark.run_id)
    assert unfinished.status == runs.MARKED and "sweep unfinished" in (unfinished.error or "")

    shutil.rmtree(root / stuck)
    swept = local_gc.run(sweep=mark.run_id)

    assert swept.status == runs.SWEPT and swept.error is None
    assert local_gc.data_objects() == {}
    assert swept.volume("deleted").objects == len(garbage)
    recorded = {
        address
        for key in swept.files["deleted"]
        for address in ns.read_parquet(key, ["address"])[0].to_pylist()
    }
    assert recorded == garbage
