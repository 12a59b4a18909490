"""Pruning older GC runs' data (`engine/gc/runs/pruning.py`), on a namespace on local disk."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from branchwater.engine import GCRunLocked, InvalidArgument, failpoints
from branchwater.engine.failpoints import FailpointHit
from branchwater.engine.gc.addresses import newest_first_id
from branchwater.engine.gc.prepare import RETENTION_PREFIX
from branchwater.engine.gc.runs import files, statuses
from branchwater.engine.gc.runs.pruning import (
    ABANDONED_AFTER,
    PRUNED_SETS,
    Pruned,
    prune_quietly,
    prune_runs,
)
from branchwater.engine.gc.runs.storage import Namespace
from tests.helpers.gc import save_prepared, saved_run

NOW = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
REPO_ID = "0123456789abcdef"


@pytest.fixture
def ns(tmp_path: Path) -> Namespace:
    return Namespace.of(f"file://{tmp_path}/namespace")


def save_run(ns: Namespace, hours_ago: float, status: str = statuses.SWEPT, **fields: Any) -> str:
    return saved_run(ns, NOW - timedelta(hours=hours_ago), REPO_ID, status, **fields)


def prepared_at(hours_ago: float) -> str:
    return newest_first_id(NOW - timedelta(hours=hours_ago))


def keys_of(ns: Namespace, prefix: str) -> list[str]:
    return ns.folder_keys(prefix.rstrip("/"))


def whole(ns: Namespace, run_id: str) -> bool:
    """The run's data and prepare output are all there, its summary not marked pruned."""
    prefix = files.run_prefix(run_id)
    return (
        all(keys_of(ns, prefix + name) for name in PRUNED_SETS)
        and bool(keys_of(ns, RETENTION_PREFIX + run_id))
        and files.read_summary(ns, run_id).pruned_at is None
    )


def pruned_to_summary(ns: Namespace, run_id: str) -> bool:
    """Only the summary and the report are left, the summary marked and naming no files."""
    summary = files.read_summary(ns, run_id)
    left = {key.rsplit("/", 1)[1] for key in keys_of(ns, files.run_prefix(run_id))}
    return (
        left == {files.SUMMARY, files.REPORT}
        and not keys_of(ns, RETENTION_PREFIX + run_id)
        and summary.pruned_at == NOW.isoformat()
        and summary.files == {}
    )


def test_runs_older_than_the_newest_kept_keep_only_their_summary_and_report(
    ns: Namespace,
) -> None:
    oldest, old, newer, newest = (save_run(ns, hours) for hours in (40, 30, 20, 10))

    pruned = prune_runs(ns, REPO_ID, 2, NOW)

    assert pruned == Pruned(runs=(old, oldest), prepared=(old, oldest))
    assert whole(ns, newest) and whole(ns, newer)
    assert pruned_to_summary(ns, old) and pruned_to_summary(ns, oldest)
    assert [s.run_id for s in files.summaries(ns)] == [newest, newer, old, oldest]
    assert prune_runs(ns, REPO_ID, 2, NOW) == Pruned()


def test_the_newest_base_and_the_marks_a_sweep_may_still_come_for_are_kept(
    ns: Namespace,
) -> None:
    older = save_run(ns, 400)
    superseded_mark = save_run(ns, 350, statuses.MARKED)
    base = save_run(ns, 300)
    abandoned_mark = save_run(ns, 250, statuses.MARKED)
    failed = save_run(ns, 30, statuses.GATE_FAILED)
    awaiting_sweep = save_run(ns, 20, statuses.MARKED)
    newest = save_run(ns, 10, statuses.MARKED)

    pruned = prune_runs(ns, REPO_ID, 1, NOW)

    assert pruned.runs == (failed, abandoned_mark, superseded_mark, older)
    assert whole(ns, newest) and whole(ns, awaiting_sweep) and whole(ns, base)
    assert files.latest_base(ns, REPO_ID).run_id == base  # type: ignore[union-attr]


def test_a_pruned_run_is_never_swept_nor_a_base(ns: Namespace) -> None:
    marked, newest = save_run(ns, 20, statuses.MARKED), save_run(ns, 10)
    prune_runs(ns, REPO_ID, 1, NOW)

    assert pruned_to_summary(ns, marked) and whole(ns, newest)
    with pytest.raises(InvalidArgument, match=r"was pruned at .*run GC again"):
        files.check_sweepable(files.read_summary(ns, marked), REPO_ID)
    summary = files.read_summary(ns, newest)
    summary.pruned_at = NOW.isoformat()
    files.write_summary(ns, summary)
    assert files.latest_base(ns, REPO_ID) is None


def test_a_prune_stopped_between_removing_the_data_and_marking_the_summary_is_finished_next(
    ns: Namespace,
) -> None:
    old, newest = save_run(ns, 20), save_run(ns, 10)

    def stop() -> None:
        raise FailpointHit("gc.prune.before_mark")

    with failpoints.armed("gc.prune.before_mark", stop), pytest.raises(FailpointHit):
        prune_runs(ns, REPO_ID, 1, NOW)
    half = files.read_summary(ns, old)
    assert half.pruned_at is None and half.files
    assert not any(keys_of(ns, files.run_prefix(old) + name) for name in PRUNED_SETS)

    assert prune_runs(ns, REPO_ID, 1, NOW).runs == (old,)
    assert pruned_to_summary(ns, old) and whole(ns, newest)


def test_run_folders_without_a_summary_go_once_abandoned(ns: Namespace) -> None:
    save_run(ns, 1)
    days = ABANDONED_AFTER / timedelta(hours=1)
    running, abandoned = prepared_at(days - 1), prepared_at(days + 1)
    for run_id in (running, abandoned):
        ns.store.put(files.scratch_prefix(run_id, "committed") + "/part-00000.parquet", b"rows")

    assert prune_runs(ns, REPO_ID, 1, NOW).abandoned == (abandoned,)
    assert keys_of(ns, files.run_prefix(running))
    assert not keys_of(ns, files.run_prefix(abandoned))


def test_another_repositorys_runs_are_left_alone(ns: Namespace) -> None:
    theirs = save_run(ns, 30, repository_id_of_run="fedcba9876543210")
    save_run(ns, 20)
    save_run(ns, 10)

    assert theirs not in prune_runs(ns, REPO_ID, 1, NOW).runs
    assert whole(ns, theirs)


def test_prepare_outputs_go_once_older_than_every_kept_run(ns: Namespace) -> None:
    days = ABANDONED_AFTER / timedelta(hours=1)
    stale = prepared_at(30)
    interrupted_long_ago = prepared_at(days + 1)
    interrupted_lately = prepared_at(25)
    save_prepared(ns, stale)
    save_prepared(ns, interrupted_long_ago, finished=False)
    save_prepared(ns, interrupted_lately, finished=False)
    save_run(ns, 20, prepared=False)
    kept = save_run(ns, 10)
    next_run = prepared_at(1)
    save_prepared(ns, next_run)

    pruned = prune_runs(ns, REPO_ID, 2, NOW)

    assert set(pruned.prepared) == {stale, interrupted_long_ago}
    for run_id in (interrupted_lately, kept, next_run):
        assert keys_of(ns, RETENTION_PREFIX + run_id)


def test_each_removal_checks_the_lease_first_and_a_lost_lease_stops_the_prune(
    ns: Namespace,
) -> None:
    runs = [save_run(ns, hours) for hours in (40, 30, 20, 10)]
    checks = []

    def lease_check() -> None:
        checks.append(1)
        if len(checks) == 2:
            raise GCRunLocked("the GC run lease was taken over")

    with pytest.raises(GCRunLocked):
        prune_runs(ns, REPO_ID, 1, NOW, lease_check)
    assert pruned_to_summary(ns, runs[2])
    assert whole(ns, runs[1]) and whole(ns, runs[0])

    def lost() -> None:
        raise GCRunLocked("the GC run lease was taken over")

    notices: list[dict[str, object]] = []
    assert prune_quietly(ns, REPO_ID, 1, NOW, lost, notices.append) == Pruned()
    assert "pruning older GC runs stopped: the GC run lease was taken over" in str(notices)
    assert whole(ns, runs[1])
    pruned = prune_quietly(ns, REPO_ID, 1, NOW, lambda: None, notices.append)
    assert pruned.runs == (runs[1], runs[0])
    assert "pruned 2 older runs' data" in str(notices[-1])


def test_a_damaged_summary_stops_the_prune_before_anything_is_removed(ns: Namespace) -> None:
    """Every summary is read (several at once) before the first removal, so a damaged one
    anywhere stops the prune with nothing removed, and the run that prunes says so."""
    runs = [save_run(ns, hours) for hours in (40, 30, 20, 10)]
    ns.store.put(files.run_prefix(runs[1]) + files.SUMMARY, b"{not json")

    notices: list[dict[str, object]] = []
    assert prune_quietly(ns, REPO_ID, 1, NOW, lambda: None, notices.append) == Pruned()
    assert f"GC run {runs[1]!r} has a damaged summary" in str(notices)
    assert whole(ns, runs[0]) and whole(ns, runs[2])


def test_keeping_no_run_is_refused(ns: Namespace) -> None:
    newest = save_run(ns, 10)
    with pytest.raises(InvalidArgument, match="keep at least the newest"):
        prune_runs(ns, REPO_ID, 0, NOW)
    assert whole(ns, newest)
