"""A commit whose sealed writes a reset, or a delete and re-creation of its branch, dropped is
told a plain `NoChanges`, never `AlreadyRecorded` naming a commit without them, whatever HEAD
the branch was left on (`BranchRecord.incarnation`). Each interleaving is forced with
failpoints, on every KV store the races run on (`race_kv`): the committer held after its
seal, and a commit waiting for it held at `commit.awaiting`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from branchwater.engine import AlreadyRecorded, ChangesDropped, Commit, Lake, Repository
from branchwater.engine.graveler.model import BranchRecord
from tests.helpers.failpoints import SHORT_COMMIT_WAIT, held_at
from tests.helpers.views import committed, listed

BRANCH = "dev"
DROPPED = "reset or deleted and re-created"


@pytest.fixture
def repo(race_kv: str, tmp_path: Path) -> Iterator[Repository]:
    """`main` with one commit, and `dev` branched off it: the branch the commits race on."""
    with Lake.connect(race_kv, retry=SHORT_COMMIT_WAIT) as lake:
        repo = lake.create_repository("resets", storage_namespace=f"file://{tmp_path}/resets")
        main = repo.branch("main")
        main.upload("base", b"0")
        main.commit("base")
        repo.create_branch(BRANCH, "main")
        yield repo


def record(repo: Repository, name: str = BRANCH) -> BranchRecord:
    return repo._g.read_branch(repo.record, name)


def descendant(repo: Repository) -> str:
    """A commit made on `dev`'s HEAD on another branch: a HEAD a commit on `dev` could have
    set, but which does not hold `dev`'s staged writes."""
    side = repo.create_branch("side", BRANCH)
    side.upload("other", b"side")
    return side.commit("side").id


def reset_then_commit(repo: Repository) -> None:
    dev = repo.branch(BRANCH)
    dev.reset()
    dev.upload("other", b"another writer's")
    dev.commit("B")


def reset_to_a_descendant(repo: Repository) -> None:
    repo.branch(BRANCH).reset(to=descendant(repo))


def recreated_at_a_descendant(repo: Repository) -> None:
    commit_id = descendant(repo)
    repo.delete_branch(BRANCH)
    repo.create_branch(BRANCH, commit_id)


def reset_then_compaction(repo: Repository) -> None:
    dev = repo.branch(BRANCH)
    dev.reset()
    dev.upload("other", b"another writer's")
    assert dev.compact().outcome == "compacted"


Move = Callable[[Repository], None]
MOVES = [reset_then_commit, reset_to_a_descendant, recreated_at_a_descendant]


def assert_dropped(outcome: BaseException | None) -> None:
    assert isinstance(outcome, ChangesDropped), outcome
    assert DROPPED in str(outcome)


@pytest.mark.parametrize("move", [*MOVES, reset_then_compaction])
def test_a_commit_whose_sealed_writes_the_branch_lost_names_no_commit(
    repo: Repository, move: Move
) -> None:
    """Between the seal and the build the branch is reset or re-created, then moves on to a
    HEAD descending from the sealed one (or a compaction of other writes): the commit does
    not name that HEAD as holding its writes, nor commit the other writes as its own."""
    dev = repo.branch(BRANCH)
    dev.upload("mine", b"A's")
    with held_at("commit.after_seal", lambda: dev.commit("A")) as committer:
        move(repo)
        left = dev.head()
    assert_dropped(committer.raised)
    assert dev.head() == left and "mine" not in committed(repo, left.id)
    assert "mine" not in listed(dev)


@pytest.mark.parametrize("move", MOVES)
def test_a_commit_waiting_while_the_branch_lost_its_writes_names_no_commit(
    repo: Repository, move: Move
) -> None:
    """The same for a commit waiting for another's seal: its writes were in the staging
    token the reset dropped, and the HEAD it then finds descends from the one it waited on."""
    dev = repo.branch(BRANCH)
    dev.upload("a", b"a")
    with held_at("commit.after_seal", lambda: dev.commit("A")) as first:
        dev.upload("mine", b"W's")
        with held_at("commit.awaiting", lambda: dev.commit("W")) as waiter:
            move(repo)
            left = dev.head()
        assert_dropped(waiter.raised)
    assert_dropped(first.raised)
    assert dev.head() == left and not {"a", "mine"} & set(committed(repo, left.id))


def test_a_commit_whose_writes_a_concurrent_commit_recorded_names_it(repo: Repository) -> None:
    """The branch keeps its incarnation through seals and commits: a commit that sealed
    beside the held one (after `commit_wait`) recorded its writes, and is named."""
    dev = repo.branch(BRANCH)
    dev.upload("a", b"a")
    before = record(repo).incarnation
    with held_at("commit.after_seal", lambda: dev.commit("A")) as first:
        dev.upload("b", b"b")
        landed: Commit = dev.commit("B")
    assert isinstance(first.raised, AlreadyRecorded), first.raised
    assert first.raised.commit_id == landed.id == dev.head().id
    assert committed(repo, landed.id) == ["a", "b", "base"]
    assert record(repo).incarnation == before != ""


def test_a_commit_on_a_record_stored_before_incarnations_sees_a_reset(repo: Repository) -> None:
    """A record stored before the field decodes with none, kept by seals; a reset gives it
    one, so the commit sealed on it is told its writes were dropped."""
    g, dev = repo._g, repo.branch(BRANCH)
    branch, predicate = g.refs.get_branch(repo.record, BRANCH)
    g.refs.set_branch_if(repo.record, dataclasses.replace(branch, incarnation=""), predicate)
    dev.upload("mine", b"A's")
    with held_at("commit.after_seal", lambda: dev.commit("A")) as committer:
        assert record(repo).incarnation == ""
        reset_then_commit(repo)
    assert_dropped(committer.raised)


def test_only_creation_and_reset_change_the_incarnation(repo: Repository) -> None:
    dev, main = repo.branch(BRANCH), repo.branch("main")
    created = record(repo).incarnation
    assert created not in ("", record(repo, "main").incarnation)
    dev.upload("x", b"x")
    dev.commit("x")
    dev.upload("y", b"y")
    assert dev.compact().outcome == "compacted"
    dev.commit("y")
    main.upload("m", b"m")
    main.commit("m")
    repo.merge("main", BRANCH)
    assert record(repo).incarnation == created
    dev.reset()
    reset = record(repo).incarnation
    dev.reset(to="main")
    assert len({created, reset, record(repo).incarnation}) == 3


def test_a_record_without_an_incarnation_keeps_its_bytes() -> None:
    """Predicates compare stored bytes: a record from before the field decodes with none
    (never a random one) and encodes back to the same bytes, a sealed one too."""
    stored = BranchRecord("dev", "c0", "t0", incarnation="").encode()
    assert b"incarnation" not in stored
    decoded = BranchRecord.decode(stored)
    assert decoded.incarnation == "" and decoded.encode() == stored
    sealed = dataclasses.replace(decoded, staging_token="t1", sealed_tokens=("t0",))
    assert BranchRecord.decode(sealed.encode()) == sealed and sealed.incarnation == ""


def test_every_new_record_has_an_incarnation_of_its_own() -> None:
    first, second = BranchRecord("dev", "c0", "t0"), BranchRecord("dev", "c0", "t0")
    assert "" != first.incarnation != second.incarnation
    assert BranchRecord.decode(first.encode()) == first
