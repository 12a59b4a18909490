"""The committed layer: content-addressed Parquet ranges and metaranges on a real local store.

A spying object store counts reads and writes per key, so the tests can check the claims
the layer exists for (unchanged ranges are neither rewritten nor read), not just results.
"""

from __future__ import annotations

import hashlib
import random
import threading
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from branchwater.engine.errors import CorruptedData, InvalidArgument, LakeClosed, NotFound
from branchwater.engine.graveler.committed import (
    EMPTY_METARANGE_ID,
    CommittedStore,
    RangeInfo,
    RangePolicy,
    writer,
)
from branchwater.engine.graveler.committed.diff import changed_ranges, spans_meet
from branchwater.engine.graveler.committed.format import (
    METARANGES_PREFIX,
    boundary_indexes,
    boundary_rows,
    build_range,
    decode_entries,
    range_id,
    range_key,
)
from branchwater.engine.graveler.model import Change, Entry
from tests.helpers.committed import POLICIES, T0, SpyStore, entry, random_entries


@pytest.fixture
def objects(tmp_path: Path) -> SpyStore:
    return SpyStore(f"file://{tmp_path}/namespace")


def fresh(objects: SpyStore, policy: RangePolicy) -> CommittedStore:
    """A store on the same objects with an empty cache, so every read shows up in the spy."""
    objects.reset()
    return CommittedStore(objects, policy)


def range_entries(store: CommittedStore, range_id: str) -> list[Entry]:
    """All entries of one range, decoded."""
    return decode_entries(store.storage.range_table(range_id))


def random_changes(
    rng: random.Random, base: list[Entry], count: int
) -> tuple[list[tuple[str, Entry | None]], list[Entry]]:
    """Sorted changes (updates, deletes incl. of absent paths, inserts before, between and
    after the base) and the entries expected after applying them."""
    result = {e.path: e for e in base}
    candidates = [e.path for e in base] + [
        rng.choice(["a/", "d3/é", "zz/"]) + f"{rng.randrange(10_000):04d}" for _ in range(count)
    ]
    changes: dict[str, Entry | None] = {}
    for path in rng.sample(candidates, min(count, len(candidates))):
        if rng.random() < 0.4:
            changes[path] = None
            result.pop(path, None)
        else:
            changes[path] = result[path] = entry(path, rng.randrange(10**6))
    return sorted(changes.items()), [result[p] for p in sorted(result)]


def naive_diff(left: list[Entry], right: list[Entry]) -> list[Change]:
    old, new = {e.path: e for e in left}, {e.path: e for e in right}
    changes = []
    for path in sorted(old.keys() | new.keys()):
        if path not in new:
            changes.append(Change(path, "removed", old[path]))
        elif path not in old:
            changes.append(Change(path, "added", new[path]))
        elif old[path].identity() != new[path].identity():
            changes.append(Change(path, "changed", new[path]))
    return changes


# --- writing and reading ------------------------------------------------------------------


def test_round_trip_keeps_every_field_and_mtime_instant(objects: SpyStore) -> None:
    entries = random_entries(random.Random(1), 300)
    store = CommittedStore(objects, POLICIES["hash"])
    metarange_id = store.write_metarange(iter(entries))

    back = list(fresh(objects, POLICIES["hash"]).iterate(metarange_id))

    assert back == entries
    assert [dict(e.metadata) for e in back] == [dict(e.metadata) for e in entries]
    assert all(e.mtime.utcoffset() == timedelta(0) for e in back)
    infos = store.ranges(metarange_id)
    assert len(infos) > 10
    assert [e for info in infos for e in range_entries(store, info.range_id)] == entries


def test_ranges_follow_the_policy(objects: SpyStore) -> None:
    for name, policy in POLICIES.items():
        entries = random_entries(random.Random(name), 200)
        infos = CommittedStore(objects, policy).ranges(
            CommittedStore(objects, policy).write_metarange(entries)
        )
        assert sum(info.entry_count for info in infos) == len(entries)
        assert [info.min_key for info in infos[1:]] > [info.max_key for info in infos[:-1]]
        assert all(info.entry_count <= policy.max_entries for info in infos)
        assert all(policy.closes(info) for info in infos[:-1]), name


def _hash_rule_as_first_defined(paths: list[str], target_entries: int) -> list[int]:
    """The hash rule as ranges were first cut by: every stored range id depends on it."""
    return [
        i
        for i, path in enumerate(paths)
        if int.from_bytes(hashlib.blake2b(path.encode(), digest_size=8).digest(), "big")
        % target_entries
        == 0
    ]


@pytest.mark.parametrize("target_entries", [1, 7, 20_000, 2**64 - 1, 2**64])
def test_boundaries_keep_the_first_definition(target_entries: int) -> None:
    rng = random.Random(target_entries)
    alphabet = "abz/._-0189éß漢字🙂\u0000~"
    paths = ["".join(rng.choices(alphabet, k=rng.randint(1, 150))) for _ in range(10_000)]
    expected = _hash_rule_as_first_defined(paths, target_entries)
    assert boundary_indexes(paths, target_entries) == expected
    assert boundary_rows(pa.array(paths, pa.string()), target_entries) == expected
    chunked = pa.chunked_array([paths[:3_000], paths[3_000:]], pa.string())
    assert boundary_rows(chunked, target_entries) == expected
    assert boundary_indexes([], target_entries) == []
    policy = RangePolicy(target_entries=target_entries)
    assert [i for i, path in enumerate(paths) if policy.is_boundary(path)] == expected


def test_range_id_depends_on_values_not_on_arrow_layout() -> None:
    entries = random_entries(random.Random(12), 60)
    table = build_range(entries)
    wide = table.cast(
        pa.schema(
            [f.with_type(pa.large_string()) if f.type == pa.string() else f for f in table.schema]
        )
    )
    chunked = pa.concat_tables([table.slice(0, 25), table.slice(25)])

    assert range_id(table) == range_id(wide) == range_id(chunked)
    assert range_id(table.slice(10, 20)) == range_id(build_range(entries[10:30]))
    assert range_id(table.slice(10, 20)) != range_id(table.slice(10, 21))


def test_same_content_same_ids_in_any_store(tmp_path: Path) -> None:
    entries = random_entries(random.Random(2), 200)
    first = CommittedStore(SpyStore(f"file://{tmp_path}/a"), POLICIES["hash"])
    second = CommittedStore(SpyStore(f"file://{tmp_path}/b"), POLICIES["hash"])

    one, two = first.write_metarange(entries), second.write_metarange(entries)

    assert one == two
    assert first.ranges(one) == second.ranges(two)
    touched = [*entries[:50], entries[50]._replace(mtime=T0), *entries[51:]]
    assert first.write_metarange(touched) != one, "the id covers every stored field"


def test_writing_existing_content_writes_only_nothing_new(objects: SpyStore) -> None:
    entries = random_entries(random.Random(3), 200)
    store = CommittedStore(objects, POLICIES["hash"])
    metarange_id = store.write_metarange(entries)
    objects.reset()

    assert store.write_metarange(entries) == metarange_id
    assert objects.puts == []


def test_empty_metarange_has_a_stable_id_and_is_stored(objects: SpyStore) -> None:
    store = CommittedStore(objects, POLICIES["tiny"])

    assert store.write_metarange([]) == EMPTY_METARANGE_ID
    assert objects.exists(METARANGES_PREFIX + EMPTY_METARANGE_ID)
    assert list(store.iterate(EMPTY_METARANGE_ID)) == []
    assert store.ranges(EMPTY_METARANGE_ID) == []
    assert list(store.diff(EMPTY_METARANGE_ID, EMPTY_METARANGE_ID)) == []


def test_write_refuses_unsorted_or_repeated_paths(objects: SpyStore) -> None:
    store = CommittedStore(objects, POLICIES["tiny"])
    with pytest.raises(InvalidArgument, match="sorted"):
        store.write_metarange([entry("b"), entry("a")])
    with pytest.raises(InvalidArgument, match="sorted"):
        store.write_metarange([entry("a"), entry("a")])
    with pytest.raises(InvalidArgument, match="non-empty"):
        store.write_metarange([entry("")])


class _FailingRangePuts(SpyStore):
    """Refuses range puts from the third on, as a full disk or a lost connection would."""

    def put_if_absent(self, key: str, encode: Callable[[], bytes]) -> bool:
        if "/ranges/" in key and sum("/ranges/" in k for k in self.puts) >= 2:
            self.puts.append(key)
            raise OSError("disk full")
        return super().put_if_absent(key, encode)


def test_a_failed_range_put_fails_the_write_and_stores_no_metarange(tmp_path: Path) -> None:
    objects = _FailingRangePuts(f"file://{tmp_path}/namespace")
    store = CommittedStore(objects, POLICIES["tiny"])
    with pytest.raises(OSError, match="disk full"):
        store.write_metarange(random_entries(random.Random(5), 200))
    assert not [key for key in objects.puts if key.startswith(METARANGES_PREFIX)]
    assert sum("/ranges/" in key for key in objects.puts) <= 3 + writer._IN_FLIGHT


def _range_store_threads() -> set[threading.Thread]:
    """The thread objects, not their idents: an earlier test's unclosed store may stop its
    threads meanwhile, and a new thread can take a stopped one's ident."""
    return {t for t in threading.enumerate() if t.name.startswith("range-store")}


def test_writers_share_the_storing_threads_until_the_store_closes(objects: SpyStore) -> None:
    """Threads started per writer cost every commit about a millisecond to start and join."""
    store = CommittedStore(objects, POLICIES["tiny"])
    before = _range_store_threads()
    store.write_metarange(random_entries(random.Random(1), 200))
    first = _range_store_threads() - before
    store.write_metarange(random_entries(random.Random(2), 200))
    assert first
    assert _range_store_threads() - before == first
    store.close()
    assert not _range_store_threads() - before
    with pytest.raises(LakeClosed):
        store.write_metarange(random_entries(random.Random(3), 200))
    assert not _range_store_threads() - before
    store.close()


@pytest.mark.parametrize(
    ("after", "prefix"),
    [("", ""), ("d2/é5", ""), ("", "d3/"), ("d3/é3", "d3/"), ("", "d3/é1"), ("zz", ""), ("", "q")],
)
def test_iterate_after_and_prefix(objects: SpyStore, after: str, prefix: str) -> None:
    entries = random_entries(random.Random(4), 400)
    metarange_id = CommittedStore(objects, POLICIES["hash"]).write_metarange(entries)
    store = fresh(objects, POLICIES["hash"])

    got = list(store.iterate(metarange_id, after=after, prefix=prefix))

    wanted = [e for e in entries if e.path > after and e.path.startswith(prefix)]
    assert got == wanted
    infos = store.ranges(metarange_id)
    could_hold = [i for i in infos if i.max_key > after and i.max_key >= prefix]
    assert objects.range_reads() <= len(could_hold)
    if prefix:
        assert objects.range_reads() <= sum(
            i.min_key[: len(prefix)] <= prefix <= i.max_key[: len(prefix)] for i in infos
        )


def test_iterate_is_lazy(objects: SpyStore) -> None:
    entries = random_entries(random.Random(5), 400)
    metarange_id = CommittedStore(objects, POLICIES["hash"]).write_metarange(entries)
    store = fresh(objects, POLICIES["hash"])

    iterator = store.iterate(metarange_id)
    assert objects.range_reads() == 0
    assert next(iterator) == entries[0]
    assert objects.range_reads() == 1


def test_get_hits_and_misses_open_at_most_one_range(objects: SpyStore) -> None:
    entries = random_entries(random.Random(6), 300)
    metarange_id = CommittedStore(objects, POLICIES["hash"]).write_metarange(entries)

    for wanted in entries[::17]:
        store = fresh(objects, POLICIES["hash"])
        assert store.get(metarange_id, wanted.path) == wanted
        assert objects.range_reads() == 1
    for missing in ("a", entries[10].path + "x", "zzz", ""):
        store = fresh(objects, POLICIES["hash"])
        with pytest.raises(NotFound, match="not found"):
            store.get(metarange_id, missing)
        assert objects.range_reads() <= 1


@pytest.mark.parametrize("seed", range(4))
def test_get_many_matches_get_and_opens_each_range_once(objects: SpyStore, seed: int) -> None:
    rng = random.Random(f"get-many-{seed}")
    entries = random_entries(rng, 400)
    metarange_id = CommittedStore(objects, POLICIES["hash"]).write_metarange(entries)
    ranges = CommittedStore(objects, POLICIES["hash"]).ranges(metarange_id)
    present = [e.path for e in rng.sample(entries, rng.choice([1, 5, 40, 400]))]
    absent = ["", "a", "zzz", entries[0].path[:-1], *(e.path + "x" for e in entries[::31])]
    paths = sorted(set(present + absent))
    by_path = {e.path: e for e in entries}

    store = fresh(objects, POLICIES["hash"])
    assert store.get_many(metarange_id, paths) == [by_path.get(p) for p in paths]
    assert objects.range_reads() <= len(ranges)
    assert len(set(objects.gets)) == len(objects.gets)
    assert store.get_many(metarange_id, []) == []


def test_cache_serves_repeated_reads_and_stays_bounded(objects: SpyStore) -> None:
    entries = random_entries(random.Random(7), 300)
    metarange_id = CommittedStore(objects, POLICIES["hash"]).write_metarange(entries)
    ranges = len(CommittedStore(objects, POLICIES["hash"]).ranges(metarange_id))

    cached = fresh(objects, POLICIES["hash"])
    list(cached.iterate(metarange_id))
    list(cached.iterate(metarange_id))
    assert objects.range_reads() == ranges

    small = CommittedStore(objects, POLICIES["hash"], cache_size=2)
    objects.reset()
    list(small.iterate(metarange_id))
    list(small.iterate(metarange_id))
    assert objects.range_reads() == 2 * ranges


def test_ranges_in_memory_are_bounded_by_bytes_as_well(
    objects: SpyStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A process keeps recent ranges up to `RANGES_IN_MEMORY_BYTES`, however few they are:
    with room for one range, a second pass over two ranges reads both again."""
    from branchwater.engine.graveler.committed import storage

    entries = [entry(f"k{i:05d}") for i in range(4000)]
    metarange_id = CommittedStore(objects, POLICIES["hash"]).write_metarange(entries)
    ranges = CommittedStore(objects, POLICIES["hash"]).ranges(metarange_id)
    assert len(ranges) >= 2
    largest = max(
        CommittedStore(objects, POLICIES["hash"]).storage.range_table(r.range_id).nbytes
        for r in ranges
    )
    monkeypatch.setattr(storage, "RANGES_IN_MEMORY_BYTES", largest)

    bounded = fresh(objects, POLICIES["hash"])
    objects.reset()
    list(bounded.iterate(metarange_id))
    list(bounded.iterate(metarange_id))
    assert objects.range_reads() == 2 * len(ranges)


# --- apply ------------------------------------------------------------------------------


@pytest.mark.parametrize("policy_name", list(POLICIES))
@pytest.mark.parametrize("seed", range(6))
def test_apply_equals_writing_the_result_from_scratch(
    tmp_path: Path, policy_name: str, seed: int
) -> None:
    rng = random.Random(f"{policy_name}-{seed}")
    policy = POLICIES[policy_name]
    store = CommittedStore(SpyStore(f"file://{tmp_path}/ns"), policy)
    base = random_entries(rng, rng.choice([0, 1, 40, 250]))
    base_id = store.write_metarange(base)

    for count in (1, 3, 30, 400):
        changes, expected = random_changes(rng, base, count)
        result_id = store.apply(base_id, iter(changes))
        assert list(store.iterate(result_id)) == expected
        assert result_id == store.write_metarange(expected), (count, changes[:5])


@pytest.mark.parametrize("policy_name", list(POLICIES))
def test_apply_of_appends_under_many_prefixes_equals_writing_from_scratch(
    tmp_path: Path, policy_name: str
) -> None:
    """Writers appending under prefixes of their own, one commit at a time: each commit's
    new entries go in as a block inside the range that holds its prefix's end (ranges cut
    inside a block and at its seams alike), as a fresh write of the result would."""
    store = CommittedStore(SpyStore(f"file://{tmp_path}/ns"), POLICIES[policy_name])
    entries: list[Entry] = []
    metarange_id = store.write_metarange(entries)
    for commit in range(12):
        changes = [
            entry(f"w{writer}/part-{commit * 5 + n:04d}", commit * 100 + writer * 10 + n)
            for writer in range(4)
            for n in range(1 + (commit + writer) % 5)
        ]
        metarange_id = store.apply(metarange_id, iter((c.path, c) for c in changes))
        entries = sorted([*entries, *changes], key=lambda e: e.path)
        assert list(store.iterate(metarange_id)) == entries
        assert metarange_id == store.write_metarange(entries), commit


def test_apply_on_the_empty_metarange_and_deleting_everything(objects: SpyStore) -> None:
    store = CommittedStore(objects, POLICIES["tiny"])
    entries = random_entries(random.Random(8), 50)

    built = store.apply(EMPTY_METARANGE_ID, ((e.path, e) for e in entries))
    assert built == store.write_metarange(entries)

    emptied = store.apply(built, ((e.path, None) for e in entries))
    assert emptied == EMPTY_METARANGE_ID
    assert list(store.iterate(emptied)) == []


def test_apply_without_changes_reads_and_writes_nothing(objects: SpyStore) -> None:
    entries = random_entries(random.Random(9), 400)
    metarange_id = CommittedStore(objects, POLICIES["hash"]).write_metarange(entries)
    store = fresh(objects, POLICIES["hash"])

    assert store.apply(metarange_id, iter(())) == metarange_id
    assert objects.puts == []
    assert objects.range_reads() == 0


def test_apply_rewrites_only_the_touched_range(objects: SpyStore) -> None:
    entries = [entry(f"t/part-{i:06d}", i) for i in range(5_000)]
    policy = RangePolicy(target_entries=100, max_entries=10_000, max_bytes=10**9)
    metarange_id = CommittedStore(objects, policy).write_metarange(entries)
    store = fresh(objects, policy)
    assert len(store.ranges(metarange_id)) > 20
    target = entries[2_345]._replace(address="data/g2/rewritten", checksum="rewritten")

    result_id = store.apply(metarange_id, [(target.path, target)])

    assert [key.split("/")[1] for key in objects.puts] == ["ranges", "metaranges"]
    assert objects.range_reads() == 1
    before, after = store.ranges(metarange_id), store.ranges(result_id)
    assert len(set(after) - set(before)) == 1
    assert store.get(result_id, target.path) == target


def test_apply_keeps_the_stored_entry_for_a_rewrite_of_equal_identity(objects: SpyStore) -> None:
    """Equal content at a new address is no change: the metarange id is the one the real
    changes alone give, and the stored entry (its address) stays."""
    entries = [entry(f"t/part-{i:06d}", i) for i in range(500)]
    store = CommittedStore(objects, POLICIES["hash"])
    base_id = store.write_metarange(entries)
    rewrites = [
        (e.path, e._replace(address=f"data/g9/{e.path}", mtime=T0 + timedelta(days=9)))
        for e in entries[100:400:7]
    ]
    real = entries[250]._replace(checksum="changed")

    assert store.apply(base_id, rewrites) == base_id
    mixed = sorted([*(c for c in rewrites if c[0] != real.path), (real.path, real)])
    assert store.apply(base_id, mixed) == store.apply(base_id, [(real.path, real)])
    assert store.get(store.apply(base_id, mixed), entries[107].path) == entries[107]


def test_diff_ignores_where_equal_content_is_stored(objects: SpyStore) -> None:
    store = CommittedStore(objects, POLICIES["hash"])
    left = [entry(f"p{i:03d}", i) for i in range(50)]
    moved = [e._replace(address=f"data/elsewhere/{e.path}") for e in left]
    changed = [*moved[:10], moved[10]._replace(metadata={"k": "v"}), *moved[11:]]
    left_id = store.write_metarange(left)

    assert list(store.diff(left_id, store.write_metarange(moved))) == []
    assert [c.path for c in store.diff(left_id, store.write_metarange(changed))] == ["p010"]


def test_apply_resynchronises_after_removing_a_range_boundary(objects: SpyStore) -> None:
    entries = [entry(f"t/part-{i:06d}", i) for i in range(5_000)]
    policy = RangePolicy(target_entries=100, max_entries=10_000, max_bytes=10**9)
    metarange_id = CommittedStore(objects, policy).write_metarange(entries)
    store = fresh(objects, policy)
    before = store.ranges(metarange_id)
    boundary = before[len(before) // 2].max_key

    result_id = store.apply(metarange_id, [(boundary, None)])

    after = store.ranges(result_id)
    assert len(after) == len(before) - 1, "two ranges merged into one, the rest reused"
    assert len(set(after) - set(before)) == 1
    assert [key.split("/")[1] for key in objects.puts] == ["ranges", "metaranges"]
    assert objects.range_reads() == 2


def test_apply_refuses_unsorted_or_mismatched_changes(objects: SpyStore) -> None:
    store = CommittedStore(objects, POLICIES["tiny"])
    base_id = store.write_metarange([entry("b")])
    with pytest.raises(InvalidArgument, match="sorted"):
        store.apply(base_id, [("c", None), ("a", None)])
    with pytest.raises(InvalidArgument, match="carries an entry"):
        store.apply(base_id, [("c", entry("d"))])


def test_writer_reuses_a_range_only_where_a_fresh_write_would_cut(objects: SpyStore) -> None:
    policy = POLICIES["hash"]
    store = CommittedStore(objects, policy)
    infos = store.ranges(store.write_metarange(random_entries(random.Random(10), 200)))
    closed = next(i for i in infos if policy.closes(i))
    unlucky = next(
        k for k in (f"{closed.max_key}~{n}" for n in range(99)) if not policy.is_boundary(k)
    )
    open_ended = closed._replace(max_key=unlucky, entry_count=1, size_bytes=1)

    writer = store.writer()
    assert not writer.try_reuse(open_ended)
    assert writer.try_reuse(closed)
    assert not writer.try_reuse(closed), "keys must increase"
    added = closed.max_key + "~"
    writer.add_entries([entry(added)])
    assert writer.ranges_reused == 1
    written = store.ranges(writer.close())
    assert written[0] == closed
    assert [(r.min_key, r.max_key, r.entry_count) for r in written[1:]] == [(added, added, 1)]


# --- diff -------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", range(8))
def test_diff_matches_a_naive_dict_diff(objects: SpyStore, seed: int) -> None:
    rng = random.Random(seed)
    store = CommittedStore(objects, rng.choice(list(POLICIES.values())))
    left = random_entries(rng, rng.choice([0, 30, 300]))
    _, right = random_changes(rng, left, rng.choice([1, 10, 100]))
    if right and rng.random() < 0.5:  # same identity, new mtime: not a change
        right[0] = right[0]._replace(mtime=T0 - timedelta(days=1))
    left_id, right_id = store.write_metarange(left), store.write_metarange(right)

    assert list(store.diff(left_id, right_id)) == naive_diff(left, right)
    assert list(store.diff(right_id, left_id)) == naive_diff(right, left)
    assert list(store.diff(left_id, left_id)) == []


@pytest.mark.parametrize("seed", range(4))
def test_diff_of_changes_in_place_matches_a_naive_dict_diff(objects: SpyStore, seed: int) -> None:
    """Same paths on both sides: the diff compares rows directly instead of matching paths."""
    rng = random.Random(f"in-place-{seed}")
    store = CommittedStore(objects, POLICIES["hash"])
    left = random_entries(rng, 300)
    right = list(left)
    for i in rng.sample(range(len(right)), 40):
        if rng.random() < 0.3:  # same identity, new mtime: not a change
            right[i] = right[i]._replace(mtime=T0 - timedelta(days=1))
        else:
            right[i] = entry(right[i].path, rng.randrange(10**6))
    left_id, right_id = store.write_metarange(left), store.write_metarange(right)

    assert list(store.diff(left_id, right_id)) == naive_diff(left, right)
    assert list(store.diff(right_id, left_id)) == naive_diff(right, left)


@pytest.mark.parametrize("seed", range(4))
def test_diff_is_right_when_range_bounds_do_not_line_up(objects: SpyStore, seed: int) -> None:
    rng = random.Random(f"misaligned-{seed}")
    left = random_entries(rng, 300)
    _, right = random_changes(rng, left, 60)
    left_id = CommittedStore(objects, POLICIES["tiny"]).write_metarange(left)
    right_id = CommittedStore(objects, POLICIES["byte-cap"]).write_metarange(right)
    store = CommittedStore(objects, POLICIES["hash"])

    assert list(store.diff(left_id, right_id)) == naive_diff(left, right)
    assert list(store.diff(right_id, left_id)) == naive_diff(right, left)


def test_diff_skips_ranges_equal_on_both_sides(objects: SpyStore) -> None:
    entries = [entry(f"t/part-{i:06d}", i) for i in range(5_000)]
    policy = RangePolicy(target_entries=100, max_entries=10_000, max_bytes=10**9)
    store = CommittedStore(objects, policy)
    left_id = store.write_metarange(entries)
    changed = entries[4_000]._replace(checksum="other")
    right_id = store.apply(left_id, [(changed.path, changed)])
    store = fresh(objects, policy)

    assert list(store.diff(left_id, right_id)) == [Change(changed.path, "changed", changed)]
    assert objects.range_reads() == 2


def _span(low: str, high: str) -> RangeInfo:
    return RangeInfo(f"{low}-{high}", low, high, 1, 1)


@pytest.mark.parametrize(
    ("left", "right", "meet"),
    [
        ([("a", "c")], [("d", "f")], False),
        ([("a", "c")], [("c", "f")], True),
        ([("d", "f")], [("a", "d")], True),
        ([("a", "z")], [("m", "n")], True),
        ([("a", "b"), ("x", "z")], [("c", "w")], False),
        ([("a", "b"), ("m", "z")], [("c", "d"), ("e", "f"), ("y", "y")], True),
        ([], [("a", "z")], False),
    ],
)
def test_spans_meet_where_key_bounds_overlap(
    left: list[tuple[str, str]], right: list[tuple[str, str]], meet: bool
) -> None:
    spans = ([_span(*b) for b in left], [_span(*b) for b in right])
    assert spans_meet(*spans) is meet
    assert spans_meet(*reversed(spans)) is meet


def test_changed_ranges_bound_every_path_that_differs(objects: SpyStore) -> None:
    entries = [entry(f"t/part-{i:06d}", i) for i in range(2_000)]
    policy = RangePolicy(target_entries=100, max_entries=10_000, max_bytes=10**9)
    store = CommittedStore(objects, policy)
    left_id = store.write_metarange(entries)
    changes = [(entries[500].path, None), (entries[1_500].path, entries[1_500]._replace(size=1))]
    right_id = store.apply(left_id, changes)
    changed = changed_ranges(store.ranges(left_id), store.ranges(right_id))
    assert 0 < len(changed) < len(store.ranges(left_id))
    for change in store.diff(left_id, right_id):
        assert any(info.min_key <= change.path <= info.max_key for info in changed)
    assert spans_meet(changed, [_span("t/part-000500", "t/part-000500")])
    assert not spans_meet(changed, [_span("t/part-001100", "t/part-001300")])


# --- damage -----------------------------------------------------------------------------


def written(objects: SpyStore, policy: RangePolicy) -> tuple[str, list[RangeInfo]]:
    store = CommittedStore(objects, policy)
    metarange_id = store.write_metarange(random_entries(random.Random(11), 100))
    return metarange_id, store.ranges(metarange_id)


def test_missing_range_is_corrupted_data_naming_key_and_store(objects: SpyStore) -> None:
    metarange_id, infos = written(objects, POLICIES["hash"])
    key = range_key(infos[1].range_id)
    objects.delete([key])
    store = fresh(objects, POLICIES["hash"])

    with pytest.raises(CorruptedData) as raised:
        list(store.iterate(metarange_id))
    assert key in str(raised.value)
    assert objects.url in str(raised.value)
    with pytest.raises(CorruptedData, match="missing"):
        store.get(metarange_id, infos[1].min_key)


def test_unreadable_or_substituted_range_is_corrupted_data(objects: SpyStore) -> None:
    metarange_id, infos = written(objects, POLICIES["hash"])
    first, second = range_key(infos[0].range_id), range_key(infos[1].range_id)
    objects.put(first, b"PAR1 not really parquet")
    objects.put(second, objects.get(range_key(infos[2].range_id)))
    store = fresh(objects, POLICIES["hash"])

    with pytest.raises(CorruptedData, match=f"{first}.*cannot be decoded"):
        store.get(metarange_id, infos[0].min_key)
    with pytest.raises(CorruptedData, match=f"{second}.*does not match its id"):
        store.get(metarange_id, infos[1].min_key)


def test_missing_or_damaged_metarange_is_corrupted_data(objects: SpyStore) -> None:
    metarange_id, _ = written(objects, POLICIES["hash"])
    key = METARANGES_PREFIX + metarange_id
    objects.put(key, b"garbage")
    with pytest.raises(CorruptedData, match=key):
        fresh(objects, POLICIES["hash"]).ranges(metarange_id)
    objects.delete([key])
    with pytest.raises(CorruptedData, match="missing"):
        list(fresh(objects, POLICIES["hash"]).iterate(metarange_id))


def test_arguments_are_checked(objects: SpyStore) -> None:
    store = CommittedStore(objects)
    with pytest.raises(InvalidArgument, match="64 lowercase hex"):
        store.ranges("../../etc/passwd")
    with pytest.raises(InvalidArgument, match="target_entries"):
        RangePolicy(target_entries=0)
    with pytest.raises(InvalidArgument, match="cache_size"):
        CommittedStore(objects, cache_size=-1)
    with pytest.raises(InvalidArgument, match="size"):
        store.write_metarange([entry("a")._replace(size="big")])


@pytest.mark.parametrize("seed", range(6))
def test_diff_after_a_path_is_the_tail_of_the_whole_diff(objects: SpyStore, seed: int) -> None:
    """A page of a diff starts past `after` without changing what follows it."""
    rng = random.Random(f"after-{seed}")
    left = random_entries(rng, 300)
    _, right = random_changes(rng, left, rng.choice([5, 60]))
    left_id = CommittedStore(objects, POLICIES["tiny"]).write_metarange(left)
    right_id = CommittedStore(objects, rng.choice(list(POLICIES.values()))).write_metarange(right)
    store = CommittedStore(objects, POLICIES["hash"])
    whole = naive_diff(left, right)
    keys = sorted({e.path for e in left + right})
    for after in ["", rng.choice(keys), rng.choice(keys) + "~", keys[-1], "\uffff"]:
        expected = [change for change in whole if change.path > after]
        assert list(store.diff(left_id, right_id, after=after)) == expected
