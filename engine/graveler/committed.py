"""The committed layer: immutable ranges and metaranges in the repository's object store.

`CommittedStore` writes sorted entries as content-defined ranges (`ranges.py` holds the
format), reads them lazily by key bounds, applies sorted changes to a metarange, and diffs
two metaranges. Apply and diff work range by range: a range whose id is known to be
unaffected is referenced or skipped without being read, so their cost follows the size of
the change, not of the repository. A three-way merge can be built the same way from
`ranges()` (compare range ids), `range_table()` / `range_entries()` and a `MetarangeWriter`
(`try_reuse` for untouched ranges, `add_changed_range` for a rewritten one).
"""

from __future__ import annotations

import bisect
import functools
import operator
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Generic, TypeVar

import pyarrow as pa
import pyarrow.compute as pc

from branchwater.engine.errors import CorruptedData, InvalidArgument, NotFound
from branchwater.engine.graveler import ranges as fmt
from branchwater.engine.graveler.model import Change, ChangeType, Entry
from branchwater.engine.graveler.range_cache import RangeCache
from branchwater.engine.graveler.ranges import EMPTY_METARANGE_ID, RangeInfo, RangePolicy
from branchwater.engine.objects import ObjectStore

__all__ = [
    "EMPTY_METARANGE_ID",
    "CommittedStore",
    "MetarangeWriter",
    "RangeInfo",
    "RangePolicy",
    "Replacements",
]

_DECODE_CHUNK = 1024
"""Rows decoded at a time while iterating: a first page never pays for a whole range."""

_SEARCHED_PATHS = 16
"""Up to this many lookups in one range binary-search; more scan it once with a set."""

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


_BATCH = 8192
"""Entries converted to Arrow at once: enough to amortise a conversion, far below a range."""


class MetarangeWriter:
    """Streams sorted rows (and reusable ranges) into ranges, then one metarange.

    Pending rows are Arrow slices, at most one range of them. Rows come from entries
    (`add_entries`), from a stored range with changes applied (`add_changed_range`), or whole
    ranges by id (`try_reuse`); whatever the mix, the ranges are those a from-scratch write
    of the same entries gives. A writer that raised must be discarded.
    """

    def __init__(self, store: CommittedStore) -> None:
        self._store = store
        self._policy = store.policy
        self._rows: list[RangeInfo] = []
        self._chunks: list[pa.Table] = []
        self._count = 0
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
        """True at a range boundary: the next row or reused range starts a new range."""
        return not self._count

    def add(self, entry: Entry) -> None:
        self.add_entries((entry,))

    def add_entries(self, entries: Iterable[Entry]) -> None:
        """Append entries in strictly increasing path order, a batch at a time."""
        self._check_open()
        iterator = iter(entries)
        while batch := list(islice(iterator, _BATCH)):
            paths = [entry[0] for entry in batch]
            _check_increasing(paths)
            hits = fmt.boundary_indexes(paths, self._policy.target_entries)
            self._add_rows(fmt.build_range(batch), hits)

    def add_changed_range(self, table: pa.Table, changes: Sequence[ChangeItem]) -> None:
        """Append a range stored under this policy with sorted `changes` inside its bounds
        applied (`None` deletes), in one vectorised pass: a rewrite costs about the same
        for one change as for thousands.

        No row of a stored range but its last can satisfy the hash rule (it would have ended
        the range), so only that one and the new entries are hashed.
        """
        self._check_open()
        touched = pa.array([path for path, _ in changes], pa.string())
        kept = table.filter(pc.invert(pc.is_in(table.column("path"), value_set=touched)))
        added = [entry for _, entry in changes if entry is not None]
        if not kept.num_rows and not added:
            return
        flags = [False] * (kept.num_rows + len(added))
        if kept.num_rows and self._ends_range(table, kept):
            flags[kept.num_rows - 1] = True
        new_paths = [entry.path for entry in added]
        for hit in fmt.boundary_indexes(new_paths, self._policy.target_entries):
            flags[kept.num_rows + hit] = True
        new_rows = fmt.build_range(added) if added else fmt.EMPTY_RANGE
        rows = pa.concat_tables([kept, new_rows]).append_column("hit", pa.array(flags, pa.bool_()))
        rows = rows.take(pc.sort_indices(rows.column("path")))
        hits = pc.indices_nonzero(rows.column("hit")).to_pylist()
        self._add_rows(rows.drop_columns(["hit"]), hits)

    def _ends_range(self, table: pa.Table, kept: pa.Table) -> bool:
        """Whether the stored range's last row survived and satisfies the hash rule."""
        last = _path_at(table, table.num_rows - 1)
        return _path_at(kept, kept.num_rows - 1) == last and self._policy.is_boundary(last)

    def can_reuse(self, info: RangeInfo, *, final: bool = False) -> bool:
        """Whether `try_reuse(info, final=final)` would append the range."""
        self._check_open()
        if self._count or info.min_key <= self._last:
            return False
        return final or self._policy.closes(info)

    def try_reuse(self, info: RangeInfo, *, final: bool = False) -> bool:
        """Append an existing range by id if that equals writing its entries; else False and
        the caller must add the range's rows instead.

        `final` promises nothing follows: then a range need not end on a policy boundary
        (the last range of a metarange usually does not), because input ending there cuts it
        just the same. The writer refuses anything added after a final range.
        """
        if not self.can_reuse(info, final=final):
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
        if self._count:
            self._flush()
        self._closed = True
        return self._store._put_metarange(self._rows)

    def _add_rows(self, table: pa.Table, hits: Sequence[int]) -> None:
        """Append sorted rows; `hits` are the row indexes that satisfy the hash rule."""
        first = _path_at(table, 0)
        if not first > self._last:
            raise _order_error(first, self._last)
        self._last = _path_at(table, table.num_rows - 1)
        sizes = fmt.entry_sizes(table)
        pending_hits = deque(hits)
        start = 0
        while start < table.num_rows:
            while pending_hits and pending_hits[0] < start:
                pending_hits.popleft()
            cut = self._next_cut(sizes, start, pending_hits[0] if pending_hits else None)
            stop = table.num_rows if cut is None else cut + 1
            self._chunks.append(table.slice(start, stop - start))
            self._count += stop - start
            self._size += pc.sum(sizes.slice(start, stop - start)).as_py()
            if cut is not None:
                self._flush()
            start = stop

    def _next_cut(self, sizes: pa.Array, start: int, hit: int | None) -> int | None:
        """The first row from `start` after which the policy ends the pending range, if any:
        the next hash hit, the entry cap, or the byte cap, whichever comes first."""
        by_count = start + self._policy.max_entries - self._count - 1
        rules = [i for i in (hit, by_count) if i is not None and i < len(sizes)]
        limit = min(rules, default=len(sizes) - 1)
        running = pc.cumulative_sum(sizes.slice(start, limit - start + 1))
        room = self._policy.max_bytes - self._size
        over = pc.index(pc.greater_equal(running, room), True).as_py()
        if over >= 0:
            return start + over
        return limit if rules else None

    def _flush(self) -> None:
        table = pa.concat_tables(self._chunks).combine_chunks()
        range_id, written = self._store._put_range(table)
        self.ranges_written += written
        first, last = _path_at(table, 0), _path_at(table, table.num_rows - 1)
        self._rows.append(RangeInfo(range_id, first, last, self._count, self._size))
        self._chunks.clear()
        self._count = self._size = 0

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidArgument("this MetarangeWriter is closed; start a new one")
        if self._final:
            raise InvalidArgument("nothing can follow a range reused as final")


def _path_at(table: pa.Table, row: int) -> str:
    return table.column("path")[row].as_py()


def _check_increasing(paths: list[str]) -> None:
    """Within a batch; `_add_rows` checks the seam with what came before."""
    try:
        if all(map(operator.lt, paths, islice(paths, 1, None))):
            return
    except TypeError:
        pass
    bad = next(i for i in range(1, len(paths)) if not _is_above(paths[i], paths[i - 1]))
    raise _order_error(paths[bad], paths[bad - 1])


def _is_above(path: object, previous: object) -> bool:
    return isinstance(path, str) and isinstance(previous, str) and path > previous


def _order_error(path: str, last: str) -> InvalidArgument:
    if not isinstance(path, str) or not path:
        return InvalidArgument(f"entry path must be a non-empty string, not {path!r}")
    return InvalidArgument(f"entries must be sorted by path, no repeats: {path!r} after {last!r}")


class _DiffSide:
    """One side of a diff: ranges not opened yet, then the unread rows of the open one.

    The walk looks at `next_range()` first and either `skip()`s it (equal on both sides) or
    `open()`s it; only opening reads storage. Rows are taken as Arrow slices.
    """

    def __init__(self, infos: Sequence[RangeInfo], load: Callable[[str], pa.Table]) -> None:
        self._infos = deque(infos)
        self._load = load
        self._table: pa.Table = fmt.EMPTY_RANGE
        self._pos = 0

    @property
    def buffered(self) -> bool:
        return self._pos < self._table.num_rows

    def next_range(self) -> RangeInfo | None:
        """The next range, if the open one is used up and one is left."""
        return self._infos[0] if not self.buffered and self._infos else None

    def head(self) -> str | None:
        """The smallest key left on this side (read or not), or None when exhausted."""
        if self.buffered:
            return _path_at(self._table, self._pos)
        return self._infos[0].min_key if self._infos else None

    def last_key(self) -> str:
        return _path_at(self._table, self._table.num_rows - 1)

    def skip(self) -> None:
        self._infos.popleft()

    def open(self) -> None:
        self._table = self._load(self._infos.popleft().range_id)
        self._pos = 0

    def take_through(self, key: str) -> pa.Table:
        """The open rows with path <= `key`."""
        return self._take(_count_below(self._table.column("path"), key, inclusive=True))

    def take_below(self, key: str | None) -> pa.Table:
        """The open rows with path < `key` (all if None)."""
        paths = self._table.column("path")
        return self._take(len(paths) if key is None else _count_below(paths, key))

    def _take(self, stop: int) -> pa.Table:
        rows = self._table.slice(self._pos, max(stop - self._pos, 0))
        self._pos = max(stop, self._pos)
        return rows


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

    def before(self, key: str | None) -> Iterator[ChangeItem]:
        """Pop changes while their path is below `key` (all if None), lazily."""
        while self._head is not None and (key is None or self._head[0] < key):
            yield self.pop()

    def through(self, key: str) -> Iterator[ChangeItem]:
        """Pop changes while their path is at most `key`, lazily."""
        while self._head is not None and self._head[0] <= key:
            yield self.pop()

    def entries_before(self, key: str | None) -> Iterator[Entry]:
        """The new entries among `before(key)`: a delete with no base entry is a no-op."""
        return (entry for _, entry in self.before(key) if entry is not None)

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


@dataclass(frozen=True)
class Replacements:
    """Ranges that a base range plus every change inside its bounds is known to become.

    A merge knows such ranges: where the destination still holds a merge-base range and the
    source holds a range with the same bounds, the source's changes there are exactly what
    turns one into the other, so the merged range is the source's range, referenced by id
    instead of read and rebuilt. Only a caller that applies *every* change inside such a
    range may pass it.
    """

    unchanged: frozenset[str]
    """Ids of the ranges the changes were computed against (the merge base's)."""
    by_bounds: Mapping[tuple[str, str], RangeInfo]
    """The changed side's new ranges, by (min_key, max_key)."""

    @classmethod
    def between(cls, before: Sequence[RangeInfo], after: Sequence[RangeInfo]) -> Replacements:
        unchanged = frozenset(r.range_id for r in before)
        changed = {(r.min_key, r.max_key): r for r in after if r.range_id not in unchanged}
        return cls(unchanged, changed)

    def for_range(self, info: RangeInfo) -> RangeInfo | None:
        if info.range_id not in self.unchanged:
            return None
        return self.by_bounds.get((info.min_key, info.max_key))


class CommittedStore:
    """Ranges and metaranges of one storage namespace, with a bounded cache of decoded ones.

    Ranges are cached as Arrow tables (compact) and decoded to entries on use; metaranges as
    their rows. Every id read from storage is verified against its content, so a damaged or
    missing object surfaces as `CorruptedData` naming its key, never as wrong data. A
    `disk_cache` shares verified ranges with the machine's other processes.
    """

    def __init__(
        self,
        objects: ObjectStore,
        policy: RangePolicy | None = None,
        cache_size: int = 64,
        disk_cache: RangeCache | None = None,
    ) -> None:
        self.objects = objects
        self.policy = policy or RangePolicy()
        self.disk_cache = disk_cache
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

    def apply(
        self,
        base_metarange_id: str,
        changes: Iterable[ChangeItem],
        replacements: Replacements | None = None,
    ) -> str:
        """Apply changes sorted by path (`None` deletes; deleting an absent path is a no-op)
        to a metarange, and return the resulting metarange's id.

        The result is identical to writing all resulting entries from scratch. A base range
        that no change falls into and that starts on a range boundary of the output is
        referenced by id, neither read nor written: content-defined boundaries bring the
        output back in step with the base ranges shortly after each change. A range that
        must be rewritten is spliced as Arrow slices; only the changed entries are converted,
        unless `replacements` names the range that base range and its changes become.
        """
        base = deque(self._metarange(base_metarange_id))
        changes_ = _SortedChanges(changes)
        writer = self.writer()
        while base or changes_.peek() is not None:
            self._apply_step(base, changes_, writer, replacements)
        return writer.close()

    def _apply_step(
        self,
        base: deque[RangeInfo],
        changes: _SortedChanges,
        writer: MetarangeWriter,
        replacements: Replacements | None,
    ) -> None:
        """One move: write the changes before the next base range, reuse it, or splice it."""
        change = changes.peek()
        if not base:
            writer.add_entries(changes.entries_before(None))
        elif change is not None and change[0] < base[0].min_key:
            writer.add_entries(changes.entries_before(base[0].min_key))
        elif (change is None or change[0] > base[0].max_key) and writer.try_reuse(
            base[0], final=change is None and len(base) == 1
        ):
            base.popleft()
        else:
            info = base.popleft()
            replacement = replacements.for_range(info) if replacements else None
            if replacement is not None and writer.can_reuse(replacement):
                for _ in changes.through(info.max_key):
                    pass
                writer.try_reuse(replacement)
            else:
                self._splice(info, changes, writer)

    def _splice(self, info: RangeInfo, changes: _SortedChanges, writer: MetarangeWriter) -> None:
        """Rewrite one base range with the changes inside its bounds."""
        writer.add_changed_range(
            self.range_table(info.range_id), list(changes.through(info.max_key))
        )

    # --- reading ---------------------------------------------------------------------------

    def ranges(self, metarange_id: str) -> list[RangeInfo]:
        """The metarange's ranges in key order: what range-level diff and merge work on."""
        return list(self._metarange(metarange_id))

    def range_entries(self, range_id: str) -> list[Entry]:
        """All entries of one range, decoded."""
        return fmt.decode_entries(self.range_table(range_id))

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
            table = self.range_table(info.range_id)
            paths = table.column("path")
            below_prefix = _count_below(paths, prefix)
            start = max(_count_below(paths, after, inclusive=True), below_prefix)
            stop = below_prefix + _count_prefixed(paths, prefix) if prefix else len(paths)
            for chunk in range(start, stop, _DECODE_CHUNK):
                yield from fmt.decode_entries(table, chunk, min(stop, chunk + _DECODE_CHUNK))
            if stop < len(paths):
                return

    def get(self, metarange_id: str, path: str) -> Entry:
        """The entry at `path`; `NotFound` if absent. Opens at most the one range whose
        bounds contain the path."""
        entry = self.get_many(metarange_id, [path])[0]
        if entry is None:
            raise NotFound(f"path {path!r} not found in metarange {metarange_id}")
        return entry

    def get_many(self, metarange_id: str, paths: Sequence[str]) -> list[Entry | None]:
        """The entries at `paths` (sorted, distinct), `None` where absent.

        One vectorised pass per range the paths fall into, instead of a search per path: a
        merge looks up every changed path on both of its other sides.
        """
        infos = self._metarange(metarange_id)
        found: list[Entry | None] = [None] * len(paths)
        start = 0
        while start < len(paths):
            index = bisect.bisect_left(infos, paths[start], key=_max_key)
            if index == len(infos):
                break
            info = infos[index]
            stop = bisect.bisect_right(paths, info.max_key, lo=start)
            first = bisect.bisect_left(paths, info.min_key, lo=start, hi=stop)
            if first < stop:
                wanted = paths[first:stop]
                for entry in self._entries_at(info.range_id, wanted):
                    found[first + bisect.bisect_left(wanted, entry.path)] = entry
            start = stop
        return found

    def _entries_at(self, range_id: str, paths: Sequence[str]) -> list[Entry]:
        """Entries of one range at sorted `paths`: binary searches for a few, else one set
        lookup over the whole range."""
        table = self.range_table(range_id)
        column = table.column("path")
        if len(paths) <= _SEARCHED_PATHS:
            rows = (_row_of(column, path) for path in paths)
            return [fmt.decode_entries(table, row, row + 1)[0] for row in rows if row is not None]
        wanted = pa.array(paths, pa.string())
        return fmt.decode_entries(table.filter(pc.is_in(column, value_set=wanted)))

    def diff(self, left_id: str, right_id: str) -> Iterator[Change]:
        """Changes from left to right, sorted by path: "added" (right only), "removed" (left
        only; the left entry), "changed" (identities differ; the right entry).

        Ranges with the same id on both sides are skipped without reading; ranges that
        differ are compared with Arrow kernels, and only differing rows are decoded.
        """
        left = _DiffSide(self._metarange(left_id), self.range_table)
        right = _DiffSide(self._metarange(right_id), self.range_table)
        return _diff(left, right)

    # --- storage ---------------------------------------------------------------------------

    def _put_range(self, table: pa.Table) -> tuple[str, bool]:
        """Store a range unless its id is stored already; return (id, whether written).

        The range is cached as well: a merge retry or a diff right after a commit reads
        the ranges it just produced, and they are known to match their id.
        """
        range_id = fmt.range_id(table)
        self._keep(range_id, table)
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

    def range_table(self, range_id: str) -> pa.Table:
        """One range as a verified Arrow table (cached): for `MetarangeWriter.add_changed_range`."""
        table = self._range_cache.get(range_id)
        if table is not None:
            return table
        fmt.check_id("range", range_id)
        table = self.disk_cache.get(range_id) if self.disk_cache is not None else None
        if table is not None:
            self._range_cache.put(range_id, table)
            return table
        key = fmt.range_key(range_id)
        table = self._decode(key, fmt.RANGE_SCHEMA)
        if fmt.range_id(table) != range_id:
            raise self._corrupted(key, "its content does not match its id")
        self._keep(range_id, table)
        return table

    def _keep(self, range_id: str, table: pa.Table) -> None:
        """Cache a range known to match its id, in this process and on disk."""
        self._range_cache.put(range_id, table)
        if self.disk_cache is not None:
            self.disk_cache.put(range_id, table)

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


def _diff(left: _DiffSide, right: _DiffSide) -> Iterator[Change]:
    """Merge-walk two sides. Both at a range start with equal ids: skip both unread. A side's
    next range is opened only once its lower bound is not above the other side's head; then
    the rows both open ranges cover are compared as one vectorised window."""
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
        elif left.buffered and right.buffered:
            window = min(left.last_key(), right.last_key())
            yield from _diff_rows(left.take_through(window), right.take_through(window))
        elif left.buffered:
            yield from _changes_of("removed", left.take_below(right_key))
        else:
            yield from _changes_of("added", right.take_below(left_key))


_IDENTITY_COLUMNS = ("address", "size", "checksum", "metadata")
"""The stored columns of `Entry.identity()`: metadata is stored as the same canonical JSON."""


def _diff_rows(left: pa.Table, right: pa.Table) -> list[Change]:
    """Changes between two sorted row sets, found with Arrow kernels; only the rows that
    differ are decoded, so an unchanged row costs no Python. Where the paths are the same
    (entries changed in place, the common case) the set lookups are skipped."""
    if left.column("path").equals(right.column("path")):
        return _changed_rows(left, right)
    in_right = pc.is_in(left.column("path"), value_set=right.column("path"))
    in_left = pc.is_in(right.column("path"), value_set=left.column("path"))
    old, new = left.filter(in_right), right.filter(in_left)
    changes = [
        *_changes_of("removed", left.filter(pc.invert(in_right))),
        *_changes_of("added", right.filter(pc.invert(in_left))),
        *_changed_rows(old, new),
    ]
    changes.sort(key=_change_path)
    return changes


def _changed_rows(old: pa.Table, new: pa.Table) -> list[Change]:
    """Rows of equal paths, row for row, whose identities differ."""
    differs = functools.reduce(
        pc.or_, (pc.not_equal(old.column(name), new.column(name)) for name in _IDENTITY_COLUMNS)
    )
    return _changes_of("changed", new.filter(differs))


def _changes_of(kind: ChangeType, rows: pa.Table) -> list[Change]:
    return [Change(entry.path, kind, entry) for entry in fmt.decode_entries(rows)]


def _change_path(change: Change) -> str:
    return change.path


def _count_below(paths: pa.Array, key: str, inclusive: bool = False) -> int:
    """How many of the sorted paths are < `key` (<= if inclusive): the index a binary search
    would find, computed in one vectorised pass."""
    if not key:
        return 0
    compare = pc.less_equal if inclusive else pc.less
    return pc.sum(compare(paths, pa.scalar(key, pa.string()))).as_py() or 0


def _row_of(paths: pa.ChunkedArray, path: str) -> int | None:
    """The row holding `path` in sorted `paths`, by binary search: O(log n) scalar reads."""
    row = bisect.bisect_left(paths, path, key=_as_py)
    return row if row < len(paths) and paths[row].as_py() == path else None


def _as_py(scalar: pa.Scalar) -> object:
    return scalar.as_py()


def _count_prefixed(paths: pa.Array, prefix: str) -> int:
    return pc.sum(pc.starts_with(paths, pattern=prefix)).as_py() or 0


def _max_key(info: RangeInfo) -> str:
    return info.max_key
