"""Merge: the correctness table of lakeFS's contended-merge design, conflicts, strategies,
fast-forward."""

from __future__ import annotations

import contextlib
import dataclasses
import random
from datetime import datetime, timezone
from pathlib import Path

import pyarrow as pa
import pytest

from branchwater.engine import (
    DirtyBranch,
    InvalidArgument,
    Lake,
    MergeConflict,
    NoChanges,
    NotFound,
)
from branchwater.engine.graveler import history
from branchwater.engine.graveler import merge as merge_ops
from branchwater.engine.graveler.committed import CommittedStore, RangePolicy, Replacements
from branchwater.engine.graveler.graveler import RetryPolicy
from branchwater.engine.graveler.model import Commit, Entry
from branchwater.engine.graveler.refs import commit_id_for
from branchwater.engine.objects import open_object_store
from tests.helpers.failpoints import held_at
from tests.helpers.races import lost_merge

DELETED = None
MTIME = datetime(2026, 11, 1, tzinfo=timezone.utc)


@pytest.fixture
def lake() -> Lake:
    policy = RangePolicy(target_entries=4, max_entries=16)
    with Lake.connect("memory://", range_policy=policy, retry=RetryPolicy(base_delay=0)) as lake:
        yield lake


@pytest.fixture
def repo(lake: Lake, tmp_path: Path):
    return lake.create_repository("merges", storage_namespace=f"file://{tmp_path}/ns")


def put(branch, path: str, content: bytes | None) -> None:
    """Make `path` hold `content`; `None` means deleted (absent)."""
    if content is None:
        with contextlib.suppress(NotFound):
            branch.delete(path)
    else:
        branch.upload(path, content)


def content(ref, path: str) -> bytes | None:
    try:
        return ref.read(path)
    except NotFound:
        return None


def race_once(monkeypatch, graveler, action) -> list[int]:
    """Run `action` (a concurrent change to the destination) just before the first set_if."""
    calls: list[int] = []
    original = graveler.try_update_branch

    def racing(repo, branch, predicate):
        calls.append(1)
        if len(calls) == 1:
            action()
        return original(repo, branch, predicate)

    monkeypatch.setattr(graveler, "try_update_branch", racing)
    return calls


# base, src, dst, dst' (None: no race at p), expected (bytes, or "conflict")
TABLE = [
    ("A", "B", "A", "A", "B"),
    ("A", "A", "B", "B", "B"),
    ("A", "A", "A", "B", "B"),
    ("A", "B", "C", None, "conflict"),
    ("A", "B", "A", "C", "conflict"),
    ("A", "A", "B", "C", "C"),
    # Rows that design's table lacks: the destination had taken the source's change.
    ("A", "B", "B", "C", "conflict"),
    ("A", "B", "B", "A", "B"),
]
DELETION = [None, "A", "B", "C"]


@pytest.mark.parametrize("deleted", DELETION, ids=lambda d: f"deleted={d}")
@pytest.mark.parametrize("row", TABLE, ids=[f"row{i + 1}" for i in range(len(TABLE))])
def test_the_contended_merge_designs_correctness_table(repo, monkeypatch, row, deleted) -> None:
    base, src, dst, dst_after, expected = row

    def value(symbol: str) -> bytes | None:
        return DELETED if symbol == deleted else symbol.encode()

    main = repo.branch("main")
    main.upload("keep", b"k")
    put(main, "p", value(base))
    main.commit("base")
    feature = repo.create_branch("feature", source="main")
    if src != base:
        put(feature, "p", value(src))
    feature.upload("src-only", b"s")
    feature.commit("source side")
    if dst != base:
        put(main, "p", value(dst))
    main.upload("dst-only", b"d")
    main.commit("destination side")

    def concurrent_commit() -> None:
        if dst_after is not None and dst_after != dst:
            put(main, "p", value(dst_after))
        main.upload("race-only", b"r")
        main.commit("concurrent commit")

    calls = (
        race_once(monkeypatch, repo.lake.graveler, concurrent_commit)
        if dst_after is not None
        else []
    )
    if expected == "conflict":
        with pytest.raises(MergeConflict) as info:
            repo.merge("feature", into="main")
        assert info.value.paths == ["p"]
        return
    result = repo.merge("feature", into="main")
    assert calls and result.attempts == 2
    assert content(main, "p") == value(expected)
    assert {"keep", "src-only", "dst-only", "race-only"} <= {e.path for e in main.list()}
    assert result.commit.parents[1] == repo.ref("feature").commit_id


def test_retry_reuses_the_ranges_it_wrote(lake: Lake, repo, monkeypatch) -> None:
    """The second attempt finds its ranges already stored: only new ranges are written."""
    main = repo.branch("main")
    for i in range(200):
        main.upload(f"d/{i:04d}", b"x")
    main.commit("base")
    feature = repo.create_branch("feature", source="main")
    feature.upload("d/0100a", b"new")
    feature.commit("feature")
    main.upload("zzz", b"other")
    main.commit("dest")
    objects = lake.graveler.objects(repo.storage_namespace)
    puts: list[str] = []
    original_put = objects.put

    def counting_put(key, data):
        puts.append(key)
        return original_put(key, data)

    monkeypatch.setattr(objects, "put", counting_put)

    def concurrent() -> None:
        main.upload("zzzz", b"race")
        main.commit("race")
        puts.clear()

    race_once(monkeypatch, lake.graveler, concurrent)
    result = repo.merge("feature", into="main")
    assert result.attempts == 2
    ranges_written = [k for k in puts if "/ranges/" in k]
    assert len(ranges_written) <= 1, ranges_written
    assert content(main, "d/0100a") == b"new"
    assert content(main, "zzzz") == b"race"


# base, src, dst, dst' at `p`; whether the retry merges afresh (reusing would differ there)
RETRIED = [
    ("A", "B", "B", "C", True),
    ("A", "B", "B", "A", True),
    ("A", "B", "C", "A", True),
    ("A", "B", "C", "D", True),
    ("A", "B", "A", "C", False),
    ("A", "A", "B", "C", False),
]


@pytest.mark.parametrize("strategy", [None, "source-wins", "dest-wins"])
@pytest.mark.parametrize("row", RETRIED, ids=["".join(map(str, row)) for row in RETRIED])
def test_a_retry_merges_afresh_where_head_had_changed_a_path_the_source_changed(
    repo, monkeypatch, row, strategy
) -> None:
    """Seed 37's shape (`tests/history/test_regressions.py`) and its neighbours: the retried
    merge is the fresh merge of its parents, conflicts included, and it reuses its first
    attempt wherever the destination had left the source's paths as the base has them."""
    base, src, dst, dst_after, afresh = row
    main = repo.branch("main")
    main.upload("p", base.encode())
    main.commit("base")
    feature = repo.create_branch("feature", source="main")
    put(feature, "p", src.encode())
    feature.upload("src-only", b"s")
    feature.commit("source side")
    put(main, "p", dst.encode())
    main.upload("dst-only", b"d")
    main.commit("destination side")
    firsts = _counting_first_attempts(monkeypatch)

    def concurrent_commit() -> None:
        put(main, "p", dst_after.encode())
        main.commit("concurrent commit")

    calls = race_once(monkeypatch, repo.lake.graveler, concurrent_commit)
    trees = [{"p": value.encode()} for value in (base, src, dst, dst_after)]
    if _three_way(*trees[:3], strategy)[1]:
        with pytest.raises(MergeConflict):
            repo.merge("feature", into="main", strategy=strategy)
        assert not calls
        return
    expected, conflicts = _three_way(trees[0], trees[1], trees[3], strategy)
    if conflicts:
        with pytest.raises(MergeConflict) as info:
            repo.merge("feature", into="main", strategy=strategy)
        assert info.value.paths == ["p"] and info.value.count == 1
        assert content(main, "p") == dst_after.encode()
    else:
        result = repo.merge("feature", into="main", strategy=strategy)
        assert result.attempts == 2
        assert content(main, "p") == expected["p"]
        assert content(main, "src-only") == b"s"
    assert len(firsts) == (2 if afresh else 1)


def _counting_first_attempts(monkeypatch) -> list[str]:
    """The source commits merges merged afresh (`_first_attempt`), not reusing an attempt."""
    sources: list[str] = []
    first_attempt = merge_ops._first_attempt

    def counting(g, repo, head, source, *args):
        sources.append(source.id)
        return first_attempt(g, repo, head, source, *args)

    monkeypatch.setattr(merge_ops, "_first_attempt", counting)
    return sources


def test_a_retry_after_disjoint_merges_reuses_its_attempt(repo, monkeypatch) -> None:
    """The common contended case (lakeFS's design): other branches merged into the
    destination meanwhile, none touching the source's paths. Every retry reuses its attempt
    (one `_first_attempt` in all), and the result is the merge of its parents."""
    main = repo.branch("main")
    for i in range(40):
        main.upload(f"d/{i:02d}", b"base")
    main.commit("base")
    for name, i in (("feature", 5), ("other", 25), ("third", 35)):
        branch = repo.create_branch(name, source="main")
        branch.upload(f"d/{i:02d}", name.encode())
        branch.commit(name)
    main.upload("d/15", b"main moved")
    main.commit("main moves on")
    firsts = _counting_first_attempts(monkeypatch)
    calls: list[int] = []
    original = repo.lake.graveler.try_update_branch

    def two_races(record, branch, predicate):
        calls.append(1)
        if len(calls) in (1, 3):
            repo.merge("other" if len(calls) == 1 else "third", into="main")
        return original(record, branch, predicate)

    monkeypatch.setattr(repo.lake.graveler, "try_update_branch", two_races)
    result = repo.merge("feature", into="main")
    assert result.attempts == 3
    assert firsts.count(result.commit.parents[1]) == 1
    assert {e.path: content(main, e.path) for e in main.list() if e.path != "d/15"} == {
        f"d/{i:02d}": {5: b"feature", 25: b"other", 35: b"third"}.get(i, b"base")
        for i in range(40)
        if i != 15
    }


def test_conflict_lists_paths_and_counts_them(repo) -> None:
    main = repo.branch("main")
    for i in range(30):
        main.upload(f"c/{i:02d}", b"base")
    main.commit("base")
    feature = repo.create_branch("feature", source="main")
    for i in range(30):
        feature.upload(f"c/{i:02d}", b"src")
        main.upload(f"c/{i:02d}", b"dst")
    feature.commit("src")
    main.commit("dst")
    head = main.commit_id
    with pytest.raises(MergeConflict) as info:
        repo.merge("feature", into="main")
    assert info.value.count == 30
    assert info.value.paths == [f"c/{i:02d}" for i in range(merge_ops.CONFLICTS_SHOWN)]
    assert "and 10 more" in str(info.value)
    assert main.commit_id == head


@pytest.mark.parametrize(("strategy", "expected"), [("source-wins", b"src"), ("dest-wins", b"dst")])
def test_strategies_resolve_conflicts_and_are_recorded(repo, strategy, expected) -> None:
    main = repo.branch("main")
    main.upload("p", b"base")
    main.commit("base")
    feature = repo.create_branch("feature", source="main")
    feature.upload("p", b"src")
    feature.upload("q", b"src-only")
    feature.commit("src")
    main.upload("p", b"dst")
    main.commit("dst")
    result = repo.merge("feature", into="main", strategy=strategy)
    assert content(main, "p") == expected
    assert content(main, "q") == b"src-only"
    assert result.commit.metadata["branchwater.merge.strategy"] == strategy


def test_fast_forward_and_up_to_date(repo) -> None:
    main = repo.branch("main")
    main.upload("a", b"1")
    main.commit("a")
    feature = repo.create_branch("feature", source="main")
    feature.upload("b", b"2")
    tip = feature.commit("b")
    result = repo.merge("feature", into="main")
    assert result.fast_forward and result.commit.id == tip.id
    assert main.commit_id == tip.id
    with pytest.raises(NoChanges):
        repo.merge("feature", into="main")


def test_no_fast_forward_writes_a_merge_commit_with_its_message_and_metadata(repo) -> None:
    main = repo.branch("main")
    main.upload("a", b"1")
    before = main.commit("a")
    feature = repo.create_branch("feature", source="main")
    feature.upload("b", b"2")
    tip = feature.commit("b")
    result = repo.merge(
        "feature", into="main", message="Merge b", metadata={"job": "daily"}, fast_forward=False
    )
    merged = result.commit
    assert not result.fast_forward and result.attempts == 1
    assert main.commit_id == merged.id != tip.id
    assert merged.parents == (before.id, tip.id)
    assert (merged.message, merged.metadata["job"]) == ("Merge b", "daily")
    assert merged.metadata[merge_ops.BASES_KEY] == before.id
    assert merged.metarange_id == tip.metarange_id
    assert {e.path: content(main, e.path) for e in main.list()} == {"a": b"1", "b": b"2"}
    with pytest.raises(NoChanges):
        repo.merge("feature", into="main", fast_forward=False)


def test_no_fast_forward_merge_that_lost_a_race_merges_onto_the_new_head(
    lake: Lake, repo, monkeypatch
) -> None:
    """Its first attempt holds the source's tree on the old HEAD; the retry merges that onto
    what landed meanwhile, as any merge's retry does."""
    main = repo.branch("main")
    main.upload("a", b"1")
    main.commit("a")
    feature = repo.create_branch("feature", source="main")
    feature.upload("b", b"2")
    tip = feature.commit("b")

    def concurrent() -> None:
        main.upload("late", b"late")
        main.commit("late")

    race_once(monkeypatch, lake.graveler, concurrent)
    result = repo.merge("feature", into="main", fast_forward=False)
    assert result.attempts == 2 and not result.fast_forward
    assert result.commit.parents == (repo.ref("main~1").commit_id, tip.id)
    assert {e.path for e in main.list()} == {"a", "b", "late"}


def test_merge_into_dirty_branch_fails_and_leaves_it(repo) -> None:
    main = repo.branch("main")
    main.upload("a", b"1")
    main.commit("a")
    feature = repo.create_branch("feature", source="main")
    feature.upload("b", b"2")
    feature.commit("b")
    main.upload("dirty", b"x")
    head = main.commit_id
    with pytest.raises(DirtyBranch, match="uncommitted changes"):
        repo.merge("feature", into="main")
    assert main.commit_id == head
    assert [c.path for c in main.uncommitted()] == ["dirty"]


def test_merge_base_is_the_newest_common_ancestor(repo) -> None:
    main = repo.branch("main")
    main.upload("a", b"1")
    fork = main.commit("fork point")
    left = repo.create_branch("left", source="main")
    right = repo.create_branch("right", source="main")
    left.upload("l", b"l")
    left.commit("l")
    right.upload("r", b"r")
    right.commit("r")
    assert repo.merge_base("left", "right").id == fork.id
    repo.merge("left", into="right")
    assert repo.merge_base("left", "right").id == repo.ref("left").commit_id


def test_a_commit_is_an_ancestor_of_itself_and_its_descendants_only(lake: Lake, repo) -> None:
    main = repo.branch("main")
    main.upload("a", b"1")
    fork = main.commit("fork point")
    left = repo.create_branch("left", source="main")
    left.upload("l", b"l")
    tip = left.commit("l")
    main.upload("m", b"m")
    beside = main.commit("m")
    refs, record = lake.graveler.refs, repo.record
    assert history.is_ancestor(refs, record, fork.id, tip.id)
    assert history.is_ancestor(refs, record, tip.id, tip.id)
    assert not history.is_ancestor(refs, record, tip.id, fork.id)
    assert not history.is_ancestor(refs, record, beside.id, tip.id)


def test_a_retry_after_a_merge_landed_in_other_ranges_reads_none_of_them(lake: Lake, repo) -> None:
    """The retry may reuse its attempt where nothing that landed meanwhile meets, by range
    bounds, what the source changed: it lands its attempt's tree on the new HEAD without
    reading a range the other merge changed."""
    main = repo.branch("main")
    for i in range(200):
        main.upload(f"k{i:03d}", b"0")
    main.commit("base")
    for name, path in (("feature", "k010"), ("other", "k190"), ("moved", "k100")):
        repo.create_branch(name, source="main").upload(path, name.encode())
        repo.branch(name).commit(name)
    repo.merge("moved", into="main")
    committed = lake.graveler.committed(repo.record)
    storage = committed.storage
    read: list[str] = []
    range_table = storage.range_table

    def reading(range_id: str) -> pa.Table:
        read.append(range_id)
        return range_table(range_id)

    with held_at("merge.before_set", lambda: repo.merge("feature", "main")) as merging:
        before = committed.ranges(main.head().metarange_id)
        repo.merge("other", into="main")
        after = committed.ranges(main.head().metarange_id)
        storage.range_table = reading
    result = merging.result
    assert result.attempts == 2
    landed = {r.range_id for r in before} ^ {r.range_id for r in after}
    assert landed and not landed & set(read), "the retry read a range the other merge changed"
    changed = {"k010": b"feature", "k100": b"moved", "k190": b"other"}
    assert {e.path: main.read(e.path) for e in main.list()} == {
        f"k{i:03d}": changed.get(f"k{i:03d}", b"0") for i in range(200)
    }


def test_unknown_strategy_and_bad_hint(repo) -> None:
    repo.create_branch("feature", source="main")
    with pytest.raises(InvalidArgument, match="strategy"):
        repo.merge("feature", into="main", strategy="ours")
    with pytest.raises(InvalidArgument, match="hint"):
        repo.merge("feature", into="main", hint=5)  # type: ignore[arg-type]


def test_lost_races_give_a_hint_that_resumes_the_work(repo) -> None:
    main = repo.branch("main")
    main.upload("a", b"1")
    main.commit("a")
    feature = repo.create_branch("feature", source="main")
    feature.upload("f", b"feature")
    feature.commit("f")
    main.upload("m", b"main")
    main.commit("m")
    lost = lost_merge(repo, "feature", "main")
    main.upload("late", b"late")
    main.commit("late")
    result = repo.merge("feature", into="main", hint=lost.hint)
    assert {e.path for e in main.list()} == {"a", "f", "m", "late"}
    assert result.commit.parents == (repo.ref("main~1").commit_id, feature.commit_id)


def test_a_hint_resumes_only_the_merge_whose_lost_race_gave_it(
    repo, caplog: pytest.LogCaptureFixture
) -> None:
    """A retry lands the hinted tree as the merge's result: a hint of another tree (a forged
    one, another source's, another strategy's, an earlier version's without a tag) would put
    it on a protected branch unchecked. Each is ignored, with a warning: the merge is made
    afresh, as without a hint."""
    main = repo.branch("main")
    main.upload("m", b"main")
    main.commit("m")
    feature = repo.create_branch("feature", source="main")
    feature.upload("f", b"feature")
    feature.commit("f")
    evil = repo.create_branch("evil", source="main")
    evil.upload("pwned", b"garbage")
    evil.commit("pwned")
    main.upload("m2", b"main")
    main.commit("m2")
    lost, lost_evil = lost_merge(repo, "feature", "main"), lost_merge(repo, "evil", "main")
    repo.protect("main", no_direct_writes=True, required_checks=["quality"])
    repo.record_check(feature.commit_id, "quality", passed=True)
    head = main.commit_id
    tag = lost.hint.rpartition(".")[2]
    evil_tree = repo.commit(evil.commit_id).metarange_id
    ignored = {
        "a forged tree": f"{evil_tree}@{head}",
        "a forged tree with a copied tag": f"{evil_tree}@{head}.{tag}",
        "another source's": lost_evil.hint,
        "garbage": "garbage",
        "a huge one": "x@" * 500_000 + "y.z",
    }
    merged = {"m", "m2", "f"}
    for what, hint in ignored.items():
        caplog.clear()
        preview = repo.merge("feature", into="main", hint=hint, preview=True).commit
        assert {e.path for e in repo.ref(preview.id).list()} == merged, what
        assert "merging afresh" in caplog.text, what
        assert len(caplog.text) < 2_000, what
    caplog.clear()
    preview = repo.merge("feature", "main", "dest-wins", hint=lost.hint, preview=True).commit
    assert {e.path for e in repo.ref(preview.id).list()} == merged
    assert "merging afresh" in caplog.text
    assert main.commit_id == head
    caplog.clear()
    result = repo.merge("feature", into="main", hint=lost.hint)
    assert "merging afresh" not in caplog.text
    assert {e.path for e in main.list()} == {"m", "m2", "f"}
    assert result.commit.parents == (head, feature.commit_id)


def test_unrelated_histories_have_no_merge_base(lake: Lake, repo) -> None:
    """An orphan root (as a refs restore from another repository could bring) shares nothing."""
    g, record = lake.graveler, repo.record
    head = g.refs.get_commit(record, repo.branch("main").commit_id)
    orphan = Commit(
        id="",
        message="orphan",
        metarange_id=head.metarange_id,
        parents=(),
        generation=1,
    )
    orphan = dataclasses.replace(orphan, id=commit_id_for(orphan))
    g.refs.put_commit(record, orphan)
    with pytest.raises(NotFound, match="share no ancestor"):
        repo.merge_base("main", orphan.id)


def _entry(path: str, version: int) -> Entry:
    return Entry(path, f"data/x/{path}-{version}", version, f"{version:032x}", MTIME)


def _random_changes(rng, paths: list[str], region: range, version: int):
    """Changes (sorted) to a few paths inside `region`: edits, deletes and inserts."""
    picked = sorted({f"k{rng.choice(region):05d}" for _ in range(rng.randint(1, 12))})
    existing = set(paths)
    return [
        (p, None if p in existing and rng.random() < 0.3 else _entry(p, version)) for p in picked
    ]


@pytest.mark.parametrize("seed", range(12))
def test_replacements_give_the_key_by_key_result_with_fewer_splices(tmp_path, monkeypatch, seed):
    """Copying the source's range where the destination kept the base's is only a shortcut:
    the merged metarange id must be the one key-by-key application gives."""
    rng = random.Random(seed)
    store = CommittedStore(
        open_object_store(f"file://{tmp_path}"), RangePolicy(target_entries=8, max_entries=40)
    )
    paths = sorted(f"k{i:05d}" for i in rng.sample(range(5000), 800))
    base = store.write_metarange(_entry(p, 1) for p in paths)
    source_changes = _random_changes(rng, paths, range(0, 5000), 2)
    taken = {p for p, _ in source_changes}
    dest_changes = [c for c in _random_changes(rng, paths, range(0, 5000), 3) if c[0] not in taken]
    source = store.apply(base, source_changes)
    dest = store.apply(base, dest_changes)
    changes = [(c.path, c.new_entry) for c in store.diff(base, source)]
    splices: list[str] = []
    original = store.storage.range_table

    def counting(range_id):
        splices.append(range_id)
        return original(range_id)

    monkeypatch.setattr(store.storage, "range_table", counting)
    plain = store.apply(dest, changes)
    plain_splices = len(splices)
    splices.clear()
    replacements = Replacements.between(store.ranges(base), store.ranges(source))
    fast = store.apply(dest, changes, replacements)
    assert fast == plain
    assert len(splices) <= plain_splices


def test_replacements_copy_the_source_range_untouched_by_the_destination(tmp_path, monkeypatch):
    store = CommittedStore(
        open_object_store(f"file://{tmp_path}"), RangePolicy(target_entries=8, max_entries=40)
    )
    paths = [f"k{i:05d}" for i in range(0, 2000, 2)]
    base = store.write_metarange(_entry(p, 1) for p in paths)
    source = store.apply(base, [("k00500", _entry("k00500", 2))])
    dest = store.apply(base, [("k01800", _entry("k01800", 3))])
    changes = [(c.path, c.entry) for c in store.diff(base, source)]
    spliced: list[str] = []
    replacements = Replacements.between(store.ranges(base), store.ranges(source))
    with monkeypatch.context() as patch:
        patch.setattr(store.storage, "range_table", spliced.append)
        merged = store.apply(dest, changes, replacements)
    assert spliced == []
    assert store.get(merged, "k00500").size == 2
    assert store.get(merged, "k01800").size == 3
    assert set(store.ranges(source)) - set(store.ranges(base)) <= set(store.ranges(merged))


def _three_way(base: dict, source: dict, dest: dict, strategy: str | None):
    """The reference merge, path by path on dicts: (result, conflicting paths)."""
    result, conflicts = dict(dest), []
    for path in sorted(base.keys() | source.keys() | dest.keys()):
        b, s, d = base.get(path), source.get(path), dest.get(path)
        if s in (b, d):
            continue
        if d == b or strategy == "source-wins":
            result[path] = s
        elif strategy != "dest-wins":
            conflicts.append(path)
    return {p: v for p, v in result.items() if v is not None}, conflicts


def _randomly_change(rng: random.Random, branch, state: dict, tag: str, count: int) -> None:
    for path in rng.sample([f"p/{i:04d}" for i in range(400)], count):
        value = None if rng.random() < 0.3 else f"{tag}-{path}".encode()
        put(branch, path, value)
        if value is None:
            state.pop(path, None)
        else:
            state[path] = value


@pytest.mark.parametrize("strategy", [None, "source-wins", "dest-wins"])
@pytest.mark.parametrize("seed", range(3))
def test_random_merges_match_a_path_by_path_reference(repo, monkeypatch, seed, strategy) -> None:
    """Many changes on both sides, resolved in batches smaller than the change set."""
    monkeypatch.setattr(merge_ops, "RESOLVE_BATCH", 7)
    rng = random.Random(f"{seed}-{strategy}")
    main = repo.branch("main")
    base: dict[str, bytes] = {}
    _randomly_change(rng, main, base, "base", 300)
    main.commit("base")
    feature = repo.create_branch("feature", source="main")
    source, dest = dict(base), dict(base)
    _randomly_change(rng, feature, source, "src", 60)
    feature.commit("feature")
    _randomly_change(rng, main, dest, "dst", 60)
    main.commit("main moves on")
    expected, conflicts = _three_way(base, source, dest, strategy)

    if conflicts:
        with pytest.raises(MergeConflict) as raised:
            repo.merge("feature", into="main", strategy=strategy)
        assert raised.value.count == len(conflicts)
        assert raised.value.paths == conflicts[: merge_ops.CONFLICTS_SHOWN]
        assert {e.path: main.read(e.path) for e in main.list()} == dest
    else:
        repo.merge("feature", into="main", strategy=strategy)
        assert {e.path: main.read(e.path) for e in main.list()} == expected


HISTORY_PATHS = [f"h/{i}" for i in range(6)]
HISTORY_VALUES = [None, b"1", b"2", b"3"]
"""Few paths and values, so sides often agree by chance: a destination that took the
source's change, then changed it again or undid it, is common."""


def _scramble(rng: random.Random, branch, count: int, marker: str) -> None:
    """Random values at `count` paths, and a path of its own so the commit is never empty."""
    for path in rng.sample(HISTORY_PATHS, count):
        put(branch, path, rng.choice(HISTORY_VALUES))
    branch.upload(f"marker/{marker}", marker.encode())


def _merge_outcome(repo, source: str, into: str, strategy: str | None) -> tuple:
    """What merging `source` into `into` did, as comparable values."""
    try:
        result = repo.merge(source, into=into, strategy=strategy)
    except MergeConflict as conflict:
        return ("conflict", conflict.paths, conflict.count)
    except NoChanges:
        return ("no changes",)
    tree = {e.path: content(repo.ref(into), e.path) for e in repo.ref(into).list()}
    bases = result.commit.metadata.get(merge_ops.BASES_KEY)
    return ("merged", result.fast_forward, result.commit.parents, bases, tree)


def _random_history(rng: random.Random, repo) -> None:
    """`main` and `feature` (two commits) diverged from a base; `side` took some of the
    feature's values, and `main` merged it or moved on by itself."""
    main = repo.branch("main")
    for path in HISTORY_PATHS:
        put(main, path, rng.choice(HISTORY_VALUES[1:]))
    main.commit("base")
    feature = repo.create_branch("feature", source="main")
    side = repo.create_branch("side", source="main")
    for step in ("f1", "f2"):
        _scramble(rng, feature, 2, step)
        feature.commit(step)
    for path in rng.sample(HISTORY_PATHS, 3):
        put(side, path, content(feature, path))
    side.upload("marker/side", b"side")
    side.commit("side takes the feature's values")
    if rng.random() < 0.5:
        repo.merge("side", into="main", strategy="source-wins", fast_forward=False)
    _scramble(rng, main, rng.randrange(3), "main")
    main.commit("main moves on")


def _race(rng: random.Random, repo) -> None:
    """What lands on `main` during the merge: its own changes, or a merge of the feature's
    first commit (the merge base moves), or of a branch that took the feature's values."""
    main = repo.branch("main")
    kind = rng.choice(("commit", "feature~1", "takes"))
    if kind == "feature~1":
        with contextlib.suppress(NoChanges):
            repo.merge("feature~1", into="main", strategy="dest-wins")
        return
    if kind == "takes":
        for path in rng.sample(HISTORY_PATHS, 2):
            put(main, path, content(repo.ref("feature"), path))
    _scramble(rng, main, rng.randrange(1, 4), "race")
    main.commit(f"race: {kind}")


@pytest.mark.parametrize("strategy", [None, "source-wins", "dest-wins"])
def test_random_retried_merges_are_the_fresh_merges_of_their_parents(
    lake: Lake, tmp_path: Path, monkeypatch, strategy
) -> None:
    """For random small histories, a merge that lost one race to a random change of the
    destination does what merging the same source afresh into the new HEAD does: the same
    tree, parents and bases, or the same conflicts (paths and count)."""
    raced = 0
    for seed in range(12):
        rng = random.Random(f"{seed}-{strategy}")
        name = f"history-{seed}"
        repo = lake.create_repository(name, storage_namespace=f"file://{tmp_path}/{name}")
        _random_history(rng, repo)

        def concurrent(rng: random.Random = rng, repo=repo) -> None:
            _race(rng, repo)
            repo.create_branch("fresh", source="main")

        with monkeypatch.context() as patched:
            calls = race_once(patched, lake.graveler, concurrent)
            retried = _merge_outcome(repo, "feature", "main", strategy)
        if not calls:
            continue
        raced += 1
        assert retried == _merge_outcome(repo, "feature", "fresh", strategy), seed
    assert raced >= 8
