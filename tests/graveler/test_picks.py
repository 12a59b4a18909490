"""Revert, cherry-pick, reset to a ref and restore (issue 39, items 1 and 2).

`test_git_differential.py` compares random reverts, cherry-picks and hard resets with git;
these pin each rule on its own: merge commits on either parent, conflicts naming paths, a
dirty branch refused (or kept above with `allow_dirty`), nothing to do, the metadata
recorded, and a lost race retried on the work already done.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from branchwater.engine import DirtyBranch, InvalidArgument, Lake, MergeConflict, NoChanges
from branchwater.engine.api import Branch, Repository
from branchwater.engine.errors import TooManyTries
from branchwater.engine.graveler.committed import RangePolicy
from branchwater.engine.graveler.graveler import RetryPolicy
from branchwater.engine.graveler.picks import CHERRY_PICK_KEY, PARENT_KEY, REVERT_KEY
from tests.graveler.test_merge import content, race_once
from tests.helpers.gc import compact


@pytest.fixture
def repo(tmp_path: Path):
    policy = RangePolicy(target_entries=4, max_entries=16)
    with Lake.connect("memory://", range_policy=policy, retry=RetryPolicy(base_delay=0)) as lake:
        yield lake.create_repository("picks", storage_namespace=f"file://{tmp_path}/ns")


def commit(branch: Branch, message: str, **files: bytes | None) -> str:
    """Write (or delete, for None) the files and commit; the commit's id."""
    for path, data in files.items():
        if data is None:
            branch.delete(path)
        else:
            branch.upload(path, data)
    return branch.commit(message).id


def tree(ref: Branch) -> dict[str, bytes]:
    return {e.path: ref.read(e.path) for e in ref.list()}


# Revert ------------------------------------------------------------------------------------


def test_a_revert_undoes_one_commit_and_keeps_later_changes(repo: Repository) -> None:
    main = repo.branch("main")
    commit(main, "base", a=b"1", b=b"1")
    bad = commit(main, "bad", a=b"2", c=b"new", b=None)
    commit(main, "later", d=b"later")
    result = repo.revert("main", bad)
    assert tree(main) == {"a": b"1", "b": b"1", "d": b"later"}
    assert result.commit.metadata[REVERT_KEY] == bad
    assert result.commit.parents == (repo.ref("main~1").commit_id,)
    assert result.commit.message.startswith(f"Revert {bad[:12]}: bad")
    assert result.attempts == 1


def test_a_revert_of_a_merge_commit_takes_the_parent_named(repo: Repository) -> None:
    """Parent 1 undoes what the merge brought in; parent 2 undoes what the destination
    changed since the branches split, as git's `-m`."""
    main = repo.branch("main")
    commit(main, "base", a=b"1", b=b"1")
    feature = repo.create_branch("feature", source="main")
    commit(feature, "feature", a=b"feature")
    commit(main, "main", b=b"main")
    merged = repo.merge("feature", into="main").commit.id
    with pytest.raises(InvalidArgument, match=r"merge of 2 parents: pass parent=1\.\.2"):
        repo.revert("main", merged)
    one = repo.create_branch("one", source="main")
    result = repo.revert("one", merged, parent=1)
    assert tree(one) == {"a": b"1", "b": b"main"}
    assert result.commit.metadata[REVERT_KEY] == merged
    assert result.commit.metadata[PARENT_KEY] == "1"
    two = repo.create_branch("two", source="main")
    repo.revert("two", merged, parent=2)
    assert tree(two) == {"a": b"feature", "b": b"1"}
    with pytest.raises(InvalidArgument, match="from 1 to 2"):
        repo.revert("main", merged, parent=3)


def test_a_plain_commit_takes_parent_1_as_git_does_and_no_other(repo: Repository) -> None:
    """git 2.21 took `-m 1` for a commit of one parent, so that scripts may always pass it."""
    main = repo.branch("main")
    commit(main, "one", a=b"1")
    plain = commit(main, "plain", a=b"2")
    with pytest.raises(InvalidArgument, match="is not a merge"):
        repo.cherry_pick("main", plain, parent=2)
    with pytest.raises(InvalidArgument, match="from 1 to 1"):
        repo.revert("main", plain, parent=True)  # type: ignore[arg-type]
    repo.revert("main", plain, parent=1)
    assert tree(main) == {"a": b"1"}


def test_a_conflicting_revert_names_the_paths_and_changes_nothing(repo: Repository) -> None:
    main = repo.branch("main")
    commit(main, "base", a=b"1", b=b"1", c=b"1")
    bad = commit(main, "bad", a=b"2", b=b"2", c=b"2")
    commit(main, "later", a=b"3", c=None)
    head = main.commit_id
    with pytest.raises(MergeConflict, match="reverting") as conflict:
        repo.revert("main", bad)
    assert conflict.value.paths == ["a", "c"]
    assert "change or restore those paths on 'main'" in str(conflict.value)
    assert main.commit_id == head


def test_a_dirty_branch_is_refused_unless_allowed(repo: Repository) -> None:
    main = repo.branch("main")
    commit(main, "base", a=b"1")
    bad = commit(main, "bad", a=b"2", b=b"2")
    main.upload("staged", b"s")
    head = main.commit_id
    with pytest.raises(DirtyBranch, match="before a revert onto it"):
        repo.revert("main", bad)
    assert main.commit_id == head
    repo.revert("main", bad, allow_dirty=True)
    assert content(repo.ref("main"), "a") == b"1"
    assert [(c.path, c.type) for c in main.uncommitted()] == [("staged", "added")]


def test_allow_dirty_keeps_a_compacted_staging_area_above_the_new_commit(
    repo: Repository,
) -> None:
    main = repo.branch("main")
    commit(main, "base", a=b"1", b=b"1")
    bad = commit(main, "bad", a=b"2")
    main.upload("b", b"staged")
    main.delete("a")
    compact(repo, "main")
    repo.revert("main", bad, allow_dirty=True)
    assert content(repo.ref("main"), "a") == b"1"
    assert tree(main) == {"b": b"staged"}
    assert sorted((c.path, c.type) for c in main.uncommitted()) == [
        ("a", "removed"),
        ("b", "changed"),
    ]


def test_nothing_to_undo_or_pick_is_no_changes(repo: Repository) -> None:
    main = repo.branch("main")
    commit(main, "base", a=b"1")
    change = commit(main, "change", a=b"2")
    repo.revert("main", change)
    head = main.commit_id
    with pytest.raises(NoChanges, match=r"revert of .* changes nothing on 'main'"):
        repo.revert("main", change)
    with pytest.raises(NoChanges, match="cherry-pick of 'main~2'"):
        repo.cherry_pick("main", "main~2")  # "base": HEAD holds a=1 already
    assert main.commit_id == head


def test_a_revert_that_lost_a_race_merges_its_result_onto_the_new_head(
    repo: Repository, monkeypatch: pytest.MonkeyPatch
) -> None:
    main = repo.branch("main")
    commit(main, "base", a=b"1")
    bad = commit(main, "bad", a=b"2")

    def concurrent() -> None:
        commit(main, "race", late=b"late")

    calls = race_once(monkeypatch, repo.lake.graveler, concurrent)
    result = repo.revert("main", bad)
    assert result.attempts == 2 and calls
    assert tree(main) == {"a": b"1", "late": b"late"}
    assert result.commit.parents == (repo.ref("main~1").commit_id,)
    assert content(repo.ref("main~1"), "late") == b"late"


def test_a_revert_that_lost_a_race_where_head_had_undone_it_merges_afresh(
    repo: Repository, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HEAD had undone the bad change itself, then a commit changed `a` again before the
    revert's `set_if`: reusing the lost attempt would land `a` = 3 cleanly; the revert onto
    the new HEAD conflicts on `a`, so the retry does (`merge.reuse_is_exact`)."""
    main = repo.branch("main")
    commit(main, "base", a=b"1")
    bad = commit(main, "bad", a=b"2", b=b"2")
    commit(main, "undo a by hand", a=b"1")

    def concurrent() -> None:
        commit(main, "race", a=b"3")

    calls = race_once(monkeypatch, repo.lake.graveler, concurrent)
    with pytest.raises(MergeConflict) as conflict:
        repo.revert("main", bad)
    assert calls and conflict.value.paths == ["a"]
    assert tree(main) == {"a": b"3", "b": b"2"}


def test_a_revert_that_loses_every_race_gives_up(
    repo: Repository, monkeypatch: pytest.MonkeyPatch
) -> None:
    main = repo.branch("main")
    commit(main, "base", a=b"1")
    bad = commit(main, "bad", a=b"2")
    monkeypatch.setattr(repo.lake.graveler, "try_update_branch", lambda *_: False)
    with pytest.raises(TooManyTries, match=r"revert of .* gave up after 10 attempts"):
        repo.revert("main", bad)


# Cherry-pick -------------------------------------------------------------------------------


def test_a_cherry_pick_applies_one_commit_of_another_branch(repo: Repository) -> None:
    main = repo.branch("main")
    commit(main, "base", a=b"1", b=b"1")
    feature = repo.create_branch("feature", source="main")
    commit(feature, "first", a=b"f1")
    wanted = commit(feature, "second", b=b"f2", c=b"new")
    commit(main, "main", d=b"main")
    result = repo.cherry_pick("main", wanted)
    assert tree(main) == {"a": b"1", "b": b"f2", "c": b"new", "d": b"main"}
    assert result.commit.metadata[CHERRY_PICK_KEY] == wanted
    assert result.commit.message == f"second (cherry picked from {wanted[:12]})"
    with pytest.raises(MergeConflict, match="cherry-picking 'feature' on 'main'") as conflict:
        commit(main, "b again", b=b"main")
        repo.cherry_pick("main", "feature")
    assert conflict.value.paths == ["b"]


def test_a_cherry_pick_of_a_merge_commit_takes_the_parent_named(repo: Repository) -> None:
    main = repo.branch("main")
    commit(main, "base", a=b"1", b=b"1")
    feature = repo.create_branch("feature", source="main")
    commit(feature, "feature", a=b"feature")
    commit(main, "main", b=b"main")
    merged = repo.merge("feature", into="main").commit.id
    other = repo.create_branch("other", source="main~1")
    with pytest.raises(InvalidArgument, match=r"parent=1\.\.2"):
        repo.cherry_pick("other", merged)
    repo.cherry_pick("other", merged, parent=1)
    assert tree(other) == {"a": b"feature", "b": b"main"}
    assert repo.ref("other").head().metadata[PARENT_KEY] == "1"


# Reset to a ref, restore -------------------------------------------------------------------


def test_reset_to_a_ref_moves_the_branch_and_drops_everything_staged(repo: Repository) -> None:
    main = repo.branch("main")
    commit(main, "base", a=b"1")
    old_head = commit(main, "two", a=b"2", b=b"2")
    main.upload("staged", b"s")
    compact(repo, "main")
    main.upload("more", b"m")
    main.reset(to="main~1")
    assert main.commit_id == repo.ref(old_head).head().parents[0]
    assert tree(main) == {"a": b"1"}
    assert list(main.uncommitted()) == []
    assert repo.ref(old_head).read("b") == b"2"
    repo.create_branch("feature", source=old_head)
    main.reset(to="feature")
    assert main.commit_id == old_head
    main.upload("staged", b"s")
    main.reset()
    assert main.commit_id == old_head and list(main.uncommitted()) == []


def test_restore_stages_the_sources_version_or_its_absence(repo: Repository) -> None:
    main = repo.branch("main")
    commit(main, "base", a=b"1", **{"d/x": b"1", "d/y": b"1", "dz": b"1"})
    commit(main, "change", a=b"2", **{"d/x": b"2", "d/y": None, "d/new": b"n", "dz": b"2"})
    main.upload("d/staged", b"s")
    assert main.restore("d", source="main~1") == 4
    assert tree(main) == {"a": b"2", "d/x": b"1", "d/y": b"1", "dz": b"2"}
    assert main.restore(["d/", "d/x"], source="main~1") == 0
    assert main.restore("a", source="main~1") == 1
    assert content(main, "a") == b"1"
    main.upload("a", b"3")
    assert main.restore("a", source="main") == 1
    assert next(iter(main.uncommitted())).path == "d/new"
    with pytest.raises(InvalidArgument, match="a path, a prefix or a list"):
        main.restore([], source="main")


@pytest.mark.parametrize("paths", ["", ["a", ""]])
def test_an_empty_restore_path_is_refused_and_every_path_is_restored_only_when_asked(
    repo: Repository, paths: str | list[str]
) -> None:
    """An empty path is the prefix of every path: an unset variable restored the whole branch
    over its uncommitted changes."""
    main = repo.branch("main")
    commit(main, "base", a=b"1", b=b"1")
    commit(main, "change", a=b"2", c=b"2")
    main.upload("wip", b"w")
    with pytest.raises(InvalidArgument, match="every_path=True"):
        main.restore(paths, source="main~1")
    assert {c.path for c in main.uncommitted()} == {"wip"}
    with pytest.raises(InvalidArgument, match="not both"):
        main.restore(["a"], source="main~1", every_path=True)
    assert main.restore([], source="main~1", every_path=True) == 3
    assert tree(main) == {"a": b"1", "b": b"1"}


def test_a_cherry_pick_that_lost_a_race_where_head_had_its_change_merges_afresh(
    repo: Repository, monkeypatch: pytest.MonkeyPatch
) -> None:
    """HEAD held the picked change to `p` already and changed it again before the pick's
    `set_if`: the pick onto the new HEAD conflicts on `p`, so the retry does."""
    main = repo.branch("main")
    commit(main, "base", p=b"x")
    feature = repo.create_branch("feature", source="main")
    wanted = commit(feature, "p and q", p=b"y", q=b"q")
    commit(main, "main takes p", p=b"y")

    def concurrent() -> None:
        commit(main, "race", p=b"w")

    calls = race_once(monkeypatch, repo.lake.graveler, concurrent)
    with pytest.raises(MergeConflict) as conflict:
        repo.cherry_pick("main", wanted)
    assert calls and conflict.value.paths == ["p"]
    assert tree(main) == {"p": b"w"}
