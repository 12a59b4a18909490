"""The GC job stopped at each named step of its driver: before the gate, nothing is deleted;
before or after the sweep's deletes, a sweep of the same mark run again finishes it. Raised
out of, the run lets its lease go, so the next run goes ahead; killed (the whole job, by
`BRANCHWATER_FAILPOINTS`), the next run goes ahead once the dead run's lease expires."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from branchwater.engine import failpoints
from branchwater.engine.failpoints import FailpointHit
from branchwater.engine.gc.runlock import GCRunLease
from branchwater.engine.gc.runs import files, statuses
from branchwater.engine.gc.runs.storage import Namespace
from branchwater.engine.gc.tokens import utc_now
from tests.helpers.gc import GCLake
from tests.spark_jobs.test_gc_runs import history
from tests.spark_jobs.test_gc_safety import (
    KILLED_LEASE,
    LEASE,
    retry_while_locked,
    run_to_its_kill,
)

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def _raise() -> None:
    raise FailpointHit("forced")


def test_a_run_stopped_before_its_gate_deletes_nothing_and_the_next_run_collects(
    local_gc: GCLake,
) -> None:
    keep, garbage = history(local_gc)
    with failpoints.armed("gc.mark.before_gate", _raise), pytest.raises(FailpointHit):
        local_gc.run()
    assert set(local_gc.data_objects()) == keep | garbage
    summary = local_gc.run()
    assert summary.status == statuses.SWEPT and summary.gate_success
    assert set(local_gc.data_objects()) == keep


@pytest.mark.parametrize("point", ["gc.sweep.before_delete", "gc.sweep.after_delete"])
def test_a_sweep_stopped_at_each_step_is_finished_by_sweeping_again(
    local_gc: GCLake, point: str
) -> None:
    keep, garbage = history(local_gc)
    mark = local_gc.run(dry_run=True)
    with failpoints.armed(point, _raise), pytest.raises(FailpointHit):
        local_gc.run(sweep=mark.run_id)
    left = set(local_gc.data_objects())
    if point == "gc.sweep.before_delete":
        assert left == keep | garbage
    else:
        assert left == keep
        ns = Namespace.of(local_gc.repo.storage_namespace, local_gc.s3_options)
        saved = files.read_summary(ns, mark.run_id)
        assert saved.error and f"--sweep {mark.run_id}" in saved.error
    swept = local_gc.run(sweep=mark.run_id)
    assert swept.run_id == mark.run_id and swept.status == statuses.SWEPT
    assert set(local_gc.data_objects()) == keep
    for entry in local_gc.repo.branch("main").list():
        local_gc.repo.branch("main").read(entry.path)


def killed_job(gc: GCLake, point: str, scratch: Path, *args: str) -> None:
    """`branchwater gc run` (CLI, spark-submit, driver) in a session of its own, its driver
    killed at `point`; whatever of it is left is killed by its process group after."""
    command = [
        *(sys.executable, "-m", "branchwater.engine.cli", "--kv", gc.kv_url, "gc", "run"),
        *(gc.repo.name, "--lock-ttl", f"{KILLED_LEASE}s", "--min-age", "0s", "--max-share", "1"),
        *("--master", "local[1]", "--conf", "spark.ui.enabled=false", *args),
    ]
    env = {**os.environ, failpoints.ENV: f"{point}=kill", "PYSPARK_PYTHON": sys.executable}
    run_to_its_kill(command, env, scratch / "job.log")
    lease = GCRunLease(gc.lake.graveler.kv, gc.repo.record, utc_now, LEASE).current()
    assert lease is not None and not lease.released, "the job died before it held its lease"


@pytest.mark.usefixtures("spark_submit_conf")
@pytest.mark.parametrize("point", ["gc.mark.before_gate", "gc.sweep.after_delete"])
def test_a_job_killed_at_a_step_is_finished_by_the_next_run(
    local_gc: GCLake, tmp_path: Path, point: str
) -> None:
    keep, garbage = history(local_gc)
    if point == "gc.mark.before_gate":
        killed_job(local_gc, point, tmp_path)
        assert set(local_gc.data_objects()) == keep | garbage
        summary = retry_while_locked(lambda: local_gc.run())
    else:
        mark = local_gc.run(dry_run=True)
        killed_job(local_gc, point, tmp_path, "--sweep", mark.run_id)
        assert set(local_gc.data_objects()) == keep
        ns = Namespace.of(local_gc.repo.storage_namespace, local_gc.s3_options)
        assert files.read_summary(ns, mark.run_id).status == statuses.MARKED
        summary = retry_while_locked(lambda: local_gc.run(sweep=mark.run_id))
    assert summary.status == statuses.SWEPT and summary.gate_success
    assert set(local_gc.data_objects()) == keep
