"""The GC job stopped at each named step of its driver: before the gate, nothing is deleted;
before or after the sweep's deletes, a sweep of the same mark run again finishes it. Each
time the run's lease is let go, so the next run goes ahead."""

from __future__ import annotations

import pytest

from branchwater.engine import failpoints
from branchwater.engine.failpoints import FailpointHit
from branchwater.engine.gc.runs import files, statuses
from branchwater.engine.gc.runs.storage import Namespace
from tests.helpers.gc import GCLake
from tests.spark_jobs.test_gc_runs import history

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
