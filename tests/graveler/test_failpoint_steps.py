"""Commit, merge, compaction, repository creation and deletion stopped at each of their named
steps: killed there (SIGKILL, in a process of its own, armed by the environment), the lake
shows nothing half-done and the next operation converges; raised there, the branch is
unchanged. On SQLite and on PostgreSQL; revert and cherry-pick land through the merge's steps."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from branchwater.engine import AlreadyExists, Lake, NotFound, failpoints
from branchwater.engine.api import Repository
from branchwater.engine.failpoints import FailpointHit
from tests.helpers.failpoints import SHORT_COMMIT_WAIT
from tests.helpers.servers import forked_run

COMMIT_POINTS = (
    "commit.after_seal",
    "commit.after_ranges",
    "commit.before_set",
    "commit.after_set",
)
MERGE_POINTS = ("merge.after_ranges", "merge.before_set")
COMPACTION_POINTS = ("compaction.after_ranges", "compaction.before_install")


def prepare(kv_url: str, namespace: str) -> None:
    """`main` with `a` committed and `b` staged; `feature` and `target` branched from it, each
    with one commit of its own, so merging `feature` into `target` writes a merge commit."""
    with Lake.connect(kv_url) as lake:
        repo = lake.create_repository("failpoints", storage_namespace=namespace)
        main = repo.branch("main")
        main.upload("a", b"a")
        main.commit("a")
        for name in ("feature", "target"):
            branch = repo.create_branch(name, "main")
            branch.upload(name, name.encode())
            branch.commit(name)
        main.upload("b", b"b")


def operate(kv_url: str, operation: str, namespace: str = "") -> None:
    """Run one operation on the prepared repository, or create it on `namespace` (in the
    killed process)."""
    with Lake.connect(kv_url) as lake:
        if operation == "create":
            lake.create_repository("failpoints", storage_namespace=namespace)
            return
        if operation == "delete":
            lake.delete_repository("failpoints")
            return
        repo = lake.repository("failpoints")
        if operation == "commit":
            repo.branch("main").commit("b")
        elif operation == "compact":
            repo.branch("main").compact()
        elif operation == "revert":
            repo.revert("target", repo.branch("target").head().id)
        else:
            repo.merge("feature", "target", message="merge")


def paths(repo: Repository, ref: str) -> dict[str, bytes]:
    """What a branch shows, staged changes included, or what a commit holds."""
    view = repo.branch(ref) if ref in {b.name for b in repo.branches()} else repo.ref(ref)
    return {e.path: view.read(e.path) for e in view.list()}


def killed_at(kv_url: str, point: str, *operation: str) -> None:
    """The operation in a process of its own, `point` armed to kill it by the environment."""
    done = forked_run(operate, kv_url, *operation, env={failpoints.ENV: f"{point}=kill"})
    assert done.code == -signal.SIGKILL, done


MAIN_AFTER = {"a": b"a", "b": b"b"}
TARGET_AFTER = {"a": b"a", "feature": b"feature", "target": b"target"}


@pytest.mark.parametrize("point", COMMIT_POINTS)
def test_a_commit_killed_at_each_step_is_finished_by_the_next(
    race_kv: str, tmp_path: Path, point: str
) -> None:
    kv_url = race_kv
    prepare(kv_url, f"file://{tmp_path}/ns")
    killed_at(kv_url, point, "commit")
    with Lake.connect(kv_url, retry=SHORT_COMMIT_WAIT) as lake:
        repo = lake.repository("failpoints")
        main = repo.branch("main")
        assert paths(repo, "main") == MAIN_AFTER
        landed = main.head().message == "b"
        assert landed == (point == "commit.after_set")
        if not landed:
            main.commit("b again")
        assert paths(repo, main.head().id) == MAIN_AFTER
        assert list(main.uncommitted()) == []
        main.upload("c", b"c")
        assert paths(repo, main.commit("c").id) == {**MAIN_AFTER, "c": b"c"}


@pytest.mark.parametrize("point", MERGE_POINTS)
def test_a_merge_killed_before_its_branch_moves_leaves_it_and_is_redone(
    race_kv: str, tmp_path: Path, point: str
) -> None:
    kv_url = race_kv
    prepare(kv_url, f"file://{tmp_path}/ns")
    with Lake.connect(kv_url) as lake:
        before = lake.repository("failpoints").branch("target").head().id
    killed_at(kv_url, point, "merge")
    with Lake.connect(kv_url) as lake:
        repo = lake.repository("failpoints")
        assert repo.branch("target").head().id == before
        result = repo.merge("feature", "target", message="merge")
        assert result.commit.id == repo.branch("target").head().id
        assert paths(repo, "target") == TARGET_AFTER


@pytest.mark.parametrize("point", COMPACTION_POINTS)
def test_a_compaction_killed_before_it_installs_changes_nothing_visible(
    race_kv: str, tmp_path: Path, point: str
) -> None:
    kv_url = race_kv
    prepare(kv_url, f"file://{tmp_path}/ns")
    killed_at(kv_url, point, "compact")
    with Lake.connect(kv_url) as lake:
        repo = lake.repository("failpoints")
        main = repo.branch("main")
        assert paths(repo, "main") == MAIN_AFTER
        assert main.compact().compacted
        assert paths(repo, main.commit("b").id) == MAIN_AFTER


def test_a_repository_deletion_killed_before_its_drops_is_finished_later(
    race_kv: str, tmp_path: Path
) -> None:
    """Finished by the collector, which fences the branches first: a commit made meanwhile
    by a process still holding the repository (a token the listing never saw) is dropped
    with the rest."""
    kv_url = race_kv
    prepare(kv_url, f"file://{tmp_path}/ns")
    with Lake.connect(kv_url) as other:
        stale = other.repository("failpoints")
        killed_at(kv_url, "repository.before_drop", "delete")
        stale.branch("main").commit("sealed after the listing")
        stale.branch("main").upload("late", b"late")
        unlisted = other.graveler.read_branch(stale.record, "main").staging_token.encode()
    with Lake.connect(kv_url) as lake:
        g = lake.graveler
        with pytest.raises(NotFound):
            lake.repository("failpoints")
        listed = [p for mark in g.refs.partitions_to_delete() for p in mark.partitions]
        assert listed and all(list(g.kv.scan(p)) for p in listed[:1])
        assert unlisted not in listed and list(g.kv.scan(unlisted))
        assert g.collect_dropped_partitions() >= 1
        assert list(g.refs.partitions_to_delete()) == []
        assert all(list(g.kv.scan(p)) == [] for p in [*listed, unlisted])
        again = lake.create_repository("failpoints", storage_namespace=f"file://{tmp_path}/ns2")
        assert list(again.branch("main").list()) == []


def _raise() -> None:
    raise FailpointHit("forced")


@pytest.mark.parametrize(
    ("point", "operation", "branch"),
    [
        *((p, "commit", "main") for p in COMMIT_POINTS[:-1]),
        *((p, "merge", "target") for p in MERGE_POINTS),
        *((p, "revert", "target") for p in MERGE_POINTS),
        *((p, "compact", "main") for p in COMPACTION_POINTS),
    ],
)
def test_an_operation_raised_out_of_at_a_step_leaves_the_branch_as_it_was(
    race_kv: str, tmp_path: Path, point: str, operation: str, branch: str
) -> None:
    kv_url = race_kv
    prepare(kv_url, f"file://{tmp_path}/ns")
    with Lake.connect(kv_url) as lake:
        repo = lake.repository("failpoints")
        head, shown = repo.branch(branch).head().id, paths(repo, branch)
    with failpoints.armed(point, _raise), pytest.raises(FailpointHit):
        operate(kv_url, operation)
    with Lake.connect(kv_url) as lake:
        repo = lake.repository("failpoints")
        assert repo.branch(branch).head().id == head
        assert paths(repo, branch) == shown


def test_a_repository_creation_killed_after_its_claim_is_finished_by_its_name_alone(
    race_kv: str, tmp_path: Path
) -> None:
    namespace = f"file://{tmp_path}/ns"
    killed_at(race_kv, "repository.after_claim", "create", namespace)
    with Lake.connect(race_kv) as lake:
        assert lake.repositories() == []
        for name, inside in (("other", namespace), ("other", f"{namespace}/sub")):
            with pytest.raises(AlreadyExists, match="'failpoints', which does not exist"):
                lake.create_repository(name, storage_namespace=inside)
        lake.create_repository("failpoints", storage_namespace=namespace)
        lake.delete_repository("failpoints")
        lake.create_repository("other", storage_namespace=f"{namespace}/sub")
