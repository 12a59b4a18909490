"""Exclusive creation (`upload(..., if_absent=True)`, `writes.create_entry`): a path is
created only where the branch shows nothing, and of concurrent creations of one path exactly
one succeeds, whatever commits seal and land in between. Every interleaving runs on SQLite and
on the PostgreSQL server; the one a look and its creation leave open is forced at
`write.before_create`, and many processes race for the same paths while a committer commits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from branchwater.engine import BranchProtected, Lake, NoChanges, PathExists
from branchwater.engine.api import Repository
from branchwater.engine.failpoints import FailpointHit, armed
from tests.helpers.failpoints import (
    PAUSE_TIMEOUT,
    SHORT_COMMIT_WAIT,
    held_at,
    in_thread,
    paused_at,
)
from tests.helpers.races import committer
from tests.helpers.servers import forked_pool


@pytest.fixture
def repo(race_kv: str, tmp_path: Path) -> Iterator[Repository]:
    with Lake.connect(race_kv, retry=SHORT_COMMIT_WAIT) as lake:
        yield lake.create_repository("sales", f"file://{tmp_path}/sales")


def data_objects(repo: Repository) -> set[Path]:
    root = Path(repo.storage_namespace.removeprefix("file://")) / "data"
    return {p for p in root.rglob("*") if p.is_file()} if root.exists() else set()


def test_a_path_is_created_once_and_a_losing_upload_leaves_no_object(repo: Repository) -> None:
    main = repo.branch("main")
    created = main.upload("lock", b"first", if_absent=True)
    before = data_objects(repo)
    for attempt in (b"second", b"first"):
        with pytest.raises(PathExists, match="'lock' exists on branch 'main'"):
            main.upload("lock", attempt, if_absent=True)
    assert isinstance(PathExists("x"), FileExistsError)
    assert main.stat("lock") == created
    assert data_objects(repo) == before


def test_what_the_branch_shows_decides_whichever_layer_holds_it(repo: Repository) -> None:
    """Committed: refused. Deleted since (a tombstone staged over it): created. Staged only
    in a token a commit has sealed and not yet landed: refused."""
    main = repo.branch("main")
    main.upload("committed", b"c")
    main.commit("base")
    with pytest.raises(PathExists):
        main.upload("committed", b"again", if_absent=True)
    main.delete("committed")
    main.upload("committed", b"new", if_absent=True)
    assert main.read("committed") == b"new"
    main.upload("sealed", b"s")
    with (
        held_at("commit.after_seal", lambda: main.commit("holds sealed")) as commit,
        pytest.raises(PathExists),
    ):
        main.upload("sealed", b"other", if_absent=True)
    assert commit.raised is None
    assert repo.ref("main").read("sealed") == b"s"


def test_a_creation_whose_look_a_concurrent_creation_and_commit_overtook_is_refused(
    repo: Repository,
) -> None:
    """The first creation looked and found nothing; before it creates, another creates the
    path and a commit lands it (the branch record moves, so the first's guarded creation
    fails and it looks again). Then the same with only the other creation in between (the
    record stays; the creation finds the row)."""
    main = repo.branch("main")

    def create(path: str, body: bytes) -> None:
        main.upload(path, body, if_absent=True)

    with held_at("write.before_create", lambda: create("a", b"first")) as first:
        create("a", b"second")
        main.commit("lands the second")
    assert isinstance(first.raised, PathExists)
    with held_at("write.before_create", lambda: create("b", b"first")) as first:
        create("b", b"second")
    assert isinstance(first.raised, PathExists)
    assert (main.read("a"), main.read("b")) == (b"second", b"second")


def test_a_creation_stopped_before_it_creates_stages_nothing_and_its_retry_creates(
    repo: Repository,
) -> None:
    main = repo.branch("main")

    def stop() -> None:
        raise FailpointHit("write.before_create")

    with armed("write.before_create", stop), pytest.raises(FailpointHit):
        main.upload("marker", b"m", if_absent=True)
    assert list(main.uncommitted()) == []
    main.upload("marker", b"m", if_absent=True)
    assert main.read("marker") == b"m"


def test_a_protected_branch_refuses_a_creation(repo: Repository) -> None:
    repo.protect("main", no_direct_writes=True)
    with pytest.raises(BranchProtected):
        repo.branch("main").upload("x", b"x", if_absent=True)


CREATORS = 4
PATHS = 30


def _creator(kv_url: str, index: int, start, barrier) -> list[tuple[str, str]]:
    """Try to create every path, each at once with the other creators (`barrier`); the ones
    this process created, with their addresses."""
    won = []
    with Lake.connect(kv_url) as lake:
        main = lake.repository("race").branch("main")
        start.wait(30)
        for i in range(PATHS):
            path = f"lock/{i:03d}"
            barrier.wait(30)
            with contextlib.suppress(PathExists):
                won.append((path, main.upload(path, f"{index}".encode(), if_absent=True).address))
    return won


@pytest.mark.slow
def test_processes_racing_to_create_the_same_paths_each_path_has_one_creator(
    race_kv: str, tmp_path: Path
) -> None:
    with Lake.connect(race_kv) as lake:
        lake.create_repository("race", f"file://{tmp_path}/race")
    with forked_pool(CREATORS + 1) as (manager, pool):
        start, stop, barrier = manager.Event(), manager.Event(), manager.Barrier(CREATORS)
        commits = manager.Value("i", 0)
        committing = pool.apply_async(committer, (race_kv, "race", start, stop, commits))
        creators = [
            pool.apply_async(_creator, (race_kv, i, start, barrier)) for i in range(CREATORS)
        ]
        start.set()
        won = [pair for creator in creators for pair in creator.get(240)]
        stop.set()
        committing.get(240)
        assert commits.value > 0
    assert sorted(path for path, _ in won) == [f"lock/{i:03d}" for i in range(PATHS)]
    with Lake.connect(race_kv) as lake:
        main = lake.repository("race").branch("main")
        with contextlib.suppress(NoChanges):
            main.commit("final")
        head = {e.path: e.address for e in main.list()}
    assert head == dict(won)


def test_a_creation_over_a_sealed_tombstone_waits_for_its_commit(repo: Repository) -> None:
    """A delete of a committed path looks, then a commit seals the token and reads it; the
    delete's tombstone lands in the sealed token after that read (a late write the commit
    misses) and the delete is held before it writes again to the new token. A creation
    that took the sealed tombstone for absence would be tombstoned by that rewrite after it
    succeeded; it waits for the commit, then finds the path committed and is refused, and
    the delete ends with the path gone."""
    main = repo.branch("main")
    main.upload("p", b"committed")
    main.upload("other", b"o")
    main.commit("base")
    main.upload("other", b"staged, so the next commit has work")
    with contextlib.ExitStack() as stack:
        staging, built, validating, awaiting = (
            stack.enter_context(paused_at(point))
            for point in (
                "write.before_stage",
                "commit.after_ranges",
                "write.before_validate",
                "write.awaiting_commit",
            )
        )
        delete = in_thread(lambda: main.delete("p"))
        staging.wait()
        commit = in_thread(lambda: main.commit("misses the late delete"))
        built.wait()
        staging.release()
        validating.wait()
        create = in_thread(lambda: main.upload("p", b"mine", if_absent=True))
        while create.thread.is_alive() and not awaiting.reached.wait(0.01):
            pass
        built.release()
        commit.thread.join(PAUSE_TIMEOUT)
        awaiting.release()
        create.thread.join(PAUSE_TIMEOUT)
        validating.release()
    for held in (delete, commit, create):
        held.thread.join(PAUSE_TIMEOUT)
    assert isinstance(create.raised, PathExists), create.result
    assert (delete.raised, commit.raised) == (None, None)
    assert repo.ref("main").read("p") == b"committed"
    assert "p" not in {e.path for e in main.list()}
