"""One conformance suite for every KV driver, modelled on lakeFS's `kvtest`."""

from __future__ import annotations

from typing import Any

import pytest

from branchwater.engine.errors import InvalidArgument, NotFound, PredicateFailed
from branchwater.engine.kv import EXISTS, KeyValue, Store

P = b"partition"


def keys_of(store: Store, partition: bytes = P, **scan_args: Any) -> list[bytes]:
    return [pair.key for pair in store.scan(partition, **scan_args)]


def fill(store: Store, keys: list[bytes], partition: bytes = P) -> None:
    for key in keys:
        store.set(partition, key, b"value of " + key)


# --- set and get ---------------------------------------------------------------------------


def test_set_then_get_returns_value_and_predicate(store: Store) -> None:
    store.set(P, b"key", b"value")
    got = store.get(P, b"key")
    assert got.value == b"value"
    assert got == (b"value", b"value")


def test_set_overwrites(store: Store) -> None:
    store.set(P, b"key", b"first")
    store.set(P, b"key", b"second")
    assert store.get(P, b"key").value == b"second"


def test_same_key_in_two_partitions_is_two_entries(store: Store) -> None:
    store.set(b"p1", b"key", b"one")
    store.set(b"p2", b"key", b"two")
    assert store.get(b"p1", b"key").value == b"one"
    assert store.get(b"p2", b"key").value == b"two"


def test_get_missing_key_raises_not_found(store: Store) -> None:
    store.set(P, b"present", b"v")
    with pytest.raises(NotFound):
        store.get(P, b"absent")


def test_get_in_missing_partition_raises_not_found(store: Store) -> None:
    with pytest.raises(NotFound):
        store.get(b"no-such-partition", b"key")


def test_binary_keys_and_values_round_trip(store: Store) -> None:
    key, value = bytes(range(1, 256)), bytes(range(256)) * 4
    store.set(b"\x00\xff", key, value)
    assert store.get(b"\x00\xff", key).value == value


# --- set_if --------------------------------------------------------------------------------


def test_create_if_absent_succeeds(store: Store) -> None:
    store.set_if(P, b"key", b"created", None)
    assert store.get(P, b"key").value == b"created"


def test_create_if_absent_fails_when_present(store: Store) -> None:
    store.set(P, b"key", b"original")
    with pytest.raises(PredicateFailed):
        store.set_if(P, b"key", b"intruder", None)
    assert store.get(P, b"key").value == b"original"


@pytest.mark.parametrize("fence", [True, False], ids=["fence", "unfenced"])
def test_compare_and_swap_succeeds_with_fresh_predicate(store: Store, fence: bool) -> None:
    store.set(P, b"key", b"old")
    _, predicate = store.get(P, b"key")
    store.set_if(P, b"key", b"new", predicate, fence=fence)
    assert store.get(P, b"key").value == b"new"


def test_compare_and_swap_to_same_value_succeeds(store: Store) -> None:
    store.set(P, b"key", b"same")
    store.set_if(P, b"key", b"same", store.get(P, b"key").predicate)
    assert store.get(P, b"key").value == b"same"


@pytest.mark.parametrize("fence", [True, False], ids=["fence", "unfenced"])
def test_stale_predicate_fails_and_keeps_value(store: Store, fence: bool) -> None:
    store.set(P, b"key", b"v1")
    _, stale = store.get(P, b"key")
    store.set(P, b"key", b"v2")
    with pytest.raises(PredicateFailed):
        store.set_if(P, b"key", b"v3", stale, fence=fence)
    assert store.get(P, b"key").value == b"v2"


def test_delete_if_removes_only_the_value_read(store: Store) -> None:
    store.set(P, b"key", b"v1")
    _, read = store.get(P, b"key")
    store.set(P, b"key", b"v2")
    with pytest.raises(PredicateFailed):
        store.delete_if(P, b"key", read)
    assert store.get(P, b"key").value == b"v2"
    store.delete_if(P, b"key", store.get(P, b"key").predicate)
    with pytest.raises(NotFound):
        store.get(P, b"key")
    with pytest.raises(PredicateFailed):
        store.delete_if(P, b"key", b"v2")


@pytest.mark.parametrize("fence", [True, False], ids=["fence", "unfenced"])
def test_compare_and_swap_on_absent_key_fails(store: Store, fence: bool) -> None:
    with pytest.raises(PredicateFailed):
        store.set_if(P, b"key", b"new", b"imagined", fence=fence)
    with pytest.raises(NotFound):
        store.get(P, b"key")


def test_exists_predicate_succeeds_on_present_key(store: Store) -> None:
    store.set(P, b"key", b"old")
    store.set_if(P, b"key", b"new", EXISTS)
    assert store.get(P, b"key").value == b"new"


def test_exists_predicate_fails_on_absent_key(store: Store) -> None:
    with pytest.raises(PredicateFailed):
        store.set_if(P, b"key", b"new", EXISTS)
    with pytest.raises(NotFound):
        store.get(P, b"key")


def test_second_create_loses(store: Store) -> None:
    store.set_if(P, b"key", b"first", None)
    with pytest.raises(PredicateFailed):
        store.set_if(P, b"key", b"second", None)
    assert store.get(P, b"key").value == b"first"


# --- set_guarded ---------------------------------------------------------------------------


def test_set_guarded_writes_and_returns_what_the_guard_holds(store: Store) -> None:
    store.set(b"refs", b"branch", b"token-1")
    assert store.set_guarded(P, b"key", b"v1", (b"refs", b"branch")) == b"token-1"
    store.set_if(b"refs", b"branch", b"token-2", b"token-1")
    assert store.set_guarded(P, b"key", b"v2", (b"refs", b"branch")) == b"token-2"
    assert store.get(P, b"key").value == b"v2"
    assert store.set_guarded(P, b"empty", b"", (b"refs", b"branch")) == b"token-2"
    assert store.get(P, b"empty").value == b""


def test_set_guarded_by_a_missing_guard_is_not_found(store: Store) -> None:
    with pytest.raises(NotFound):
        store.set_guarded(P, b"key", b"v", (b"refs", b"gone"))


@pytest.mark.parametrize(
    "guard", [(b"refs", "branch"), ("refs", b"branch"), (b"", b"branch")], ids=repr
)
def test_set_guarded_rejects_a_bad_guard_and_writes_nothing(store: Store, guard: Any) -> None:
    store.set(b"refs", b"branch", b"token")
    with pytest.raises(InvalidArgument):
        store.set_guarded(P, b"key", b"v", guard)
    with pytest.raises(InvalidArgument):
        store.set_guarded(P, b"key", "v", (b"refs", b"branch"))  # type: ignore[arg-type]
    assert keys_of(store) == []


def test_delete_guarded_removes_only_while_the_guard_holds(store: Store) -> None:
    store.set(b"refs", b"branch", b"token-1")
    store.set(P, b"key", b"v")
    store.set(P, b"other", b"w")
    assert not store.delete_guarded(P, b"key", (b"refs", b"branch"), b"token-0")
    assert store.get(P, b"key").value == b"v"
    assert store.delete_guarded(P, b"key", (b"refs", b"branch"), b"token-1")
    assert keys_of(store) == [b"other"]
    assert store.delete_guarded(P, b"key", (b"refs", b"branch"), b"token-1")
    store.set_if(b"refs", b"branch", b"token-2", b"token-1")
    assert not store.delete_guarded(P, b"other", (b"refs", b"branch"), b"token-1")
    assert not store.delete_guarded(P, b"absent", (b"refs", b"branch"), b"token-1")
    assert not store.delete_guarded(P, b"other", (b"refs", b"gone"), b"token-2")
    assert keys_of(store) == [b"other"]
    assert store.get(b"refs", b"branch").value == b"token-2"


def test_create_guarded_writes_only_a_missing_or_empty_key_while_the_guard_holds(
    store: Store,
) -> None:
    store.set(b"refs", b"branch", b"token-1")
    store.set(P, b"taken", b"v")
    store.set(P, b"tombstone", b"")
    guard = (b"refs", b"branch")
    assert store.create_guarded(P, b"new", b"n", guard, b"token-1")
    assert store.create_guarded(P, b"tombstone", b"t", guard, b"token-1")
    assert not store.create_guarded(P, b"taken", b"x", guard, b"token-1")
    assert not store.create_guarded(P, b"new", b"again", guard, b"token-1")
    with pytest.raises(PredicateFailed):
        store.create_guarded(P, b"other", b"o", guard, b"token-0")
    with pytest.raises(PredicateFailed):
        store.create_guarded(P, b"other", b"o", (b"refs", b"gone"), b"token-1")
    store.set_if(b"refs", b"branch", b"token-2", b"token-1")
    with pytest.raises(PredicateFailed):
        store.create_guarded(P, b"taken", b"x", guard, b"token-1")
    assert dict(store.scan(P)) == {b"new": b"n", b"taken": b"v", b"tombstone": b"t"}
    assert store.get(b"refs", b"branch").value == b"token-2"


# --- empty values --------------------------------------------------------------------------


def test_empty_value_is_stored_and_distinct_from_absent(store: Store) -> None:
    store.set(P, b"key", b"")
    assert store.get(P, b"key") == (b"", b"")
    with pytest.raises(PredicateFailed):
        store.set_if(P, b"key", b"x", None)


def test_empty_value_predicate_works_in_set_if(store: Store) -> None:
    store.set_if(P, b"key", b"", None)
    _, predicate = store.get(P, b"key")
    store.set_if(P, b"key", b"filled", predicate)
    assert store.get(P, b"key").value == b"filled"
    with pytest.raises(PredicateFailed):
        store.set_if(P, b"key", b"again", b"")
    store.set_if(P, b"key", b"", b"filled")
    assert store.get(P, b"key").value == b""


# --- delete --------------------------------------------------------------------------------


def test_delete_present_key(store: Store) -> None:
    store.set(P, b"key", b"v")
    store.set(P, b"other", b"w")
    store.delete(P, b"key")
    with pytest.raises(NotFound):
        store.get(P, b"key")
    assert store.get(P, b"other").value == b"w"


def test_delete_missing_key_is_not_an_error(store: Store) -> None:
    store.delete(P, b"never-set")
    store.delete(b"never-used-partition", b"key")
    with pytest.raises(NotFound):
        store.get(P, b"never-set")


def test_deleted_key_can_be_created_again(store: Store) -> None:
    store.set(P, b"key", b"v")
    store.delete(P, b"key")
    store.set_if(P, b"key", b"reborn", None)
    assert store.get(P, b"key").value == b"reborn"


# --- scan ----------------------------------------------------------------------------------

ODD_KEYS = [b"b", b"\xff", b"a\x00", b"\x00", b"a", b"\x01\xff", b"ab", b"\x7f"]


def test_scan_is_ascending_byte_order(store: Store) -> None:
    fill(store, ODD_KEYS)
    expected = [b"\x00", b"\x01\xff", b"a", b"a\x00", b"ab", b"b", b"\x7f", b"\xff"]
    assert expected == sorted(ODD_KEYS)
    assert keys_of(store) == expected


def test_scan_yields_key_value_pairs(store: Store) -> None:
    fill(store, [b"k1", b"k2"])
    assert list(store.scan(P)) == [
        KeyValue(b"k1", b"value of k1"),
        KeyValue(b"k2", b"value of k2"),
    ]


def test_scan_of_missing_partition_is_empty(store: Store) -> None:
    fill(store, [b"a"])
    assert list(store.scan(b"nothing-here")) == []


def test_scan_from_start_key_is_inclusive(store: Store) -> None:
    fill(store, ODD_KEYS)
    assert keys_of(store, start=b"a") == [b"a", b"a\x00", b"ab", b"b", b"\x7f", b"\xff"]


def test_scan_from_absent_start_key_begins_after_it(store: Store) -> None:
    fill(store, ODD_KEYS)
    assert keys_of(store, start=b"a\x01") == [b"ab", b"b", b"\x7f", b"\xff"]
    assert keys_of(store, start=b"\xff\x00") == []


def test_scan_is_isolated_between_partitions(store: Store) -> None:
    fill(store, [b"a", b"b"], partition=b"p")
    fill(store, [b"c", b"d"], partition=b"p1")
    fill(store, [b"e"], partition=b"o")
    fill(store, [b"f"], partition=b"q")
    assert keys_of(store, b"p") == [b"a", b"b"]
    assert keys_of(store, b"p1") == [b"c", b"d"]
    assert keys_of(store, b"p", start=b"b") == [b"b"]


@pytest.mark.parametrize(("count", "batch_size"), [(10, 3), (9, 3), (10, 10), (10, 1), (3, 5)])
def test_scan_crosses_batch_boundaries(store: Store, count: int, batch_size: int) -> None:
    keys = [b"key-%02d" % i for i in range(count)]
    fill(store, keys[::-1])
    assert keys_of(store, batch_size=batch_size) == keys


def test_scan_from_start_with_small_batches(store: Store) -> None:
    keys = [b"key-%02d" % i for i in range(10)]
    fill(store, keys)
    assert keys_of(store, start=b"key-04", batch_size=2) == keys[4:]


@pytest.mark.parametrize(("count", "batch_size"), [(10, 3), (9, 3), (10, 10), (3, 5)])
def test_scan_batches_are_the_scan_in_lists_of_at_most_batch_size(
    store: Store, count: int, batch_size: int
) -> None:
    keys = [b"key-%02d" % i for i in range(count)]
    fill(store, keys[::-1])
    batches = list(store.scan_batches(P, b"key-01", batch_size))
    assert all(1 <= len(batch) <= batch_size for batch in batches)
    pairs = [tuple(pair) for batch in batches for pair in batch]
    assert pairs == [tuple(pair) for pair in store.scan(P, b"key-01")]
    assert [key for key, _ in pairs] == keys[1:]
    assert list(store.scan_batches(b"no-such-partition")) == []


def test_delete_while_iterating_visits_each_key_once(store: Store) -> None:
    keys = [b"key-%02d" % i for i in range(10)]
    fill(store, keys)
    seen = []
    for pair in store.scan(P, batch_size=3):
        seen.append(pair.key)
        store.delete(P, pair.key)
    assert seen == keys
    assert keys_of(store) == []


# --- argument checks -----------------------------------------------------------------------


@pytest.mark.parametrize(("partition", "key"), [(b"", b"k"), (b"p", b""), (b"", b"")])
def test_empty_partition_or_key_is_rejected(store: Store, partition: bytes, key: bytes) -> None:
    with pytest.raises(InvalidArgument):
        store.set(partition, key, b"v")
    with pytest.raises(InvalidArgument):
        store.get(partition, key)
    with pytest.raises(InvalidArgument):
        store.set_if(partition, key, b"v", None)
    with pytest.raises(InvalidArgument):
        store.delete(partition, key)


def test_empty_partition_scan_is_rejected(store: Store) -> None:
    with pytest.raises(InvalidArgument):
        list(store.scan(b""))


@pytest.mark.parametrize(
    ("partition", "key", "value"),
    [("p", b"k", b"v"), (b"p", "k", b"v"), (b"p", b"k", "v"), (b"p", b"k", None)],
    ids=["str-partition", "str-key", "str-value", "none-value"],
)
def test_non_bytes_arguments_are_rejected(
    store: Store, partition: Any, key: Any, value: Any
) -> None:
    with pytest.raises(InvalidArgument):
        store.set(partition, key, value)
    with pytest.raises(InvalidArgument):
        store.set_if(partition, key, value, None)
    assert keys_of(store, b"p") == []


def test_str_arguments_to_get_delete_scan_are_rejected(store: Store) -> None:
    with pytest.raises(InvalidArgument):
        store.get("p", b"k")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        store.delete(b"p", "k")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        store.scan("p")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        store.scan(b"p", start="a")  # type: ignore[arg-type]


@pytest.mark.parametrize("batch_size", [0, -1, 1.5, "10", None, True])
def test_bad_batch_size_is_rejected(store: Store, batch_size: Any) -> None:
    with pytest.raises(InvalidArgument):
        store.scan(P, batch_size=batch_size)
    with pytest.raises(InvalidArgument):
        store.scan_batches(P, batch_size=batch_size)


@pytest.mark.parametrize("predicate", ["old", 1, True, bytearray(b"old")], ids=repr)
def test_bad_predicate_type_is_rejected_and_nothing_written(store: Store, predicate: Any) -> None:
    store.set(P, b"key", b"old")
    with pytest.raises(InvalidArgument):
        store.set_if(P, b"key", b"new", predicate)
    assert store.get(P, b"key").value == b"old"


def test_drop_partition_removes_every_key_and_only_those(store: Store, monkeypatch) -> None:
    monkeypatch.setattr(store, "drop_chunk", 3, raising=False)
    for i in range(10):
        store.set(b"p", b"k%02d" % i, b"v")
    store.set(b"p1", b"k", b"kept")
    store.set(b"q", b"k", b"kept")
    store.drop_partition(b"p")
    assert list(store.scan(b"p")) == []
    assert store.get(b"p1", b"k").value == b"kept"
    assert store.get(b"q", b"k").value == b"kept"
    store.drop_partition(b"never-written")
