"""Merge previews and their publication (issue 39, item 5): the preview is a stored merge
commit that leaves the destination alone; publishing moves the destination to it only while
the destination still stands where the preview was built, in one process and in many."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from branchwater.engine import DirtyBranch, InvalidArgument, Lake, NoChanges, NotFound
from branchwater.engine.api import Repository
from branchwater.engine.errors import MergeRaceLost
from branchwater.engine.graveler.committed import RangePolicy
from branchwater.engine.graveler.graveler import RetryPolicy
from branchwater.engine.graveler.merge import PREVIEW_KEY
from tests.graveler.test_picks import commit, tree
from tests.helpers.failpoints import held_at
from tests.helpers.servers import forked_pool


@pytest.fixture
def repo(tmp_path: Path):
    policy = RangePolicy(target_entries=4, max_entries=16)
    with Lake.connect("memory://", range_policy=policy, retry=RetryPolicy(base_delay=0)) as lake:
        yield lake.create_repository("previews", storage_namespace=f"file://{tmp_path}/ns")


def etl_branch(repo: Repository, **files: bytes | None) -> str:
    """An `etl` branch off main holding `files` committed; its commit id."""
    etl = repo.create_branch("etl", source="main")
    return commit(etl, "etl", **files)


def test_a_preview_is_a_stored_merge_commit_that_leaves_the_destination_alone(
    repo: Repository,
) -> None:
    main = repo.branch("main")
    base = commit(main, "base", a=b"1")
    source = etl_branch(repo, b=b"etl")
    moved = commit(main, "main moved", c=b"main")

    r = repo.merge("etl", into="main", preview=True, metadata={"run": "7"})

    assert main.commit_id == moved
    assert r.commit.parents == (moved, source)
    assert r.commit.metadata[PREVIEW_KEY] == "main"
    assert r.commit.metadata["run"] == "7"
    assert repo.commit(r.commit.id) == r.commit
    assert tree(repo.ref(r.commit.id)) == {"a": b"1", "b": b"etl", "c": b"main"}
    assert base in {c.id for c in repo.log(r.commit.id)}

    published = repo.publish(r.commit.id, into="main")

    assert published.commit == r.commit
    assert main.commit_id == r.commit.id
    assert tree(main) == {"a": b"1", "b": b"etl", "c": b"main"}


def test_a_preview_never_fast_forwards(repo: Repository) -> None:
    main = repo.branch("main")
    head = commit(main, "base", a=b"1")
    source = etl_branch(repo, a=b"2")
    r = repo.merge("etl", into="main", preview=True)
    assert not r.fast_forward
    assert r.commit.parents == (head, source)
    repo.publish(r.commit.id, into="main")
    assert next(repo.log("main")).id == r.commit.id


def test_a_destination_that_moved_since_the_preview_is_never_overwritten(
    repo: Repository,
) -> None:
    main = repo.branch("main")
    commit(main, "base", a=b"1")
    etl_branch(repo, b=b"etl")
    r = repo.merge("etl", into="main", preview=True)
    moved = commit(main, "someone else", c=b"other")

    with pytest.raises(MergeRaceLost, match="preview again") as lost:
        repo.publish(r.commit.id, into="main")

    assert main.commit_id == moved
    again = repo.merge("etl", into="main", preview=True, hint=lost.value.hint)
    assert again.commit.parents[0] == moved
    repo.publish(again.commit.id, into="main")
    assert tree(main) == {"a": b"1", "b": b"etl", "c": b"other"}
    with pytest.raises(MergeRaceLost):
        repo.publish(r.commit.id, into="main")


def test_publishing_twice_changes_nothing(repo: Repository) -> None:
    commit(repo.branch("main"), "base", a=b"1")
    etl_branch(repo, b=b"etl")
    r = repo.merge("etl", into="main", preview=True)
    repo.publish(r.commit.id, into="main")
    before = [c.id for c in repo.log("main")]
    assert repo.publish(r.commit.id, into="main").commit == r.commit
    assert [c.id for c in repo.log("main")] == before


def test_only_a_preview_into_that_branch_is_published(repo: Repository) -> None:
    main = repo.branch("main")
    commit(main, "base", a=b"1")
    etl_branch(repo, b=b"etl")
    repo.create_branch("other", source="main")
    plain = repo.merge("etl", into="other", fast_forward=False)
    with pytest.raises(InvalidArgument, match="is not a merge preview"):
        repo.publish(plain.commit.id, into="other")
    r = repo.merge("etl", into="main", preview=True)
    with pytest.raises(InvalidArgument, match="previews a merge into 'main', not into 'other'"):
        repo.publish(r.commit.id, into="other")
    with pytest.raises(NotFound):
        repo.publish("0" * 64, into="main")
    assert repo.ref("other").commit_id == plain.commit.id


def test_a_preview_refuses_a_dirty_destination_and_one_with_nothing_to_merge(
    repo: Repository,
) -> None:
    main = repo.branch("main")
    commit(main, "base", a=b"1")
    etl_branch(repo, b=b"etl")
    main.upload("wip", b"x")
    before = len(list(repo.lake.graveler.refs.list_commits(repo.record)))
    with pytest.raises(DirtyBranch):
        repo.merge("etl", into="main", preview=True)
    assert len(list(repo.lake.graveler.refs.list_commits(repo.record))) == before
    main.reset()
    repo.create_branch("same", source="main")
    with pytest.raises(NoChanges):
        repo.merge("same", into="main", preview=True)


def test_a_publish_held_before_its_set_loses_to_a_commit_made_meanwhile(
    race_kv: str, tmp_path: Path
) -> None:
    """The worst interleaving: the destination moves between the publish's check of HEAD
    and its `set_if`. The publish must fail and the commit stay."""
    with Lake.connect(race_kv) as lake, Lake.connect(race_kv) as other:
        repo = lake.create_repository("held", storage_namespace=f"file://{tmp_path}/ns")
        commit(repo.branch("main"), "base", a=b"1")
        etl_branch(repo, b=b"etl")
        r = repo.merge("etl", into="main", preview=True)
        publishing = lambda: repo.publish(r.commit.id, into="main")  # noqa: E731
        with held_at("publish.before_set", publishing) as held:
            moved = commit(other.repository("held").branch("main"), "meanwhile", c=b"m")
        assert isinstance(held.raised, MergeRaceLost), held.raised
        assert repo.ref("main").commit_id == moved


WORKERS = 4
ROUNDS = 5
PATIENCE_S = 120.0


def _preview_and_publish(kv_url: str, worker: int, barrier) -> list[tuple[str, str]]:
    """Each round: commit a file on this worker's branch, preview its merge into main, publish;
    a lost race previews again from the hint. Returns (published id, the head it replaced)."""
    published = []
    with Lake.connect(kv_url) as lake:
        repo = lake.repository("contended")
        branch = repo.branch(f"w{worker}")
        barrier.wait(60)
        for round_ in range(ROUNDS):
            branch.upload(f"w{worker}/{round_}", f"{worker}-{round_}".encode())
            branch.commit(f"w{worker} round {round_}")
            hint = None
            deadline = time.monotonic() + PATIENCE_S
            while time.monotonic() < deadline:
                try:
                    r = repo.merge(f"w{worker}", into="main", preview=True, hint=hint)
                    repo.publish(r.commit.id, into="main")
                except MergeRaceLost as lost:
                    hint = lost.hint
                    continue
                except DirtyBranch:
                    hint = None
                    time.sleep(0.01)
                    continue
                published.append((r.commit.id, r.commit.parents[0]))
                break
            else:
                raise AssertionError(f"worker {worker} never published round {round_}")
    return published


def _commit_on_main(kv_url: str, barrier) -> list[str]:
    made = []
    with Lake.connect(kv_url) as lake:
        main = lake.repository("contended").branch("main")
        barrier.wait(60)
        for i in range(ROUNDS):
            main.upload(f"direct/{i}", b"d")
            made.append(main.commit(f"direct {i}").id)
    return made


@pytest.mark.slow
def test_concurrent_previews_and_publishes_lose_nothing(race_kv: str, tmp_path: Path) -> None:
    with Lake.connect(race_kv) as lake:
        repo = lake.create_repository("contended", storage_namespace=f"file://{tmp_path}/ns")
        commit(repo.branch("main"), "base", base=b"b")
        for worker in range(WORKERS):
            repo.create_branch(f"w{worker}", source="main")
    with forked_pool(WORKERS + 1) as (manager, pool):
        barrier = manager.Barrier(WORKERS + 1)
        direct = pool.apply_async(_commit_on_main, (race_kv, barrier))
        workers = [
            pool.apply_async(_preview_and_publish, (race_kv, w, barrier)) for w in range(WORKERS)
        ]
        published = [pair for w in workers for pair in w.get(600)]
        made = direct.get(600)
    with Lake.connect(race_kv) as lake:
        repo = lake.repository("contended")
        chain = [c.id for c in repo.log("main", first_parent=True)]
        assert set(made) <= set(chain)
        for commit_id, replaced in published:
            assert commit_id in chain, "a published preview was overwritten"
            assert chain[chain.index(commit_id) + 1] == replaced
        main = repo.ref("main")
        paths = {e.path for e in main.list()}
        assert {f"w{w}/{r}" for w in range(WORKERS) for r in range(ROUNDS)} <= paths
        assert {f"direct/{i}" for i in range(ROUNDS)} <= paths
        assert len(published) == WORKERS * ROUNDS
