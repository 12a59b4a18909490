"""Issue 40's races, across processes, on SQLite and PostgreSQL: a retention run holds at its
worst moments while another process moves a ref, a tag or staged entries onto the commit it
is collecting (`engine/graveler/fence.py` has the argument).

The run is the committed part as the Spark job's driver does it (`tests.gc_model.
retention_run`, after `spark_jobs/gc/retention.py`: the classes read under the run's lease,
the re-check, the second prepare, the fence settled on the commits still holding a
candidate, re-armed and recorded expired before the deletes), with the job's Spark anti-joins
replaced by the model's address sets (`tests.gc_model.commit_addresses`): the races are
between the driver's KV reads and writes and the moves, which this keeps whole.

Each move runs in a worker process of its own (`tests.helpers.servers.forked_pool`) at one
of four moments: before the re-check (the run sees it and keeps the objects), before it with
its claim older than the margin (the run's record replaces the claim, and the re-check still
sees the move), after it (the move's claim reads the run's record and refuses, writing
nothing), or held in the mover after its claim until the run has re-checked (its write lands
after the re-check; the claim was fresh, so the run kept the commit active and deletes
nothing of it). A move SIGKILLed after its claim, before or after its write, leaves nothing
referencing a collected commit, and the next run converges.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from branchwater.engine import CommitExpired, Lake, failpoints
from branchwater.engine.api import Repository
from branchwater.engine.gc.retention.expired import expired_at
from tests.gc_model import RetentionRun, assert_references_intact, retention_run
from tests.helpers.gc import FakeClock, age_claims, run_addresses
from tests.helpers.servers import forked_context, forked_pool, forked_process, unique_name

if TYPE_CHECKING:
    from multiprocessing.managers import SyncManager
    from multiprocessing.pool import Pool

pytestmark = pytest.mark.slow

RULES = {"default_retention_days": 30}
WAIT = 60
BEFORE_RECHECK = "gc.retention.before_recheck"
BEFORE_SWEEP = "gc.retention.before_sweep"
CLAIMED = "gc.fence.after_claim"
AGED_CLAIM = "aged"
"""The second moment: the move done before the re-check, its claim older than the margin."""
HELD_MOVE = "held"
"""The fourth moment: the mover claimed, then holds until the run re-checked."""


@dataclass(frozen=True)
class History:
    """`root` (t/a) ← `old` (adds t/b = b-old) ← `new` (drops t/b, adds t/c), all months
    old: main and `side` are at `new`, `dest` at `root`, `feature` one commit past `new`
    (adds t/f). With 30 days' retention only `old` expires: t/b's object is the one
    candidate, `feature`'s t/f is held by its HEAD alone."""

    root: str
    old: str
    new: str
    feature: str
    preview: str = ""
    """With `preview`: a merge preview of `old` into `dest`, never published (dangling)."""


def make_history(repo: Repository, preview: bool = False) -> History:
    clock = FakeClock(datetime.now(UTC) - timedelta(days=200))
    repo.lake.graveler.refs.clock = clock
    main = repo.branch("main")
    main.upload("t/a", b"a")
    root = main.commit("root").id
    clock.advance(timedelta(days=1))
    main.upload("t/b", b"b-old")
    old = main.commit("old").id
    clock.advance(timedelta(days=1))
    main.delete("t/b")
    main.upload("t/c", b"c-new")
    new = main.commit("new").id
    repo.create_branch("side", source=new)
    repo.create_branch("dest", source=root)
    previewed = repo.merge(old, "dest", preview=True).commit.id if preview else ""
    feature = repo.create_branch("feature", source=new)
    feature.upload("t/f", b"f-old")
    clock.advance(timedelta(days=1))
    head = feature.commit("feature").id
    repo.set_gc_rules(RULES)
    return History(root, old, new, head, previewed)


# -- the moves, in the worker ----------------------------------------------------------------

MOVES: dict[str, Callable[[Repository, History], object]] = {
    "branch": lambda repo, h: repo.create_branch("late", source=h.old),
    "reset": lambda repo, h: repo.branch("side").reset(to=h.old),
    "tag": lambda repo, h: repo.tag("late", h.old),
    "merge": lambda repo, h: repo.merge(h.old, "dest", fast_forward=False),
    "fast-forward": lambda repo, h: repo.merge(h.old, "dest"),
    "restore": lambda repo, h: repo.branch("side").restore(["t/b"], source=h.old),
    "restore-commit": lambda repo, h: (
        repo.branch("side").restore(["t/b"], source=h.old),
        repo.branch("side").commit("t/b back"),
    ),
    "revert": lambda repo, h: repo.revert("side", h.new),
    "cherry-pick": lambda repo, h: repo.cherry_pick("side", h.old),
    "delete": lambda repo, h: repo.delete_branch("feature"),
    "publish": lambda repo, h: repo.publish(h.preview, "dest"),
}
"""Each brings `old`'s t/b back (a revert of `new` takes `new`'s parent's tree, a publish
lands the preview holding it), except `delete`, which drops the only ref holding `feature`'s
t/f (lakeFS 9772)."""
KEPT_ELSEWHERE = {"restore", "restore-commit", "cherry-pick"}
"""Moves that keep `old`'s object under another tree (staged, or a commit with t/c too): the
re-check finds `old`'s tree held by nothing, so with an aged claim `old` is fenced, then
released as holding no candidate."""


def first_hit(reached: Any, go: Any) -> Callable[[], None]:
    """Hold the first time, pass later ones."""
    hits: list[None] = []

    def hold() -> None:
        if not hits:
            hits.append(None)
            reached.set()
            assert go.wait(WAIT), "the run never released the move"

    return hold


def move(
    kv_url: str, name: str, kind: str, history: History, reached: Any = None, go: Any = None
) -> str:
    """Do the move in this (worker) process, held after its claim when `reached` is given:
    "done", or "refused <commit> <collecting run>"."""
    with Lake.connect(kv_url) as lake:
        repo = lake.repository(name)
        try:
            if reached is None:
                MOVES[kind](repo, history)
            else:
                with failpoints.armed(CLAIMED, first_hit(reached, go)):
                    MOVES[kind](repo, history)
        except CommitExpired as refused:
            return f"refused {refused.commit_id} {refused.collecting}"
    return "done"


def killed_move(
    kv_url: str, name: str, kind: str, history: History, reached: Any, go: Any, wrote: bool
) -> None:
    """Hold after the claim as `move` does, then die by SIGKILL: before the write, or, when
    `wrote`, right after it (where a check after the write used to be)."""
    hold = first_hit(reached, go)

    def held() -> None:
        hold()
        if not wrote:
            os.kill(os.getpid(), signal.SIGKILL)

    with Lake.connect(kv_url) as lake:
        repo = lake.repository(name)
        with failpoints.armed(CLAIMED, held):
            MOVES[kind](repo, history)
    os.kill(os.getpid(), signal.SIGKILL)


# -- the state a refused move must leave as it was --------------------------------------------


@dataclass(frozen=True)
class Refs:
    branches: dict[str, str]
    tags: dict[str, str]
    staged: dict[str, list[str]]

    @classmethod
    def of(cls, repo: Repository) -> Refs:
        return cls(
            {b.name: b.commit_id for b in repo.branches()},
            {t.name: t.commit_id for t in repo.tags()},
            {b.name: [c.path for c in b.uncommitted()] for b in repo.branches()},
        )


def commit_ids(repo: Repository) -> set[str]:
    return {c.id for c in repo.lake.graveler.refs.list_commits(repo.record)}


def refs_reach_nothing_expired(repo: Repository) -> None:
    """No branch or tag names a commit retention recorded expired, and every object a ref,
    a staged entry or an unexpired commit names reads."""
    kv = repo.lake.graveler.kv
    named = [b.commit_id for b in repo.branches()] + [t.commit_id for t in repo.tags()]
    assert [c for c in named if expired_at(kv, repo.record, c) is not None] == []
    assert_references_intact(repo)


# -- fixtures ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def workers() -> Iterator[tuple[SyncManager, Pool]]:
    with forked_pool(1) as pair:
        yield pair


@pytest.fixture
def raced(race_kv: str, tmp_path: Path) -> Iterator[tuple[Repository, History, str]]:
    with Lake.connect(race_kv) as lake:
        name = unique_name("retention-")
        repo = lake.create_repository(name, storage_namespace=f"file://{tmp_path}/{name}")
        yield repo, make_history(repo), race_kv


def address_of(repo: Repository, commit_id: str, path: str) -> str:
    return next(e.address for e in repo.ref(commit_id).list() if e.path == path)


# -- the races --------------------------------------------------------------------------------


def run_racing(
    repo: Repository,
    history: History,
    kv_url: str,
    workers: tuple[SyncManager, Pool],
    kind: str,
    moment: str,
) -> tuple[RetentionRun, list[str]]:
    """A retention run with the move made in the worker at `moment`; the run (None when its
    sweep refused) and what the move returned."""
    manager, pool = workers
    outcomes: list[str] = []
    args = (kv_url, repo.name, kind, history)
    if moment == HELD_MOVE:
        reached, go = manager.Event(), manager.Event()
        pending = pool.apply_async(move, (*args, reached, go))
        assert reached.wait(WAIT), f"the {kind} never reached {CLAIMED}"

        def release() -> None:
            go.set()
            outcomes.append(pending.get(WAIT))

        with failpoints.armed(BEFORE_SWEEP, release):
            return retention_run(repo), outcomes

    def racing() -> None:
        outcomes.append(pool.apply(move, args))
        if moment == AGED_CLAIM:
            age_claims(repo)

    at = BEFORE_RECHECK if moment == AGED_CLAIM else moment
    with failpoints.armed(at, racing):
        return retention_run(repo), outcomes


def moment_cases() -> Iterator[Any]:
    """Every move before the re-check, after it and held over it from its claim; with its
    claim aged before the run's record, a branch and the moves the re-check cannot see as
    holding `old`'s tree. A delete claims nothing: before and after the re-check."""
    for kind in sorted(MOVES.keys() - {"publish"}):
        yield pytest.param(kind, BEFORE_RECHECK, id=f"{kind}-before-recheck")
        yield pytest.param(kind, BEFORE_SWEEP, id=f"{kind}-after-recheck")
        if kind == "delete":
            continue
        yield pytest.param(kind, HELD_MOVE, id=f"{kind}-held-over-recheck")
        if kind in KEPT_ELSEWHERE | {"branch"}:
            yield pytest.param(kind, AGED_CLAIM, id=f"{kind}-aged-claim")


@pytest.mark.parametrize(("kind", "moment"), list(moment_cases()))
def test_a_move_onto_the_commit_a_run_collects(
    raced: tuple[Repository, History, str],
    workers: tuple[SyncManager, Pool],
    kind: str,
    moment: str,
) -> None:
    """Before the re-check every move succeeds, the run sees it, and `old`'s object stays
    and `old` is not recorded expired, whether the move's claim is fresh (no record) or aged
    (the record replaced it, then was released). After the re-check every move onto `old` is
    refused naming the run and writes nothing (no commit record either), and the object
    goes. Held from its claim over the re-check, the move succeeds, the sweep refuses, and
    the next run keeps what the move references. A branch deleted mid-run only loses
    protection: the run deletes nothing it held, a later run collects it."""
    repo, history, kv_url = raced
    kv = repo.lake.graveler.kv
    b_old = address_of(repo, history.old, "t/b")
    f_old = address_of(repo, history.feature, "t/f")
    refs_before, commits_before = Refs.of(repo), commit_ids(repo)
    run, outcomes = run_racing(repo, history, kv_url, workers, kind, moment)
    objects = repo.lake.graveler.objects(repo.storage_namespace)
    if kind == "delete":
        assert outcomes == ["done"] and "feature" not in Refs.of(repo).branches
        assert objects.exists(f_old), "the run deleted what the branch held at its first read"
        assert run.deleted == {b_old} and run.expiring == [history.old]
        again = retention_run(repo)
        assert f_old in again.deleted and history.feature in again.expiring
        assert not objects.exists(f_old)
    elif moment == BEFORE_SWEEP:
        assert outcomes == [f"refused {history.old} {run.run_id}"]
        assert Refs.of(repo) == refs_before and commit_ids(repo) == commits_before
        assert b_old not in run_addresses(repo, repo.prepare_uncommitted_for_gc())
        assert run.deleted == {b_old} and run.expiring == [history.old]
        assert expired_at(kv, repo.record, history.old) is not None
    else:
        assert outcomes == ["done"]
        assert run.deleted == set() and run.expiring == []
        assert objects.exists(b_old)
        assert expired_at(kv, repo.record, history.old) is None
        if moment == HELD_MOVE:
            age_claims(repo)
            assert b_old not in retention_run(repo).deleted
    refs_reach_nothing_expired(repo)


# -- a move killed after its claim -------------------------------------------------------


@pytest.mark.parametrize("kind", ["branch", "tag", "reset", "restore"])
@pytest.mark.parametrize("wrote", [False, True], ids=["before-write", "after-write"])
def test_a_move_killed_after_its_claim(
    raced: tuple[Repository, History, str], kind: str, wrote: bool
) -> None:
    """The worst order: the move's claim before the run's record, its write (if it makes
    it) after the re-check, and a SIGKILL before or right after that write, with nothing
    acknowledged. The claim was fresh, so the sweep refuses and nothing is deleted; once the
    margin passed, the next run collects `old` if nothing references it (and a retried move
    is refused naming it expired), or keeps what the write references."""
    repo, history, kv_url = raced
    b_old = address_of(repo, history.old, "t/b")
    objects = repo.lake.graveler.objects(repo.storage_namespace)
    refs_before, commits_before = Refs.of(repo), commit_ids(repo)
    ctx = forked_context()
    reached, go = ctx.Event(), ctx.Event()
    child = forked_process(killed_move, kv_url, repo.name, kind, history, reached, go, wrote)
    child.start()
    try:
        assert reached.wait(WAIT), f"the {kind} never reached {CLAIMED}"

        def release_and_reap() -> None:
            go.set()
            child.join(WAIT)

        with failpoints.armed(BEFORE_SWEEP, release_and_reap):
            held = retention_run(repo)
            assert held.deleted == set() and held.expiring == []
    finally:
        if child.is_alive():
            child.kill()
            child.join(WAIT)
    assert child.exitcode == -signal.SIGKILL
    assert objects.exists(b_old)
    assert (Refs.of(repo) != refs_before) == wrote
    refs_reach_nothing_expired(repo)
    age_claims(repo)
    again = retention_run(repo)
    if wrote:
        assert b_old not in again.deleted and objects.exists(b_old)
    else:
        assert again.deleted == {b_old} and again.expiring == [history.old]
        with pytest.raises(CommitExpired) as retried:
            MOVES[kind](repo, history)
        assert retried.value.commit_id == history.old and retried.value.collecting is None
        assert Refs.of(repo) == refs_before
    assert commit_ids(repo) == commits_before
    refs_reach_nothing_expired(repo)


@pytest.mark.parametrize(
    "moment",
    [
        pytest.param(BEFORE_RECHECK, id="before-recheck"),
        pytest.param(BEFORE_SWEEP, id="after-recheck"),
    ],
)
def test_a_publish_of_a_preview_the_run_collects(
    race_kv: str, tmp_path: Path, workers: tuple[SyncManager, Pool], moment: str
) -> None:
    """A merge preview left unpublished longer than the default retention is a dangling
    commit, expired. Published before the re-check, the run keeps its objects; after it, the
    publish must be refused, as a fast-forward onto it is."""
    with Lake.connect(race_kv) as lake:
        name = unique_name("publish-")
        repo = lake.create_repository(name, storage_namespace=f"file://{tmp_path}/{name}")
        history = make_history(repo, preview=True)
        b_old = address_of(repo, history.old, "t/b")
        refs_before = Refs.of(repo)
        run, outcomes = run_racing(repo, history, race_kv, workers, "publish", moment)
        if moment == BEFORE_RECHECK:
            assert outcomes == ["done"] and repo.branch("dest").commit_id == history.preview
            assert run.deleted == set()
        else:
            assert outcomes == [f"refused {history.preview} {run.run_id}"]
            assert Refs.of(repo) == refs_before
            assert run.deleted == {b_old}
        assert_references_intact(repo)
