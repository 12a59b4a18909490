"""What the history checker found, forced so it fails every time, and the seeds that found
it run again with the others (`test_histories.REGRESSION_SEEDS`): three bugs fixed.

Seeds 36 and 41 (SQLite, fast settings): a delete on `shared` stopped by a failpoint between
its tombstone and its validating read, then retried, got `NotFound`; once the concurrent
commit landed, the path showed again. The first attempt's branch read came before a commit
sealed the staging token, so its tombstone landed in a sealed token after the commit had
read it; the retry's look found that tombstone and took the path for gone, and the commit
dropped the token with the tombstone it never held. A retried delete (an Airflow task
retried, say) reported the path absent and left it there.

Seed 37 (PostgreSQL + SeaweedFS): a merge that lost its race reused its first attempt where
that differs from the merge of its parents (`merge.reuse_is_exact` says where).

Seed 37 again (SQLite, under load): the same retried delete, of a path only staged. Such a
delete dropped the staged row instead of writing a tombstone; a commit sealed the token and
read the row between the delete's look at the branch and the drop, and the delete stopped
before its validating read. Its retry found no row anywhere and reported `NotFound`; the
commit landed the row it had read. The drop is now guarded by the branch record
(`Store.delete_guarded`): after a seal it drops nothing and the delete writes a tombstone.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from branchwater.engine import Lake, MergeConflict, NotFound, failpoints
from branchwater.engine.api import Branch, Repository
from branchwater.engine.graveler import reads, writes
from branchwater.engine.graveler.merge import MergeResult
from tests.helpers.failpoints import held_at, paused_at
from tests.helpers.servers import unique_name
from tests.history.checker import three_way
from tests.history.runner import tree


@pytest.fixture
def two_lakes(race_kv: str, tmp_path: Path) -> Iterator[tuple[Repository, Repository]]:
    """One repository seen through two lakes (two caches): a deleting client, a committer."""
    with Lake.connect(race_kv) as deleting, Lake.connect(race_kv) as committing:
        name = unique_name("regression-")
        repo = deleting.create_repository(name, storage_namespace=f"file://{tmp_path}/{name}")
        yield repo, committing.repository(name)


@contextmanager
def _commit_held(other: Repository, message: str) -> Iterator[Callable[[], bool]]:
    """A commit of `main` through the other lake, started by the call yielded (the first
    that finds it not started; whether this one did) from inside the operation under test,
    and held before its branch swap until the block ends, when it lands."""
    with paused_at("commit.before_set") as pause:
        committer = threading.Thread(target=lambda: other.branch("main").commit(message))

        def start() -> bool:
            if committer.is_alive() or pause.reached.is_set():
                return False
            committer.start()
            pause.wait()
            return True

        yield start
        pause.release()
        committer.join(30)
    assert not committer.is_alive()


def _delete_stopped_then_retried(branch: Branch, path: str) -> None:
    """A delete stopped by a failpoint before its validating read, then run again."""
    with failpoints.armed("write.before_validate", _raise), pytest.raises(failpoints.FailpointHit):
        branch.delete(path)
    branch.delete(path)


def test_a_retried_delete_whose_tombstone_a_commit_missed_still_deletes(
    two_lakes: tuple[Repository, Repository], monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, other = two_lakes
    branch = repo.branch("main")
    branch.upload("p", b"committed")
    branch.commit("p")
    branch.upload("q", b"staged, for the commit to take")
    g = repo.lake.graveler
    look_up = reads.find_branch_look

    with _commit_held(other, "q") as start_commit, monkeypatch.context() as patched:

        def commit_seals_and_builds_after_the_look(*args: Any) -> Any:
            """The delete's look, then the commit; the delete's next read comes from a
            record cached before the seal, so its tombstone goes to the token the commit
            has already read."""
            found = look_up(*args)
            before = g.read_branch(repo.record, "main")
            if start_commit():
                g.branch_cache.put(repo.record, before)
            return found

        for module in (reads, writes):
            patched.setattr(module, "find_branch_look", commit_seals_and_builds_after_the_look)
        _delete_stopped_then_retried(branch, "p")
    with pytest.raises(NotFound):
        branch.read("p")
    branch.commit("delete p")
    assert [e.path for e in repo.ref("main").list()] == ["q"]


def test_a_retried_delete_of_a_path_only_staged_still_deletes(
    two_lakes: tuple[Repository, Repository], monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, other = two_lakes
    branch = repo.branch("main")
    branch.upload("p", b"staged only")
    staging = repo.lake.graveler.staging

    with _commit_held(other, "p") as start_commit, monkeypatch.context() as patched:

        def sealed_first(method: Callable[..., Any]) -> Callable[..., Any]:
            """The delete's row (a tombstone, or the entry dropped, guarded or not) comes
            after the commit has sealed the token and built its ranges from it."""

            def run(token: str, path: str, *args: Any) -> Any:
                start_commit()
                return method(token, path, *args)

            return run

        for name in ("put_guarded", "remove", "remove_guarded"):
            patched.setattr(staging, name, sealed_first(getattr(staging, name)))
        _delete_stopped_then_retried(branch, "p")
    assert "p" in tree(repo, repo.ref("main").commit_id)
    with pytest.raises(NotFound):
        branch.read("p")
    branch.commit("delete p")
    assert list(repo.ref("main").list()) == []


def _raise() -> None:
    raise failpoints.FailpointHit("write.before_validate")


@pytest.mark.parametrize("strategy", [None, "source-wins"])
def test_a_merge_that_lost_a_race_equals_the_merge_of_its_parents(
    two_lakes: tuple[Repository, Repository], strategy: str | None
) -> None:
    """Found by seed 37 on PostgreSQL + SeaweedFS: `main` took the source's change to `p`
    (x to y) from another branch (D1), the merge of the source was held before its branch
    swap, and a fast-forward moved `main` to D2, which changed `p` to w. The retry merged
    its first attempt (p = y) onto D2 from D1: p = w, clean, with parents (D2, source); a
    merge of the same parents from their merge base (p = x) conflicts on `p` (and with
    `source-wins` holds y). The retry now merges afresh there, so it does the same."""
    repo, other = two_lakes
    main = repo.branch("main")
    main.upload("p", b"x")
    main.commit("base")
    for name, value in (("source", b"y"), ("d1", b"y")):
        repo.create_branch(name, source="main").upload("p", value)
        repo.branch(name).commit(f"{name}: p")
    repo.merge("d1", into="main", fast_forward=False)
    d2 = repo.create_branch("d2", source="main")
    d2.upload("p", b"w")
    d2_head = d2.commit("d2: p")
    with held_at(
        "merge.before_set", lambda: repo.merge("source", "main", strategy=strategy)
    ) as merging:
        other.merge("d2", into="main")
    outcome = merging.raised or merging.result
    assert isinstance(outcome, MergeResult | MergeConflict), outcome
    source_id = repo.ref("source").commit_id
    base = repo.merge_base(d2_head.id, source_id).id
    expected = three_way(tree(repo, base), tree(repo, d2_head.id), tree(repo, source_id), strategy)
    if expected is None:
        assert isinstance(outcome, MergeConflict) and outcome.paths == ["p"]
        assert main.commit_id == d2_head.id
        return
    assert isinstance(outcome, MergeResult) and outcome.attempts == 2
    assert outcome.commit.parents == (d2_head.id, source_id)
    assert tree(repo, outcome.commit.id) == expected
