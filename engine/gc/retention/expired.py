"""Commits a GC run is collecting (*expiring*) and whose objects retention deleted
(*expired*), recorded in the KV (`engine/graveler/fence.py` says why moves onto them refuse,
and proves the order), so reading, branching from, resetting to or tagging one raises
`CommitExpired` instead of a missing-object error deep in a read.

A run records as expiring, before its re-check, the commits whose objects it may delete, and
releases those it no longer deletes from after it. Its sweep re-arms them
before deleting and records them as expired after: the run deleted what of their trees no
active commit shares. The commit records themselves stay (history, `repo.commit`, `log` and
merge bases still work). An expiring record of a run that died fences for `EXPIRING_HOLD` at
most; a sweep that finds one of its records lapsed, or taken by a later run, deletes nothing.

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


def record_expired(
    kv: Store, repo: RepositoryRecord, commit_ids: Iterable[str], when: datetime, run_id: str
) -> int:
    """Record `commit_ids` as expired by run `run_id` at `when`; returns how many. Writing
    one again (a sweep resumed) keeps it expired, with the later time."""
    value = FenceRecord(run_id, expired=when.isoformat()).encode()
    count = 0
    for commit_id in commit_ids:
        kv.set(repo.partition, fence_key(commit_id), value)
        count += 1
    return count


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
    kv: Store, repo: RepositoryRecord, commit_ids: Iterable[str], run_id: str
) -> None:
    """Before a sweep deletes: push each of run `run_id`'s records `EXPIRING_HOLD` ahead,
    each only while it still fences for this run (so it fenced without a gap since the
    re-check); else `StaleGCMark`, nothing deleted."""
    for commit_id in commit_ids:
        now = datetime.now(UTC)
        try:
            record, predicate = read_fence(kv, repo, commit_id)
        except NotFound:
            raise _stale(run_id, commit_id, "no longer recorded as expiring") from None
        if record.expired is not None:
            continue
        if record.run != run_id:
            raise _stale(run_id, commit_id, f"taken by the later GC run {record.run}")
        if not record.fences(now):
            raise _stale(run_id, commit_id, f"fenced only until {record.until}")
        value = FenceRecord(run_id, until=now + EXPIRING_HOLD).encode()
        try:
            kv.set_if(repo.partition, fence_key(commit_id), value, predicate)
        except PredicateFailed:
            raise _stale(run_id, commit_id, "changed while the sweep re-armed it") from None


def _stale(run_id: str, commit_id: str, why: str) -> StaleGCMark:
    return StaleGCMark(
        f"GC run {run_id} cannot sweep: its expiring commit {commit_id[:12]} is {why}, so a "
        "branch, tag or restore may have reached it since the run's re-check; nothing was "
        "deleted, run GC again"
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
