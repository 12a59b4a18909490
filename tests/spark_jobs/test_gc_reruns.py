"""A prepare run marked again (an Airflow mark task retried or cleared), and a mark swept by
another repository than the one it was made in: the sweep deletes only what a gate that
passed validated, in the repository it judged."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from branchwater.engine import InvalidArgument, failpoints
from branchwater.engine.cli.gc import spark_home, spark_submit
from branchwater.engine.gc.addresses import AddressAllocator
from branchwater.engine.gc.runs import files, statuses
from branchwater.engine.gc.runs.config import JOB_KV_ENV, JobConfig
from branchwater.engine.gc.runs.storage import Namespace
from branchwater.engine.gc.runs.sweeps import sweep_without_spark
from branchwater.spark_jobs.gc import arguments
from tests.helpers.gc import GCLake
from tests.spark_jobs.test_gc_runs import history
from tests.spark_jobs.test_gc_safety import KILLED_LEASE, retry_while_locked, run_to_its_kill

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PARTITIONS = 4
"""Both marks of a test file their candidates in the same partitions, so under the same
names."""


def namespace(gc: GCLake) -> Namespace:
    return Namespace.of(gc.repo.storage_namespace, gc.s3_options)


def test_a_swept_run_is_not_marked_again(local_gc: GCLake) -> None:
    """Marking it again would overwrite the summary of what it deleted (and the base an
    optimized run starts from) with a new mark whose files its `deleted/` records shadow."""
    history(local_gc)
    run_id = local_gc.repo.prepare_uncommitted_for_gc().run_id
    swept = local_gc.run(prepare_run=run_id)
    assert swept.status == statuses.SWEPT and swept.volume("deleted").objects

    with pytest.raises(InvalidArgument, match=f"GC run {run_id} was swept"):
        local_gc.run(prepare_run=run_id, dry_run=True)

    saved = files.read_summary(namespace(local_gc), run_id)
    assert saved.status == statuses.SWEPT and saved.counts == swept.counts


def test_an_unswept_mark_marked_again_is_replaced_and_swept(local_gc: GCLake) -> None:
    """A retried mark task: the earlier mark is withdrawn, the new one swept."""
    keep, _ = history(local_gc)
    run_id = local_gc.repo.prepare_uncommitted_for_gc().run_id
    first = local_gc.run(prepare_run=run_id, dry_run=True)
    assert first.status == statuses.MARKED

    again = local_gc.run(prepare_run=run_id, dry_run=True)
    marked = candidates(local_gc, again)
    swept = local_gc.run(sweep=run_id)

    assert again.status == statuses.MARKED and again.counts == first.counts and marked
    assert swept.status == statuses.SWEPT and swept.volume("deleted").objects == len(marked)
    assert not marked & set(local_gc.data_objects()) and keep <= set(local_gc.data_objects())


def candidates(gc: GCLake, mark: files.RunSummary) -> set[str]:
    ns = namespace(gc)
    return {
        a
        for key in mark.files[files.CANDIDATES]
        for a in ns.read_parquet(key)["address"].to_pylist()
    }


def remark_killed_before_its_gate(gc: GCLake, run_id: str, log: Path, *args: str) -> None:
    """The job marking `run_id` again (spark-submit, driver, workers in a session of their
    own), its driver killed once the candidates are written, before its gate."""
    command = [
        *(spark_submit(spark_home()), "--master", "local[2]", "--conf", "spark.ui.enabled=false"),
        str(Path(arguments.__file__).with_name("__main__.py")),
        *("--kv-env", JOB_KV_ENV, "--repo", gc.repo.name, "--prepare-run", run_id, "--dry-run"),
        *("--partitions", str(PARTITIONS), "--lock-ttl", f"{KILLED_LEASE}s", *args),
    ]
    env = {**os.environ, JOB_KV_ENV: gc.kv_url, failpoints.ENV: "gc.mark.before_gate=kill"}
    run_to_its_kill(command, env, log)


@pytest.mark.usefixtures("spark_submit_conf")
def test_a_mark_killed_while_marking_again_leaves_nothing_to_sweep(
    local_gc: GCLake, tmp_path: Path
) -> None:
    """The first mark kept objects younger than an hour and its gate passed; marking again
    with no minimum age, killed before its gate, rewrote the candidates files under the
    same names. The earlier summary still said "marked, gate passed, an hour", so its
    sweep deleted a 30-minute-old object no gate had validated. Now the earlier mark is
    withdrawn before the files are rewritten: nothing can be swept, nothing is deleted."""
    opened = datetime.now(UTC) - timedelta(days=10)
    local_gc.lake.addresses = local_gc.lake.gc.addresses = AddressAllocator(clock=opened.timestamp)
    old, recent = local_gc.put_garbage(2)
    root = Path(local_gc.repo.storage_namespace.removeprefix("file://"))
    for address, age in ((old, timedelta(hours=2)), (recent, timedelta(minutes=30))):
        when = (datetime.now(UTC) - age).timestamp()
        os.utime(root / address, (when, when))
    run_id = local_gc.repo.prepare_uncommitted_for_gc().run_id
    first = local_gc.run(
        prepare_run=run_id, dry_run=True, min_age=timedelta(hours=1), partitions=PARTITIONS
    )
    assert first.status == statuses.MARKED and first.volume("candidates").objects == 1

    remark_killed_before_its_gate(
        local_gc, run_id, tmp_path / "job.log", "--min-age", "0s", "--max-share", "1"
    )

    withdrawn = files.read_summary(namespace(local_gc), run_id)
    assert withdrawn.status == statuses.FAILED and "marked again" in (withdrawn.error or "")
    with pytest.raises(InvalidArgument, match="did not finish marking"):
        retry_while_locked(lambda: local_gc.run(sweep=run_id))
    assert set(local_gc.data_objects()) == {old, recent}


def test_a_mark_left_by_a_deleted_repository_is_not_swept_by_its_successor(
    local_gc: GCLake,
) -> None:
    """A repository deleted and made again over the same namespace finds the old one's
    marks there: they judged another repository's references."""
    history(local_gc)
    mark = local_gc.run(dry_run=True)
    made_again(local_gc)
    before = set(local_gc.data_objects())

    with pytest.raises(InvalidArgument, match="another repository"):
        local_gc.run(sweep=mark.run_id)

    assert set(local_gc.data_objects()) == before
    assert files.read_summary(namespace(local_gc), mark.run_id).status == statuses.MARKED


def made_again(gc: GCLake) -> None:
    """Delete the repository and make it again over its namespace."""
    storage = gc.repo.storage_namespace
    gc.lake.delete_repository(gc.repo.name)
    gc.repo = gc.lake.create_repository(gc.repo.name, storage_namespace=storage)


def test_an_empty_mark_left_by_a_deleted_repository_is_not_swept_without_spark(
    local_gc: GCLake,
) -> None:
    mark = local_gc.run(dry_run=True, min_age=timedelta(days=1))
    assert files.nothing_to_delete(mark) and mark.status == statuses.MARKED
    made_again(local_gc)
    config = JobConfig(local_gc.kv_url, local_gc.repo.name, sweep=mark.run_id)

    with pytest.raises(InvalidArgument):
        sweep_without_spark(local_gc.repo, config)


def test_a_prepare_run_left_by_a_deleted_repository_is_refused(local_gc: GCLake) -> None:
    run_id = local_gc.repo.prepare_uncommitted_for_gc().run_id
    made_again(local_gc)

    with pytest.raises(InvalidArgument):
        local_gc.run(prepare_run=run_id, dry_run=True)
