"""Identity is content: rewrites of equal bytes change nothing, anywhere a change is counted."""

from __future__ import annotations

import dataclasses
import hashlib
from pathlib import Path

import pytest

from branchwater.engine import DirtyBranch, Lake, MergeConflict, MergeRaceLost, NoChanges
from branchwater.engine.failpoints import armed
from branchwater.engine.graveler import merge as merge_ops
from branchwater.engine.graveler.committed import RangePolicy
from branchwater.engine.graveler.graveler import RetryPolicy
from branchwater.engine.graveler.history import find_merge_bases
from branchwater.engine.graveler.model import Entry
from branchwater.engine.graveler.writes import stage_entry


@pytest.fixture
def lake() -> Lake:
    policy = RangePolicy(target_entries=4, max_entries=16)
    with Lake.connect("memory://", range_policy=policy, retry=RetryPolicy(base_delay=0)) as lake:
        yield lake


@pytest.fixture
def repo(lake: Lake, tmp_path: Path):
    return lake.create_repository("identity", storage_namespace=f"file://{tmp_path}/ns")


def data_objects(lake: Lake, repo) -> list[str]:
    objects = lake.graveler.objects(repo.storage_namespace)
    return [info.key for info in objects.list_objects("data/")]


def rewrite(lake: Lake, repo, branch: str, path: str) -> Entry:
    """Stage what `branch` shows at `path` again at a new address: what a writer that does not
    compare content first (an older engine, a link of the same bytes) leaves behind."""
    current = repo.branch(branch).stat(path)
    again = current._replace(address=f"{current.address}-again")
    stage_entry(lake.graveler, repo.record, branch, again)
    return again


# --- uploads ----------------------------------------------------------------------------


def test_upload_checksum_is_sha256(repo) -> None:
    entry = repo.branch("main").upload("a", b"abc")
    assert entry.checksum == hashlib.sha256(b"abc").hexdigest()


def test_upload_of_what_the_branch_shows_writes_and_stages_nothing(lake: Lake, repo) -> None:
    main = repo.branch("main")
    committed = main.upload("a", b"1", metadata={"k": "v"})
    main.commit("a")
    written = data_objects(lake, repo)

    assert main.upload("a", b"1", metadata={"k": "v"}) == committed
    assert data_objects(lake, repo) == written
    assert list(main.uncommitted()) == []
    with pytest.raises(NoChanges):
        main.commit("again")

    staged = main.upload("b", b"2")
    assert main.upload("b", b"2") == staged
    assert len(data_objects(lake, repo)) == len(written) + 1


def test_upload_of_other_bytes_or_metadata_is_a_change(repo) -> None:
    main = repo.branch("main")
    main.upload("a", b"1")
    main.upload("b", b"2")
    main.commit("base")
    main.upload("a", b"1", metadata={"k": "v"})
    main.upload("b", b"3")
    assert sorted((c.path, c.type) for c in main.uncommitted()) == [
        ("a", "changed"),
        ("b", "changed"),
    ]


def test_upload_after_a_delete_restores_the_path(repo) -> None:
    main = repo.branch("main")
    main.upload("a", b"1")
    main.commit("a")
    main.delete("a")
    main.upload("a", b"1")
    assert main.read("a") == b"1"
    assert list(main.uncommitted()) == []


def test_upload_recognises_its_content_in_an_md5_entry_written_before(lake: Lake, repo) -> None:
    """Entries uploaded before SHA-256 carry an MD5: a retried upload after an upgrade is still
    no change."""
    main = repo.branch("main")
    fresh = main.upload("a", b"legacy bytes")
    legacy = fresh._replace(checksum=hashlib.md5(b"legacy bytes").hexdigest())
    stage_entry(lake.graveler, repo.record, "main", legacy)
    main.commit("written by an older engine")
    assert main.upload("a", b"legacy bytes") == legacy
    assert main.upload("a", b"other bytes!") != legacy


# --- commit, uncommitted, diff ----------------------------------------------------------


def test_identical_rewrites_are_no_change_and_no_commit(lake: Lake, repo) -> None:
    main = repo.branch("main")
    main.upload("a", b"1")
    main.upload("b", b"2")
    first = main.commit("base")
    rewrite(lake, repo, "main", "a")
    rewrite(lake, repo, "main", "b")
    assert list(main.uncommitted()) == []
    with pytest.raises(NoChanges):
        main.commit("only rewrites")
    assert main.commit_id == first.id
    assert list(main.uncommitted()) == []


def test_identical_rewrites_leave_the_metarange_of_the_real_changes(lake: Lake, repo) -> None:
    main = repo.branch("main")
    for name in "abcdefgh":
        main.upload(name, name.encode())
    main.commit("base")
    other = repo.create_branch("other", source="main")
    for name in "aceg":
        rewrite(lake, repo, "main", name)
    changed = main.upload("d", b"changed")
    stage_entry(lake.graveler, repo.record, "other", changed)
    assert [(c.path, c.type) for c in main.uncommitted()] == [("d", "changed")]
    assert main.commit("real").metarange_id == other.commit("real").metarange_id


def test_a_commit_after_a_compaction_takes_the_object_the_branch_shows(lake: Lake, repo) -> None:
    """The same bytes deleted and written again after a compaction: the commit records the
    new object, as it does with no compaction between (HEAD lacks the path), not the
    compacted one the branch no longer showed."""
    main = repo.branch("main")
    compacted = main.upload("a", b"1")
    main.compact()
    main.delete("a")
    again = main.upload("a", b"1")
    assert again.address != compacted.address
    main.commit("a, deleted and written again")
    assert main.stat("a").address == again.address


def test_writing_heads_bytes_back_after_a_compaction_is_no_change(lake: Lake, repo) -> None:
    """A path changed, compacted, then written back to HEAD's bytes shows no change: the
    commit raises `NoChanges` and HEAD's object stays, as with no compaction between."""
    main = repo.branch("main")
    original = main.upload("a", b"0")
    first = main.commit("base")
    main.upload("a", b"1")
    main.compact()
    main.upload("a", b"0")
    assert list(main.uncommitted()) == []
    with pytest.raises(NoChanges):
        main.commit("back to HEAD's bytes")
    assert main.commit_id == first.id
    assert main.stat("a").address == original.address


def test_diff_ignores_a_rewrite_of_equal_content(lake: Lake, repo) -> None:
    main = repo.branch("main")
    main.upload("a", b"1")
    main.commit("base")
    rewrite(lake, repo, "main", "a")
    main.upload("b", b"2")
    main.commit("b")
    assert [(c.path, c.type) for c in repo.diff("main~1", "main")] == [("b", "added")]


# --- merge ------------------------------------------------------------------------------


def forked(repo, files: dict[str, bytes]):
    """`main` committed with `files`, and `feature` branched from it."""
    main = repo.branch("main")
    for path, content in files.items():
        main.upload(path, content)
    main.commit("base")
    return main, repo.create_branch("feature", source="main")


def test_a_side_that_rewrote_equal_bytes_did_not_change_the_path(lake: Lake, repo) -> None:
    main, feature = forked(repo, {"p": b"A", "q": b"Q"})
    rewrite(lake, repo, "feature", "p")
    feature.upload("q", b"from feature")
    feature.commit("rewrite p")
    main.upload("p", b"B")
    main.commit("change p")
    repo.merge("feature", into="main")
    assert main.read("p") == b"B"
    assert main.read("q") == b"from feature"


@pytest.mark.parametrize("strategy", ["source-wins", "dest-wins"])
def test_an_unchanged_side_never_wins_under_a_strategy(lake: Lake, repo, strategy) -> None:
    """Whichever side a strategy favours, a rewrite of equal bytes does not beat a change."""
    main, feature = forked(repo, {"p": b"A", "r": b"R"})
    rewrite(lake, repo, "feature", "p")
    feature.upload("r", b"feature's r")
    feature.commit("feature")
    rewrite(lake, repo, "main", "r")
    main.upload("p", b"main's p")
    main.commit("main")
    repo.merge("feature", into="main", strategy=strategy)
    assert main.read("p") == b"main's p"
    assert main.read("r") == b"feature's r"


def test_equal_changes_on_both_sides_merge_cleanly(repo) -> None:
    main, feature = forked(repo, {"p": b"A"})
    for branch in (main, feature):
        branch.upload("p", b"B")
        branch.upload("new", b"same on both sides")
        branch.upload(f"only-{branch.name}", b"x")
        branch.commit("same change")
    result = repo.merge("feature", into="main")
    assert not result.fast_forward
    assert main.read("p") == b"B"
    assert sorted(e.path for e in main.list()) == ["new", "only-feature", "only-main", "p"]


@pytest.mark.parametrize("fast_forward", [True, False])
def test_merge_into_a_branch_with_only_identical_rewrites_staged(
    lake: Lake, repo, fast_forward: bool
) -> None:
    """Not dirty; and the staged rewrite must not hide what the merge brings to its path."""
    main, feature = forked(repo, {"p": b"A", "q": b"Q"})
    feature.upload("p", b"B")
    feature.commit("change p")
    if not fast_forward:
        main.upload("m", b"M")
        main.commit("main moves on")
    main.upload("p", b"X")
    main.upload("p", b"A")
    rewrite(lake, repo, "main", "q")
    assert list(main.uncommitted()) == []
    result = repo.merge("feature", into="main")
    assert result.fast_forward == fast_forward
    assert main.read("p") == b"B"
    assert lake.graveler.read_branch(repo.record, "main").sealed_tokens == ()
    assert list(main.uncommitted()) == []
    main.upload("z", b"z")
    with pytest.raises(DirtyBranch):
        repo.merge("feature", into="main")


def test_a_write_landing_while_rewrites_are_sealed_blocks_the_merge_and_is_kept(
    lake: Lake, repo, monkeypatch
) -> None:
    main, feature = forked(repo, {"p": b"A"})
    feature.upload("f", b"f")
    feature.commit("f")
    rewrite(lake, repo, "main", "p")
    g = lake.graveler
    original = g.try_update_branch

    def write_first(record, branch, predicate):
        monkeypatch.setattr(g, "try_update_branch", original)
        main.upload("late", b"written just before the seal")
        return original(record, branch, predicate)

    monkeypatch.setattr(g, "try_update_branch", write_first)
    with pytest.raises(DirtyBranch):
        repo.merge("feature", into="main")
    assert main.read("late") == b"written just before the seal"
    assert [c.path for c in main.uncommitted()] == ["late"]


def _waited() -> None:
    raise AssertionError("the commit waited for the merge's seal")


def test_a_merge_blocked_by_a_write_after_its_seal_releases_the_seal(
    lake: Lake, repo, monkeypatch
) -> None:
    """The merge sealed the rewrites, then found a real write above them: it refuses, and
    releases its seal, so committing that write does not wait `commit_wait` for a merge that
    will never land."""
    main, feature = forked(repo, {"p": b"A"})
    feature.upload("f", b"f")
    feature.commit("f")
    rewrite(lake, repo, "main", "p")
    g = lake.graveler
    monkeypatch.setattr(g, "retry", dataclasses.replace(g.retry, commit_wait=600))

    def write_now() -> None:
        main.upload("late", b"written just after the seal")

    with armed("merge.after_seal", write_now), pytest.raises(DirtyBranch):
        repo.merge("feature", into="main")
    with armed("commit.awaiting", _waited):
        made = main.commit("late")
    assert sorted(e.path for e in repo.ref(made.id).list()) == ["late", "p"]


@pytest.mark.parametrize("preview", [False, True])
def test_a_merge_that_fails_after_sealing_the_rewrites_releases_the_seal(
    lake: Lake, repo, monkeypatch, preview: bool
) -> None:
    """A conflict found after the rewrites were sealed (or a publish whose destination moved)
    fails the merge; the next commit there seals at once and records the rewrites with its
    own write."""
    main, feature = forked(repo, {"p": b"A", "q": b"Q"})
    feature.upload("p", b"from feature")
    feature.commit("feature changes p")
    g = lake.graveler
    monkeypatch.setattr(g, "retry", dataclasses.replace(g.retry, commit_wait=600))
    if preview:
        previewed = repo.merge("feature", into="main", preview=True)
        main.upload("m", b"main moves on")
        main.commit("main moves on")
        rewrite(lake, repo, "main", "q")
        with pytest.raises(MergeRaceLost):
            repo.publish(previewed.commit.id, into="main")
    else:
        main.upload("p", b"from main")
        main.commit("main changes p")
        rewrite(lake, repo, "main", "q")
        with pytest.raises(MergeConflict):
            repo.merge("feature", into="main")
    assert g.read_branch(repo.record, "main").sealed_tokens != ()
    main.upload("z", b"z")
    with armed("commit.awaiting", _waited):
        made = main.commit("z")
    assert "z" in {e.path for e in repo.ref(made.id).list()}
    assert g.read_branch(repo.record, "main").sealed_tokens == ()


# --- criss-cross merges -----------------------------------------------------------------


def criss_cross(repo, left_change: dict[str, bytes], right_change: dict[str, bytes], strategy):
    """`left` and `right` fork from main, change, then each merges the other's first commit:
    the tips have two best merge bases, `left`'s and `right`'s first commits."""
    main = repo.branch("main")
    for path in ("p", "q"):
        main.upload(path, f"{path} at the fork".encode())
    main.commit("fork")
    sides = {}
    for name, change in (("left", left_change), ("right", right_change)):
        branch = repo.create_branch(name, source="main")
        for path, content in change.items():
            branch.upload(path, content)
        branch.upload(f"only-{name}", b"x")
        sides[name] = branch.commit(f"{name} 1")
    repo.merge(sides["right"].id, into="left", strategy=strategy)
    repo.merge(sides["left"].id, into="right", strategy=strategy)
    return repo.branch("left"), repo.branch("right"), sides


def test_criss_cross_has_two_merge_bases_and_the_merge_records_them(lake: Lake, repo) -> None:
    left, right, sides = criss_cross(repo, {"p": b"B"}, {"q": b"Q"}, None)
    bases = find_merge_bases(lake.graveler.refs, repo.record, [left.commit_id], [right.commit_id])
    assert sorted(b.id for b in bases) == sorted((sides["left"].id, sides["right"].id))
    assert repo.merge_base("left", "right").id in {b.id for b in bases}
    left.upload("l", b"more")
    left.commit("more")
    result = repo.merge("left", into="right")
    recorded = result.commit.metadata[merge_ops.BASES_KEY].split(",")
    assert sorted(recorded) == sorted(b.id for b in bases)


def test_a_fork_has_one_merge_base_recorded_once(lake: Lake, repo) -> None:
    main, feature = forked(repo, {"p": b"A"})
    fork = main.commit_id
    feature.upload("f", b"f")
    feature.commit("f")
    main.upload("m", b"m")
    main.commit("m")
    result = repo.merge("feature", into="main")
    assert result.commit.metadata[merge_ops.BASES_KEY] == fork
    refs, record = lake.graveler.refs, repo.record
    assert find_merge_bases(refs, record, [main.commit_id], [feature.commit_id]) == [
        refs.get_commit(record, feature.commit_id)
    ]


def test_criss_cross_keeps_deletions_that_either_single_base_would_conflict_on(repo) -> None:
    """p changed on left's first commit, q on right's; after the criss-cross each side
    deletes one. With left's commit as the only base q conflicts, with right's p does."""
    left, right, _ = criss_cross(repo, {"p": b"B"}, {"q": b"Q"}, None)
    left.delete("p")
    left.commit("delete p")
    right.delete("q")
    right.commit("delete q")
    repo.merge("right", into="left")
    assert sorted(e.path for e in left.list()) == ["only-left", "only-right"]


def test_criss_cross_where_the_bases_disagree_conflicts(repo) -> None:
    """The bases hold X and Y at p: the virtual base holds neither, so tips that kept X and
    Y both changed p (git conflicts too) instead of one silently winning."""
    left, right, _ = criss_cross(repo, {"p": b"X"}, {"p": b"Y"}, "dest-wins")
    assert left.read("p") == b"X" and right.read("p") == b"Y"
    with pytest.raises(MergeConflict) as raised:
        repo.merge("right", into="left")
    assert raised.value.paths == ["p"]
    repo.merge("right", into="left", strategy="source-wins")
    assert left.read("p") == b"Y"


# --- an Airflow task retried --------------------------------------------------------------


def run_task(branch) -> None:
    """A task that writes its output and commits it, as an Airflow task would."""
    branch.upload("out/part-0", b"rows 0")
    branch.upload("out/part-1", b"rows 1", metadata={"rows": "1"})
    branch.commit("task output")


def test_a_retried_task_commits_once_then_finds_no_changes(lake: Lake, repo) -> None:
    main = repo.branch("main")
    run_task(main)
    head, written = main.commit_id, data_objects(lake, repo)
    with pytest.raises(NoChanges):
        run_task(main)
    assert main.commit_id == head
    assert data_objects(lake, repo) == written
    assert [c.message for c in repo.log("main")] == ["task output", "Repository created"]


def test_a_retried_task_does_not_block_a_merge_into_its_branch(repo) -> None:
    main = repo.branch("main")
    run_task(main)
    feature = repo.create_branch("feature", source="main")
    feature.upload("out/part-1", b"fixed rows 1", metadata={"rows": "1"})
    feature.commit("fix")
    main.upload("out/part-0", b"rows 0")
    main.upload("out/part-1", b"rows 1", metadata={"rows": "1"})
    repo.merge("feature", into="main")
    assert main.read("out/part-1") == b"fixed rows 1"
