"""The committed layer: immutable ranges and metaranges in the repository's object store.

`CommittedStore` writes sorted entries as content-defined ranges (`ranges.py` holds the
format), reads them lazily by key bounds, applies sorted changes to a metarange, and diffs
two metaranges. Apply and diff work range by range: a range whose id is known to be
unaffected is referenced or skipped without being read, so their cost follows the size of
the change, not of the repository. A three-way merge can be built the same way from
`ranges()`, `range_entries()` and a `MetarangeWriter` (`try_reuse` for untouched ranges).
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Generic, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from branchwater.engine.errors import CorruptedData, InvalidArgument, NotFound
from branchwater.engine.graveler import ranges as fmt
from branchwater.engine.graveler.model import Change, Entry
from branchwater.engine.graveler.ranges import EMPTY_METARANGE_ID, RangeInfo, RangePolicy
from branchwater.engine.objects import ObjectStore

__all__ = [
    "EMPTY_METARANGE_ID",
    "CommittedStore",
    "MetarangeWriter",
    "RangeInfo",
    "RangePolicy",
]

ChangeItem = tuple[str, Entry | None]
"""A change to apply: the path and its new entry, or `None` to delete it."""

K = TypeVar("K")
V = TypeVar("V")


class _LRU(Generic[K, V]):
    """A bounded, thread-safe LRU map: a `CommittedStore` is shared by a process's threads."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise InvalidArgument(f"cache_size must be >= 0, not {capacity}")
        self._capacity = capacity
        self._items: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: K) -> V | None:
        with self._lock:
            value = self._items.get(key)
            if value is not None:
                self._items.move_to_end(key)
            return value

    def put(self, key: K, value: V) -> None:
        if not self._capacity:
            return
        with self._lock:
            self._items[key] = value
            self._items.move_to_end(key)
            while len(self._items) > self._capacity:
                self._items.popitem(last=False)


class MetarangeWriter:
    """Streams sorted entries (and reusable ranges) into ranges, then one metarange.

    Holds at most one range's entries. `try_reuse` appends an existing range by id when the
    result is exactly what writing its entries would give: nothing pending, keys in order, and
    the range ends where the policy would end it. A writer that raised must be discarded.
    """

    def __init__(self, store: CommittedStore) -> None:
        self._store = store
        self._policy = store.policy
        self._rows: list[RangeInfo] = []
        self._pending: list[Entry] = []
        self._texts: list[str] = []
        self._size = 0
        self._last = ""
        self._closed = False
        self._final = False
        self.ranges_written = 0
        """Ranges this writer stored (a range already in storage is not stored again)."""
        self.ranges_reused = 0
        """Ranges appended by id, without being read or rebuilt."""

    @property
    def pending_empty(self) -> bool:
        """True at a range boundary: the next entry or reused range starts a new range."""
        return not self._pending

    def add(self, entry: Entry) -> None:
        self.add_entries((entry,))

    def add_entries(self, entries: Iterable[Entry]) -> None:
        """Append entries in strictly increasing path order, closing ranges where the policy
        says. This loop is the write path's per-entry cost, so it keeps to locals."""
        self._check_open()
        policy = self._policy
        max_entries, max_bytes = policy.max_entries, policy.max_bytes
        is_boundary, metadata_json = policy.is_boundary, fmt.metadata_json
        pending, texts = self._pending, self._texts
        size, last = self._size, self._last
        try:
            for entry in entries:
                path = entry[0]
                if not path > last:
                    raise _order_error(path, last)
                last = path
                text = metadata_json(entry[5])
                pending.append(entry)
                texts.append(text)
                size += len(path) + len(entry[1]) + len(entry[3]) + len(text) + fmt.ENTRY_OVERHEAD
                if len(pending) >= max_entries or size >= max_bytes or is_boundary(path):
                    self._flush(size)
                    size = 0
        finally:
            self._size, self._last = size, last

    def try_reuse(self, info: RangeInfo, *, final: bool = False) -> bool:
        """Append an existing range by id if that equals writing its entries; else False and
        the caller must add the range's entries instead.

        `final` promises nothing follows: then a range need not end on a policy boundary
        (the last range of a metarange usually does not), because input ending there cuts it
        just the same. The writer refuses anything added after a final range.
        """
        self._check_open()
        if self._pending or info.min_key <= self._last:
            return False
        if not final and not self._policy.closes(info):
            return False
        self._rows.append(info)
        self._last = info.max_key
        self._final = final
        self.ranges_reused += 1
        return True

    def close(self) -> str:
        """Store the last range and the metarange; return the metarange id."""
        if self._closed:
            raise InvalidArgument("this MetarangeWriter is closed already")
        if self._pending:
            self._flush(self._size)
            self._size = 0
        self._closed = True
        return self._store._put_metarange(self._rows)

    def _flush(self, size: int) -> None:
        table = fmt.build_range(self._pending, self._texts)
        range_id, written = self._store._put_range(table)
        self.ranges_written += written
        first, last = self._pending[0].path, self._pending[-1].path
        self._rows.append(RangeInfo(range_id, first, last, len(self._pending), size))
        self._pending.clear()
        self._texts.clear()

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidArgument("this MetarangeWriter is closed; start a new one")
        if self._final:
            raise InvalidArgument("nothing can follow a range reused as final")


def _order_error(path: str, last: str) -> InvalidArgument:
    if not isinstance(path, str) or not path:
        return InvalidArgument(f"entry path must be a non-empty string, not {path!r}")
    return InvalidArgument(f"entries must be sorted by path, no repeats: {path!r} after {last!r}")


class _RangeCursor:
    """One side of a range-aware walk: ranges not yet opened, then the open range's entries.

    Callers look at `next_range()` first and either `skip()` it (reuse by id, or equal on
    both sides) or `open()` it; only opening reads storage.
    """

    def __init__(self, infos: Sequence[RangeInfo], load: Callable[[str], list[Entry]]) -> None:
        self._infos = deque(infos)
        self._load = load
        self._entries: list[Entry] = []
        self._pos = 0

    @property
    def buffered(self) -> bool:
        return self._pos < len(self._entries)

    def next_range(self) -> RangeInfo | None:
        """The next range, if the open one is used up and one is left."""
        return self._infos[0] if not self.buffered and self._infos else None

    def ranges_left(self) -> int:
        """Ranges not opened yet."""
        return len(self._infos)

    def head(self) -> str | None:
        """The smallest key left on this side (read or not), or None when exhausted."""
        if self.buffered:
            return self._entries[self._pos].path
        return self._infos[0].min_key if self._infos else None

    def skip(self) -> RangeInfo:
        return self._infos.popleft()

    def open(self) -> None:
        self._entries = self._load(self._infos.popleft().range_id)
        self._pos = 0

    def peek(self) -> Entry:
        return self._entries[self._pos]

    def take(self) -> Entry:
        self._pos += 1
        return self._entries[self._pos - 1]

    def take_before(self, key: str | None) -> list[Entry]:
        """The open range's entries with paths below `key` (all if None), in one slice."""
        end = len(self._entries)
        if key is not None:
            end = bisect.bisect_left(self._entries, key, lo=self._pos, key=_path)
        taken, self._pos = self._entries[self._pos : end], end
        return taken


def _path(entry: Entry) -> str:
    return entry.path


class _SortedChanges:
    """A peekable stream of changes that refuses unsorted input instead of corrupting ranges."""

    def __init__(self, changes: Iterable[ChangeItem]) -> None:
        self._changes = iter(changes)
        self._last = ""
        self._head: ChangeItem | None = None
        self._advance()

    def peek(self) -> ChangeItem | None:
        return self._head

    def pop(self) -> ChangeItem:
        head = self._head
        assert head is not None
        self._advance()
        return head

    def _advance(self) -> None:
        change = next(self._changes, None)
        if change is not None:
            path, entry = change
            if not path > self._last:
                raise _order_error(path, self._last)
            if entry is not None and entry.path != path:
                raise InvalidArgument(f"change for {path!r} carries an entry for {entry.path!r}")
            self._last = path
        self._head = change


class CommittedStore:
    """Ranges and metaranges of one storage namespace, with a bounded cache of decoded ones.

    Ranges are cached as Arrow tables (compact) and decoded to entries on use; metaranges as
    their rows. Every id read is verified against its content, so a damaged or missing object
    surfaces as `CorruptedData` naming its key, never as wrong data.
    """

    def __init__(
        self, objects: ObjectStore, policy: RangePolicy | None = None, cache_size: int = 64
    ) -> None:
        self.objects = objects
        self.policy = policy or RangePolicy()
        self._range_cache: _LRU[str, pa.Table] = _LRU(cache_size)
        self._metarange_cache: _LRU[str, tuple[RangeInfo, ...]] = _LRU(cache_size)

    # --- writing ---------------------------------------------------------------------------

    def writer(self) -> MetarangeWriter:
        return MetarangeWriter(self)

    def write_metarange(self, entries: Iterable[Entry]) -> str:
        """Write entries sorted by path (streamed: one range in memory) and return the id."""
        writer = self.writer()
        writer.add_entries(entries)
        return writer.close()

    def empty_metarange(self) -> str:
        """Store the metarange with no ranges (so tools reading storage find it); its id."""
        return self._put_metarange(())

    def apply(self, base_metarange_id: str, changes: Iterable[ChangeItem]) -> str:
        """Apply changes sorted by path (`None` deletes; deleting an absent path is a no-op)
        to a metarange, and return the resulting metarange's id.

        The result is identical to writing all resulting entries from scratch. A base range
        that no change falls into and that starts on a range boundary of the output is
        referenced by id, neither read nor written: content-defined boundaries bring the
        output back in step with the base ranges shortly after each change.
        """
        base = _RangeCursor(self._metarange(base_metarange_id), self.range_entries)
        return self._apply(base, _SortedChanges(changes), self.writer())

    @staticmethod
    def _apply(base: _RangeCursor, changes: _SortedChanges, writer: MetarangeWriter) -> str:
        while True:
            change = changes.peek()
            if base.buffered:
                writer.add_entries(base.take_before(None if change is None else change[0]))
                if change is not None and base.buffered:
                    if base.peek().path == change[0]:
                        base.take()
                    _write_change(writer, changes.pop())
                continue
            info = base.next_range()
            if info is None:
                if change is None:
                    return writer.close()
                _write_change(writer, changes.pop())
            elif change is not None and change[0] < info.min_key:
                _write_change(writer, changes.pop())
            elif (change is None or change[0] > info.max_key) and writer.try_reuse(
                info, final=change is None and base.ranges_left() == 1
            ):
                base.skip()
            else:
                base.open()

    # --- reading ---------------------------------------------------------------------------

    def ranges(self, metarange_id: str) -> list[RangeInfo]:
        """The metarange's ranges in key order: what range-level diff and merge work on."""
        return list(self._metarange(metarange_id))

    def range_entries(self, range_id: str) -> list[Entry]:
        """All entries of one range, decoded."""
        return fmt.decode_entries(self._range_table(range_id))

    def iterate(self, metarange_id: str, after: str = "", prefix: str = "") -> Iterator[Entry]:
        """Entries with path > `after` starting with `prefix`, in path order.

        Lazy: a range is opened only when the iteration reaches it, and ranges whose bounds
        cannot hold a wanted key are never opened.
        """
        infos = self._metarange(metarange_id)
        return self._iterate(infos, after, prefix)

    def _iterate(self, infos: Sequence[RangeInfo], after: str, prefix: str) -> Iterator[Entry]:
        for info in infos:
            if info.max_key <= after or info.max_key < prefix:
                continue
            if info.min_key > prefix and not info.min_key.startswith(prefix):
                return
            table = self._range_table(info.range_id)
            paths = table.column("path")
            below_prefix = _count_below(paths, prefix)
            start = max(_count_below(paths, after, inclusive=True), below_prefix)
            stop = below_prefix + _count_prefixed(paths, prefix) if prefix else len(paths)
            yield from fmt.decode_entries(table, start, stop)
            if stop < len(paths):
                return

    def get(self, metarange_id: str, path: str) -> Entry:
        """The entry at `path`; `NotFound` if absent. Opens at most the one range whose
        bounds contain the path."""
        infos = self._metarange(metarange_id)
        index = bisect.bisect_left(infos, path, key=_max_key)
        if index < len(infos) and infos[index].min_key <= path:
            table = self._range_table(infos[index].range_id)
            row = _count_below(table.column("path"), path)
            if row < table.num_rows and table.column("path")[row].as_py() == path:
                return fmt.decode_entries(table, row, row + 1)[0]
        raise NotFound(f"path {path!r} not found in metarange {metarange_id}")

    def diff(self, left_id: str, right_id: str) -> Iterator[Change]:
        """Changes from left to right, sorted by path: "added" (right only), "removed" (left
        only; the left entry), "changed" (identities differ; the right entry).

        Ranges with the same id on both sides are skipped without reading; only ranges that
        differ are compared key by key.
        """
        left = _RangeCursor(self._metarange(left_id), self.range_entries)
        right = _RangeCursor(self._metarange(right_id), self.range_entries)
        return _diff(left, right)

    # --- storage ---------------------------------------------------------------------------

    def _put_range(self, table: pa.Table) -> tuple[str, bool]:
        """Store a range unless its id is stored already; return (id, whether written)."""
        range_id = fmt.range_id(table)
        key = fmt.range_key(range_id)
        if self.objects.exists(key):
            return range_id, False
        self.objects.put(key, fmt.range_to_parquet(table))
        return range_id, True

    def _put_metarange(self, rows: Sequence[RangeInfo]) -> str:
        metarange_id = fmt.metarange_id(rows)
        key = fmt.metarange_key(metarange_id)
        if not self.objects.exists(key):
            self.objects.put(key, fmt.metarange_to_parquet(rows))
        self._metarange_cache.put(metarange_id, tuple(rows))
        return metarange_id

    def _metarange(self, metarange_id: str) -> tuple[RangeInfo, ...]:
        fmt.check_id("metarange", metarange_id)
        if metarange_id == EMPTY_METARANGE_ID:
            return ()
        rows = self._metarange_cache.get(metarange_id)
        if rows is None:
            key = fmt.metarange_key(metarange_id)
            table = self._decode(key, fmt.METARANGE_SCHEMA)
            rows = tuple(fmt.decode_metarange(table))
            if fmt.metarange_id(rows) != metarange_id:
                raise self._corrupted(key, "its content does not match its id")
            self._metarange_cache.put(metarange_id, rows)
        return rows

    def _range_table(self, range_id: str) -> pa.Table:
        table = self._range_cache.get(range_id)
        if table is None:
            key = fmt.range_key(fmt.check_id("range", range_id))
            table = self._decode(key, fmt.RANGE_SCHEMA)
            if fmt.range_id(table) != range_id:
                raise self._corrupted(key, "its content does not match its id")
            self._range_cache.put(range_id, table)
        return table

    def _decode(self, key: str, schema: pa.Schema) -> pa.Table:
        try:
            data = self.objects.get(key)
        except NotFound:
            raise self._corrupted(
                key, "it is missing, yet a metarange or commit refers to it"
            ) from None
        try:
            return fmt.read_parquet(data, schema)
        except (pa.ArrowException, ValueError, OSError) as exc:
            raise self._corrupted(key, f"it cannot be decoded ({exc})") from exc

    def _corrupted(self, key: str, reason: str) -> CorruptedData:
        return CorruptedData(f"committed object {key!r} in {self.objects.url}: {reason}")


def _write_change(writer: MetarangeWriter, change: ChangeItem) -> None:
    if change[1] is not None:
        writer.add(change[1])


def _diff(left: _RangeCursor, right: _RangeCursor) -> Iterator[Change]:
    """Merge-walk two cursors. Both at a range start with equal ids: skip both unread.
    A side's next range is opened only once its lower bound is not above the other head."""
    while True:
        left_range, right_range = left.next_range(), right.next_range()
        if left_range and right_range and left_range.range_id == right_range.range_id:
            left.skip()
            right.skip()
            continue
        left_key, right_key = left.head(), right.head()
        if left_key is None and right_key is None:
            return
        if left_range and (right_key is None or left_range.min_key <= right_key):
            left.open()
        elif right_range and (left_key is None or right_range.min_key <= left_key):
            right.open()
        elif right_key is None or (left_key is not None and left_key < right_key):
            removed = left.take()
            yield Change(removed.path, "removed", removed)
        elif left_key is None or right_key < left_key:
            added = right.take()
            yield Change(added.path, "added", added)
        else:
            old, new = left.take(), right.take()
            if old.identity() != new.identity():
                yield Change(new.path, "changed", new)


def _count_below(paths: pa.Array, key: str, inclusive: bool = False) -> int:
    """How many of the sorted paths are < `key` (<= if inclusive): the index a binary search
    would find, computed in one vectorised pass."""
    if not key:
        return 0
    compare = pc.less_equal if inclusive else pc.less
    return pc.sum(compare(paths, pa.scalar(key, pa.string()))).as_py() or 0


def _count_prefixed(paths: pa.Array, prefix: str) -> int:
    return pc.sum(pc.starts_with(paths, pattern=prefix)).as_py() or 0


def _max_key(info: RangeInfo) -> str:
    return info.max_key
