"""The retention fence (engine/graveler/fence.py) on SQLite and PostgreSQL: a move onto a
commit a GC run is collecting refuses naming the run and writes nothing; a run leaves a
commit a move claimed within the operation margin unfenced, so its sweep deletes nothing,
and replaces an older claim; a dead run's record stops fencing once it lapses, and a sweep
whose record lapsed, was replaced by a claim or taken over deletes nothing (`StaleGCMark`).
The same moves in another process, against a run held at its worst moments:
`tests/gc/test_retention_races.py`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from branchwater.engine import CommitExpired, Lake, failpoints
from branchwater.engine.api import Branch, Repository
from branchwater.engine.errors import NotFound, StaleGCMark
from branchwater.engine.gc.retention.expired import (
    expired_at,
    mark_expiring,
    rearm_expiring,
    release_expiring,
)
from branchwater.engine.graveler.fence import (
    FenceRecord,
    fence_key,
    read_fence,
)
from tests.helpers.gc import age_claims, record_expired

RUN = "18f2a9c3b7d1-fence"


@pytest.fixture
def fenced_repo(race_kv: str, tmp_path: Path) -> Iterator[Repository]:
    with Lake.connect(race_kv) as lake:
        yield lake.create_repository("sales", storage_namespace=f"file://{tmp_path}/ns")


def history(repo: Repository) -> tuple[str, str, str]:
    """(root, old, new) on main: the root holds `a`, old adds `b`, new adds `c`."""
    main = repo.branch("main")
    main.upload("a", b"1")
    root = main.commit("root").id
    main.upload("b", b"old")
    old = main.commit("old").id
    main.upload("c", b"new")
    new = main.commit("new").id
    return root, old, new


def fence(repo: Repository, commit_id: str, run: str = RUN) -> None:
    mark_expiring(repo.lake.graveler.kv, repo.record, [commit_id], run)


def refused(move: Callable[[], object], commit_id: str) -> None:
    with pytest.raises(CommitExpired) as raised:
        move()
    assert raised.value.commit_id == commit_id
    assert raised.value.collecting == RUN and RUN in str(raised.value)


def test_every_move_onto_an_expiring_commit_refuses(fenced_repo: Repository) -> None:
    """Each move claims before it writes, so a refused one leaves nothing: no ref, no staged
    entry, and no commit record either (a merge, revert or cherry-pick included)."""
    repo = fenced_repo
    root, old, new = history(repo)
    side = repo.create_branch("side", source=new)
    repo.create_branch("pick", source=root)
    commits = {c.id for c in repo.lake.graveler.refs.list_commits(repo.record)}
    fence(repo, old)
    refused(lambda: repo.create_branch("again", source=old), old)
    refused(lambda: repo.tag("again", old), old)
    refused(lambda: side.reset(to=old), old)
    refused(lambda: repo.revert("side", old), old)
    refused(lambda: repo.cherry_pick("pick", old), old)
    refused(lambda: repo.merge(old, "pick", fast_forward=False), old)
    refused(lambda: repo.merge(old, "pick"), old)
    refused(lambda: repo.ref(old), old)
    side.upload("b", b"edited")
    refused(lambda: side.restore(["b"], source=old), old)
    assert [b.name for b in repo.branches()] == ["main", "pick", "side"]
    assert repo.tags() == []
    assert (repo.branch("side").commit_id, repo.branch("pick").commit_id) == (new, root)
    assert repo.branch("side").read("b") == b"edited"
    assert repo.ref(new).read("b") == b"old"
    assert {c.id for c in repo.lake.graveler.refs.list_commits(repo.record)} == commits


def test_a_fresh_claim_keeps_the_record_out_and_the_sweep_from_deleting(
    fenced_repo: Repository,
) -> None:
    """A claim before the record, still within the margin: its move may be about to write,
    so the run writes no record and a sweep expiring the commit refuses. Once the margin
    passed, the move's write (here: the branch) landed before the record, and the record
    replaces the claim."""
    repo = fenced_repo
    kv = repo.lake.graveler.kv
    _, old, _ = history(repo)
    repo.create_branch("late", source=old)
    assert mark_expiring(kv, repo.record, [old], RUN) == []
    with pytest.raises(NotFound):
        read_fence(kv, repo.record, old)
    assert repo.ref(old).read("b") == b"old"
    with pytest.raises(StaleGCMark, match="no longer recorded as expiring"):
        rearm_expiring(kv, repo.record, [old], RUN)
    release_expiring(kv, repo.record, [old], RUN)
    assert expired_at(kv, repo.record, old) is None
    age_claims(repo)
    assert mark_expiring(kv, repo.record, [old], RUN) == [old]
    assert read_fence(kv, repo.record, old)[0].run == RUN
    refused(lambda: repo.create_branch("later", source=old), old)


def restore_history(repo: Repository) -> tuple[str, Branch]:
    """(the commit that held `d/0`..`d/2`, a branch from main after they were deleted)."""
    main = repo.branch("main")
    for i in range(3):
        main.upload(f"d/{i}", f"old-{i}".encode())
    source = main.commit("old").id
    for i in range(3):
        main.delete(f"d/{i}")
    main.commit("new")
    return source, repo.create_branch("side", source="main")


def test_a_restore_outlasting_the_margin_stops_at_a_run_fencing_its_source(
    fenced_repo: Repository,
) -> None:
    """A restore stages path after path and may outlast the margin: its first claim then
    looks stale, and a run may fence the source commit after its re-check saw only the
    paths staged so far (here, between the first path and the second). The restore claims
    again before each path, so it stops there: nothing the re-check did not see is
    staged. (Claimed once only, it staged every path onto objects the sweep deleted.)"""
    repo = fenced_repo
    source, side = restore_history(repo)
    paths_reached: list[None] = []

    def slow_then_fenced() -> None:
        paths_reached.append(None)
        if len(paths_reached) == 2:
            age_claims(repo)
            fence(repo, source)

    with failpoints.armed("restore.before_stage", slow_then_fenced):
        refused(lambda: side.restore(["d/"], source=source), source)

    assert [change.path for change in side.uncommitted()] == ["d/0"]


def test_a_restore_outlasting_the_margin_claims_its_source_again(
    fenced_repo: Repository,
) -> None:
    """With no run about, a restore whose claim aged past half the margin claims anew, so
    a run starting now leaves its source unfenced."""
    repo = fenced_repo
    kv = repo.lake.graveler.kv
    source, side = restore_history(repo)

    with failpoints.armed("restore.before_stage", lambda: age_claims(repo)):
        assert side.restore(["d/"], source=source) == 3

    assert mark_expiring(kv, repo.record, [source], RUN) == []
    assert [side.read(f"d/{i}") for i in range(3)] == [b"old-0", b"old-1", b"old-2"]


def test_a_dead_runs_record_lapses_and_its_sweep_deletes_nothing(
    fenced_repo: Repository,
) -> None:
    """A lapsed record fences nothing: a move claims over it, and the dead run's sweep,
    finding its record gone, deletes nothing; a later run's record is not the first's."""
    repo = fenced_repo
    kv = repo.lake.graveler.kv
    _, old, _ = history(repo)
    lapsed = FenceRecord(RUN, until=datetime.now(UTC) - timedelta(seconds=1))
    kv.set(repo.record.partition, fence_key(old), lapsed.encode())
    with pytest.raises(StaleGCMark, match="fenced only until"):
        rearm_expiring(kv, repo.record, [old], RUN)
    assert repo.create_branch("again", source=old).commit_id == old
    with pytest.raises(StaleGCMark, match="no longer recorded as expiring"):
        rearm_expiring(kv, repo.record, [old], RUN)
    age_claims(repo)
    fence(repo, old, "later-run")
    with pytest.raises(StaleGCMark, match="later-run"):
        rearm_expiring(kv, repo.record, [old], RUN)
    release_expiring(kv, repo.record, [old], RUN)
    assert read_fence(kv, repo.record, old)[0].run == "later-run"


def test_a_sweep_rearms_its_records_then_records_them_expired(fenced_repo: Repository) -> None:
    repo = fenced_repo
    kv = repo.lake.graveler.kv
    _, old, new = history(repo)
    fence(repo, old)
    before = read_fence(kv, repo.record, old)[0].until
    rearm_expiring(kv, repo.record, [old], RUN)
    after = read_fence(kv, repo.record, old)[0].until
    assert before is not None and after is not None and after >= before
    assert expired_at(kv, repo.record, old) is None
    when = datetime(2026, 5, 1, tzinfo=UTC)
    record_expired(kv, repo.record, [old], when, RUN)
    mark_expiring(kv, repo.record, [old], "next-run")
    assert expired_at(kv, repo.record, old) == when.isoformat()
    rearm_expiring(kv, repo.record, [old], "next-run")
    with pytest.raises(CommitExpired, match=r"deleted from .* on"):
        repo.create_branch("again", source=old)
    assert repo.create_branch("fine", source=new).commit_id == new
