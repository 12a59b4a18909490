"""Commits a GC run is collecting (*expiring*) and whose objects retention deleted
(*expired*), recorded in the KV (`engine/graveler/fence.py` says why moves onto them refuse,
and proves the order), so reading, branching from, resetting to or tagging one raises
`CommitExpired` instead of a missing-object error deep in a read.

A run records as expiring, before its re-check, the commits whose objects it may delete, and
releases those it no longer deletes from after it. Its sweep re-arms them, all of them
before any is changed, and then records them as expired, before its first delete
(`expire_fenced`): an expired record never lapses, so however long the sweep takes, or
however late a killed one is resumed, no move reaches a commit whose objects it deletes,
and a resumed sweep finds them expired and finishes. The run deletes what of their trees no
active commit shares. The commit records themselves stay (history, `repo.commit`, `log` and
merge bases still work). An expiring record of a run that died fences for `EXPIRING_HOLD` at
most; a sweep that finds one of its records lapsed, or taken by a later run, records and
deletes nothing.

Which commits are recorded is exact: those that held an object the sweep deleted, no more
and no fewer. The run fences, before its re-check, the expired commits whose metarange no
active commit shares and whose tree lists a range holding one of its candidates; after the
re-check's drops and the age filter it keeps fenced, and its sweep records, only those whose
tree still lists a range holding a candidate left (`commits_holding`), and releases the
rest. No commit holding a deleted address escapes: the address is in no active commit's
range, so every range holding it is read on the expired side and names it, and a commit the
re-check found held had all its addresses dropped. None is recorded that lost nothing: a
commit whose objects are all also held by an active commit (an append-only table's older
commits), staged or copied on a branch, too young or imported, or whose tree an active
commit shares (a revert back to it), keeps reading.
`tests/spark_jobs/test_gc_retention.py::test_commits_recorded_as_expired_are_those_that_…`
walks the boundary.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime, timedelta

from branchwater.engine.errors import NotFound, PredicateFailed, StaleGCMark
from branchwater.engine.graveler.fence import (
    OPERATION_MARGIN,
    FenceRecord,
    check_unfenced,
    fence_key,
    read_fence,
    write_expiring_unless_claimed,
)
from branchwater.engine.graveler.model import RepositoryRecord
from branchwater.engine.kv import Store

EXPIRING_HOLD = timedelta(days=1)
"""How long an expiring record fences moves unless its run's sweep re-arms it: a run's mark
must be swept within it (a scheduled run sweeps right after its gate)."""


def mark_expiring(
    kv: Store, repo: RepositoryRecord, commit_ids: Iterable[str], run_id: str
) -> list[str]:
    """Fence `commit_ids` for run `run_id` (those already expired stay so), except those a
    move claimed within `OPERATION_MARGIN` (`fence.py` says why); returns those fenced."""
    record = FenceRecord(run_id, until=datetime.now(UTC) + EXPIRING_HOLD)
    return write_expiring_unless_claimed(kv, repo, commit_ids, record, OPERATION_MARGIN)


def release_expiring(
    kv: Store, repo: RepositoryRecord, commit_ids: Iterable[str], run_id: str
) -> None:
    """Drop run `run_id`'s expiring records of `commit_ids` (the re-check kept them)."""
    for commit_id in commit_ids:
        try:
            record, predicate = read_fence(kv, repo, commit_id)
        except NotFound:
            continue
        if record.expired is None and record.run == run_id:
            try:
                kv.delete_if(repo.partition, fence_key(commit_id), predicate)
            except PredicateFailed:
                continue


def rearm_expiring(
    kv: Store,
    repo: RepositoryRecord,
    commit_ids: Iterable[str],
    run_id: str,
    swept_before: bool = False,
) -> dict[str, bytes]:
    """Push each of run `run_id`'s records `EXPIRING_HOLD` ahead, each only while it still
    fences for this run (so it fenced without a gap since the re-check); else `StaleGCMark`
    (`swept_before`: an earlier attempt of the sweep deleted objects). Returns the values
    written, by commit; a commit expired already is left as it is."""
    rearmed: dict[str, bytes] = {}
    for commit_id in commit_ids:
        now = datetime.now(UTC)
        try:
            record, predicate = read_fence(kv, repo, commit_id)
        except NotFound:
            why = "no longer recorded as expiring"
            raise _stale(run_id, commit_id, why, swept_before) from None
        if record.expired is not None:
            continue
        if record.run != run_id:
            why = f"taken by the later GC run {record.run}"
            raise _stale(run_id, commit_id, why, swept_before)
        if not record.fences(now):
            raise _stale(run_id, commit_id, f"fenced only until {record.until}", swept_before)
        value = FenceRecord(run_id, until=now + EXPIRING_HOLD).encode()
        try:
            kv.set_if(repo.partition, fence_key(commit_id), value, predicate)
        except PredicateFailed:
            why = "changed while the sweep re-armed it"
            raise _stale(run_id, commit_id, why, swept_before) from None
        rearmed[commit_id] = value
    return rearmed


def expire_fenced(
    kv: Store,
    repo: RepositoryRecord,
    commit_ids: Iterable[str],
    run_id: str,
    when: datetime,
    swept_before: bool = False,
) -> int:
    """Before a sweep's first delete: re-arm every one of run `run_id`'s records (a stale
    one raises `StaleGCMark` with nothing recorded), then record each as expired at `when`,
    a state that never lapses, replacing exactly the record re-armed. Returns how many were
    recorded now (those expired already, by a killed attempt of this sweep or by another
    run, stay as they are)."""
    rearmed = rearm_expiring(kv, repo, commit_ids, run_id, swept_before)
    expired = FenceRecord(run_id, expired=when.isoformat()).encode()
    for commit_id, armed in rearmed.items():
        try:
            kv.set_if(repo.partition, fence_key(commit_id), expired, armed)
        except PredicateFailed:
            if expired_at(kv, repo, commit_id) is None:
                why = "changed while the sweep recorded it expired"
                raise _stale(run_id, commit_id, why, swept_before) from None
    return len(rearmed)


def _stale(run_id: str, commit_id: str, why: str, swept_before: bool) -> StaleGCMark:
    if swept_before:
        outcome = (
            "this attempt deleted nothing, but an earlier attempt of this sweep deleted objects "
            "(the run's deleted/ files list them), which that commit may have held"
        )
    else:
        outcome = "nothing was deleted"
    return StaleGCMark(
        f"GC run {run_id} cannot sweep: its expiring commit {commit_id[:12]} is {why}, so a "
        f"branch, tag or restore may have reached it since the run's re-check; {outcome}, "
        "run GC again"
    )


def expired_at(kv: Store, repo: RepositoryRecord, commit_id: str) -> str | None:
    """When retention deleted the commit's objects, or None while they are kept."""
    try:
        record, _ = read_fence(kv, repo, commit_id)
    except NotFound:
        return None
    return record.expired


def check_live(kv: Store, repo: RepositoryRecord, commit_id: str) -> str:
    """`commit_id`, or `CommitExpired` when retention deleted its objects or a GC run is
    collecting them."""
    return check_unfenced(kv, repo, commit_id)
