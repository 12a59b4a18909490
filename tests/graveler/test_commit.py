"""A commit that finds another commit's seal under way waits for it, then seals, or finds its
writes recorded by another waiter's commit (`graveler.commit.seal`). Every interleaving is
forced with failpoints: a commit held after its seal, and the waiters seen waiting at
`commit.awaiting`. Across processes: each writer's commit call, whatever it returns, leaves
its writes in HEAD."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import pytest

from branchwater.engine import AlreadyRecorded, Commit, Lake, NoChanges, Repository
from branchwater.engine.failpoints import FailpointHit, armed
from branchwater.engine.graveler import compaction
from tests.helpers.failpoints import PAUSE_TIMEOUT, Pause, paused_at
from tests.helpers.servers import forked_pool
from tests.helpers.views import committed


class Waiters:
    """The threads seen waiting for a commit under way (`commit.awaiting`)."""

    def __init__(self) -> None:
        self._seen: set[int] = set()
        self._changed = threading.Condition()

    def hit(self) -> None:
        with self._changed:
            self._seen.add(threading.get_ident())
            self._changed.notify_all()

    @property
    def count(self) -> int:
        with self._changed:
            return len(self._seen)

    def wait_for(self, count: int) -> None:
        with self._changed:
            assert self._changed.wait_for(lambda: len(self._seen) >= count, PAUSE_TIMEOUT)


@contextmanager
def watched() -> Iterator[Waiters]:
    waiters = Waiters()
    with armed("commit.awaiting", waiters.hit):
        yield waiters


@dataclass
class Held:
    """A commit of `a` ("first") held after its seal, with a pool for more calls."""

    pool: ThreadPoolExecutor
    first: Future[Commit]
    pause: Pause
    seen: Waiters


@contextmanager
def a_commit_held(repo: Repository, workers: int = 1) -> Iterator[Held]:
    main = repo.branch("main")
    main.upload("a", b"a")
    with (
        ThreadPoolExecutor(workers) as pool,
        paused_at("commit.after_seal") as pause,
        watched() as seen,
    ):
        first = pool.submit(main.commit, "first")
        pause.wait()
        yield Held(pool, first, pause, seen)


def waiting_at_most(repo: Repository, monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    g = repo._g
    monkeypatch.setattr(g, "retry", dataclasses.replace(g.retry, commit_wait=seconds))


def sealed_tokens(repo: Repository) -> tuple[str, ...]:
    return repo._g.read_branch(repo.record, "main").sealed_tokens


def test_a_commit_waits_for_the_one_under_way_then_seals_its_own(repo: Repository) -> None:
    main = repo.branch("main")
    with a_commit_held(repo, workers=2) as held:
        main.upload("b", b"b")
        before = sealed_tokens(repo)
        second = held.pool.submit(main.commit, "second")
        held.seen.wait_for(1)
        assert sealed_tokens(repo) == before, "the waiting commit sealed nothing"
        assert not second.done()
        held.pause.release()
        landed = held.first.result(PAUSE_TIMEOUT), second.result(PAUSE_TIMEOUT)
    assert landed[1].parents == (landed[0].id,)
    assert committed(repo, landed[0].id) == ["a"]
    assert committed(repo, landed[1].id) == ["a", "b"]
    assert list(main.uncommitted()) == []


def test_a_commit_called_after_another_sealed_its_writes_finds_them_recorded(
    repo: Repository, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writes were sealed by a commit under way before this call: once that commit
    lands, they are recorded there, and the call names it rather than say "nothing". The
    call waits for it however long a loaded machine takes to land it, never sealing beside."""
    waiting_at_most(repo, monkeypatch, 10 * PAUSE_TIMEOUT)
    main = repo.branch("main")
    with a_commit_held(repo, workers=2) as held:
        later = held.pool.submit(main.commit, "later")
        held.seen.wait_for(1)
        held.pause.release()
        first = held.first.result(PAUSE_TIMEOUT)
        with pytest.raises(AlreadyRecorded, match="already recorded") as recorded:
            later.result(PAUSE_TIMEOUT)
    assert recorded.value.commit_id == first.id == main.head().id
    with pytest.raises(NoChanges, match="nothing to commit") as nothing:
        main.commit("nothing at all")
    assert not isinstance(nothing.value, AlreadyRecorded)


def test_a_commit_waiting_while_the_branch_is_reset_finds_nothing_to_commit(
    repo: Repository,
) -> None:
    """A reset drops the staged writes without a commit: the waiting call has nothing to
    commit, and does not claim a concurrent commit recorded anything."""
    main = repo.branch("main")
    head = main.head()
    with a_commit_held(repo, workers=2) as held:
        main.upload("b", b"b")
        waiting = held.pool.submit(main.commit, "waiting")
        held.seen.wait_for(1)
        main.reset()
        held.pause.release()
        with pytest.raises(NoChanges) as nothing:
            waiting.result(PAUSE_TIMEOUT)
        assert not isinstance(nothing.value, AlreadyRecorded), nothing.value
        with pytest.raises(NoChanges, match="reset") as dropped:
            held.first.result(PAUSE_TIMEOUT)
        assert not isinstance(dropped.value, AlreadyRecorded), dropped.value
    assert main.head() == head and list(main.uncommitted()) == []


def test_a_commit_whose_sealed_writes_a_reset_dropped_commits_nothing(repo: Repository) -> None:
    """The reset lands between the seal and the build: the commit must not name HEAD as
    holding writes that were dropped, nor commit them."""
    main = repo.branch("main")
    head = main.head()
    with a_commit_held(repo) as held:
        main.reset()
        held.pause.release()
        with pytest.raises(NoChanges, match="reset") as dropped:
            held.first.result(PAUSE_TIMEOUT)
    assert not isinstance(dropped.value, AlreadyRecorded), dropped.value
    assert main.head() == head and committed(repo, head.id) == []


def two_commits(repo: Repository) -> tuple[Commit, Commit]:
    """An older commit and HEAD made on it, so a reset can move the branch back."""
    main = repo.branch("main")
    main.upload("old", b"old")
    older = main.commit("older")
    main.upload("new", b"new")
    return older, main.commit("newer")


def test_a_commit_whose_sealed_writes_a_reset_to_an_older_commit_dropped_commits_nothing(
    repo: Repository,
) -> None:
    """HEAD moved, but to a commit that does not descend from the one the writes were
    staged on: no commit holds them, so none is named as holding them."""
    older, _ = two_commits(repo)
    main = repo.branch("main")
    with a_commit_held(repo) as held:
        main.reset(to=older.id)
        held.pause.release()
        with pytest.raises(NoChanges, match="reset to") as dropped:
            held.first.result(PAUSE_TIMEOUT)
    assert not isinstance(dropped.value, AlreadyRecorded), dropped.value
    assert main.head() == older and committed(repo, older.id) == ["old"]


def test_a_commit_waiting_while_the_branch_is_reset_to_an_older_commit_finds_nothing(
    repo: Repository,
) -> None:
    older, _ = two_commits(repo)
    main = repo.branch("main")
    with a_commit_held(repo, workers=2) as held:
        main.upload("b", b"b")
        waiting = held.pool.submit(main.commit, "waiting")
        held.seen.wait_for(1)
        main.reset(to=older.id)
        held.pause.release()
        with pytest.raises(NoChanges, match="reset to") as nothing:
            waiting.result(PAUSE_TIMEOUT)
        assert not isinstance(nothing.value, AlreadyRecorded), nothing.value
        with pytest.raises(NoChanges, match="reset to") as dropped:
            held.first.result(PAUSE_TIMEOUT)
        assert not isinstance(dropped.value, AlreadyRecorded), dropped.value
    assert main.head() == older and list(main.uncommitted()) == []


def test_waiters_commit_as_one_and_the_others_find_their_writes_recorded(
    repo: Repository, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The waiters wait for the held commit however long a loaded machine takes to land it:
    one that gave up would seal beside it and commit its writes apart."""
    waiting_at_most(repo, monkeypatch, 10 * PAUSE_TIMEOUT)
    main = repo.branch("main")
    with a_commit_held(repo, workers=3) as held:
        main.upload("c", b"c")
        main.upload("d", b"d")
        waiting = [held.pool.submit(main.commit, name) for name in ("c", "d")]
        held.seen.wait_for(2)
        held.pause.release()
        head = held.first.result(PAUSE_TIMEOUT)
        outcomes: list[Commit | str] = []
        for call in waiting:
            try:
                outcomes.append(call.result(PAUSE_TIMEOUT))
            except AlreadyRecorded as recorded:
                outcomes.append(recorded.commit_id)
    made = [commit for commit in outcomes if isinstance(commit, Commit)]
    assert len(made) == 1, "one waiter sealed for both"
    assert made[0].parents == (head.id,) and main.head() == made[0]
    assert outcomes.count(made[0].id) == 1, "the other waiter names the commit holding its writes"
    assert committed(repo, made[0].id) == ["a", "c", "d"]
    assert list(main.uncommitted()) == []


def test_a_commit_whose_committer_died_after_its_seal_is_absorbed_after_the_wait(
    repo: Repository, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The held commit stands for a process killed after its seal: the next commit waits
    `RetryPolicy.commit_wait`, then seals beside it and records its writes too."""
    waiting_at_most(repo, monkeypatch, 0.2)
    main = repo.branch("main")
    with a_commit_held(repo) as held:
        main.upload("b", b"b")
        landed = main.commit("next")
        held.seen.wait_for(1)
        held.pause.release()
        with pytest.raises(AlreadyRecorded, match="already recorded") as recorded:
            held.first.result(PAUSE_TIMEOUT)
    assert recorded.value.commit_id == landed.id
    assert committed(repo, landed.id) == ["a", "b"]
    assert main.head() == landed and sealed_tokens(repo) == ()


def _fail() -> None:
    raise FailpointHit("the range store failed")


def _no_waiting() -> None:
    raise AssertionError("the commit waited for the failed one")


@pytest.mark.parametrize("step", ["commit.after_seal", "commit.after_ranges", "commit.before_set"])
def test_a_commit_that_failed_after_its_seal_does_not_hold_up_the_next(
    repo: Repository, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """A commit that raises after its seal (its store failed, say) releases the seal, so the
    next commit seals at once rather than waiting `commit_wait` for a commit that will never
    land, and records the failed commit's writes with its own."""
    waiting_at_most(repo, monkeypatch, 10 * PAUSE_TIMEOUT)
    main = repo.branch("main")
    head = main.head()
    main.upload("a", b"a")
    with armed(step, _fail), pytest.raises(FailpointHit):
        main.commit("fails")
    assert main.head() == head
    main.upload("b", b"b")
    with armed("commit.awaiting", _no_waiting):
        made = main.commit("next")
    assert made.parents == (head.id,) and committed(repo, made.id) == ["a", "b"]
    assert sealed_tokens(repo) == () and list(main.uncommitted()) == []


def test_a_failed_commit_releases_only_its_own_seal(
    repo: Repository, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failed commit whose seal another commit has sealed beside since (after waiting for
    it) leaves the branch alone: the newest seal is that commit's, and whoever comes next
    must wait for it."""
    waiting_at_most(repo, monkeypatch, 0.2)
    main = repo.branch("main")
    main.upload("a", b"a")
    failing = Pause()
    failed: list[bool] = []

    def fail_the_first() -> None:
        if not failed:
            failed.append(True)
            failing.hold()
            _fail()

    with (
        ThreadPoolExecutor(2) as pool,
        armed("commit.after_seal", fail_the_first),
        paused_at("commit.after_ranges") as built,
    ):
        first = pool.submit(main.commit, "fails")
        failing.wait()
        main.upload("b", b"b")
        second = pool.submit(main.commit, "beside")
        built.wait()
        beside = repo._g.read_branch(repo.record, "main").staging_token
        failing.release()
        with pytest.raises(FailpointHit):
            first.result(PAUSE_TIMEOUT)
        assert repo._g.read_branch(repo.record, "main").staging_token == beside
        built.release()
        made = second.result(PAUSE_TIMEOUT)
    assert committed(repo, made.id) == ["a", "b"] and sealed_tokens(repo) == ()


def test_a_commit_does_not_wait_for_a_compactions_seal(
    lake: Lake, repo: Repository, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compaction gives way to commits, so a commit that finds one's seal seals at once,
    and the compaction is superseded."""
    waiting_at_most(repo, monkeypatch, 10 * PAUSE_TIMEOUT)
    main = repo.branch("main")
    main.upload("a", b"a")
    made = []

    def commit_meanwhile(step: str) -> None:
        if step == "sealed":
            main.upload("b", b"b")
            made.append(main.commit("during"))

    with watched() as seen:
        result = compaction.compact(lake.graveler, repo.record, "main", on_step=commit_meanwhile)
    assert result.outcome == "superseded"
    assert seen.count == 0, "the commit did not wait"
    assert main.head() == made[0] and committed(repo, made[0].id) == ["a", "b"]


def test_an_empty_commit_asked_for_does_not_wait(
    repo: Repository, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit asked to record even nothing is a commit of its own: it seals at once."""
    waiting_at_most(repo, monkeypatch, 10 * PAUSE_TIMEOUT)
    main = repo.branch("main")
    with a_commit_held(repo) as held:
        made = main.commit("empty", allow_empty=True)
        assert held.seen.count == 0, "the commit did not wait"
        held.pause.release()
        with pytest.raises(AlreadyRecorded, match="already recorded") as recorded:
            held.first.result(PAUSE_TIMEOUT)
    assert recorded.value.commit_id == made.id
    assert main.head() == made and committed(repo, made.id) == ["a"]


WRITERS = 3
ROUNDS = 12


def _write_and_commit(kv_url: str, writer: int, start) -> list[str]:
    """Write a few paths, commit, and check HEAD then holds every write made so far, whether
    this call made the commit or found another waiter's commit had recorded them."""
    problems = []
    with Lake.connect(kv_url) as lake:
        repo = lake.repository("joins")
        main = repo.branch("main")
        start.wait(30)
        written: list[str] = []
        for round_ in range(ROUNDS):
            for j in range(3):
                written.append(main.upload(f"w{writer}/{round_:02d}-{j}", b"x").path)
            with suppress(NoChanges):
                main.commit(f"writer {writer} round {round_}")
            head = {entry.path for entry in repo.ref(main.head().id).list(f"w{writer}/")}
            problems += [
                f"round {round_}: {path} not in HEAD" for path in written if path not in head
            ]
    return problems


@pytest.mark.slow
def test_writers_committing_one_branch_find_their_writes_in_head_after_each_commit(
    race_kv: str, tmp_path: Path
) -> None:
    with Lake.connect(race_kv) as lake:
        lake.create_repository("joins", storage_namespace=f"file://{tmp_path}/joins")
    with forked_pool(WRITERS) as (manager, pool):
        start = manager.Event()
        calls = [pool.apply_async(_write_and_commit, (race_kv, i, start)) for i in range(WRITERS)]
        start.set()
        problems = [problem for call in calls for problem in call.get(240)]
    assert problems == []
    with Lake.connect(race_kv) as lake:
        repo = lake.repository("joins")
        assert list(repo.branch("main").uncommitted()) == []
        assert len(list(repo.ref("main").list())) == WRITERS * ROUNDS * 3
