"""`CommittedStore`: the committed layer of one storage namespace, behind one object.

It writes sorted entries as content-defined ranges, reads them lazily by key bounds, applies
sorted changes to a metarange and diffs two metaranges; the work is done by `storage`,
`writer`, `apply` and `diff`. A three-way merge is built the same way from `ranges()`
(compare range ids), `storage.range_table()` and a `writer()` (`try_reuse` for untouched
ranges, `add_changed_range` for a rewritten one).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from branchwater.engine.errors import NotFound
from branchwater.engine.graveler.committed.apply import (
    Replacements,
    apply_changes,
    apply_rows,
    settle_rows,
)
from branchwater.engine.graveler.committed.diff import diff_ranges
from branchwater.engine.graveler.committed.format import (
    EMPTY_RANGE,
    RangeInfo,
    RangePolicy,
    count_below,
    decode_entries,
)
from branchwater.engine.graveler.committed.range_cache import RangeCache
from branchwater.engine.graveler.committed.storage import RangeStorage
from branchwater.engine.graveler.committed.writer import ChangeItem, MetarangeWriter
from branchwater.engine.graveler.model import Change, Entry
from branchwater.engine.objects import ObjectStore

_DECODE_CHUNK = 1024
"""Rows decoded at a time while iterating: a first page never pays for a whole range."""

_SEARCHED_PATHS = 16
"""Up to this many lookups in one range binary-search; more scan it once with a set."""


class CommittedStore:
    """Ranges and metaranges of one storage namespace, written under one `RangePolicy`.

    Ranges are cached as Arrow tables (compact) and decoded to entries on use. A
    `disk_cache` shares verified ranges with the machine's other processes.
    """

    def __init__(
        self,
        objects: ObjectStore,
        policy: RangePolicy | None = None,
        cache_size: int = 64,
        disk_cache: RangeCache | None = None,
    ) -> None:
        self.policy = policy or RangePolicy()
        self.storage = RangeStorage(objects, cache_size, disk_cache)

    def close(self) -> None:
        self.storage.close()

    # --- writing ---------------------------------------------------------------------------

    def writer(self) -> MetarangeWriter:
        return MetarangeWriter(self.storage, self.policy)

    def write_metarange(self, entries: Iterable[Entry]) -> str:
        """Write entries sorted by path (streamed: one range in memory) and return the id."""
        writer = self.writer()
        writer.add_entries(entries)
        return writer.close()

    def apply(
        self,
        base_metarange_id: str,
        changes: Iterable[ChangeItem],
        replacements: Replacements | None = None,
    ) -> str:
        """Apply changes sorted by path (`None` deletes; deleting an absent path is a no-op)
        to a metarange, and return the resulting metarange's id.

        The result is identical to writing all resulting entries from scratch, but only the
        base ranges that changes fall into are read and rewritten (see the `apply` module),
        and not even those where `replacements` names the range they become. A change to an
        entry of the same identity (`Entry.identity`) is no change: the stored entry stays.
        """
        base = self.storage.metarange(base_metarange_id)
        return apply_changes(base, changes, self.writer(), self.storage.range_table, replacements)

    def apply_rows(
        self, base_metarange_id: str, batches: Iterable[pa.Table], head_metarange_id: str
    ) -> str:
        """`apply` for changes already in Arrow: sorted batches of `format.CHANGE_SCHEMA`
        rows, such as staged rows on their way to a commit.

        Identity is judged against HEAD (`head_metarange_id`), whatever the base: on a
        compacted metarange a change of HEAD's identity becomes HEAD's entry and every other
        change wins, as it would on HEAD. Keeping the compacted entry of equal identity
        instead would commit an object the branch no longer showed, and turn a write back to
        HEAD's content into a change that is no change on an uncompacted branch."""
        base = self.storage.metarange(base_metarange_id)
        load = self.storage.range_table
        if head_metarange_id == base_metarange_id:
            return apply_rows(base, batches, self.writer(), load)
        settled = settle_rows(self.storage.metarange(head_metarange_id), batches, load)
        return apply_rows(base, settled, self.writer(), load, keep_equal=False)

    # --- reading ---------------------------------------------------------------------------

    def ranges(self, metarange_id: str) -> list[RangeInfo]:
        """The metarange's ranges in key order: what range-level diff and merge work on."""
        return list(self.storage.metarange(metarange_id))

    def iterate(self, metarange_id: str, after: str = "", prefix: str = "") -> Iterator[Entry]:
        """Entries with path > `after` starting with `prefix`, in path order.

        Lazy: a range is opened only when the iteration reaches it, and ranges whose bounds
        cannot hold a wanted key are never opened.
        """
        infos = self.storage.metarange(metarange_id)
        return self._iterate(infos, after, prefix)

    def _iterate(self, infos: Sequence[RangeInfo], after: str, prefix: str) -> Iterator[Entry]:
        for info in infos:
            if info.max_key <= after or info.max_key < prefix:
                continue
            if info.min_key > prefix and not info.min_key.startswith(prefix):
                return
            table = self.storage.range_table(info.range_id)
            paths = table.column("path")
            below_prefix = count_below(paths, prefix)
            start = max(count_below(paths, after, inclusive=True), below_prefix)
            stop = below_prefix + _count_prefixed(paths, prefix) if prefix else len(paths)
            for chunk in range(start, stop, _DECODE_CHUNK):
                yield from decode_entries(table, chunk, min(stop, chunk + _DECODE_CHUNK))
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
        found: list[Entry | None] = [None] * len(paths)
        for range_id, first, stop in self._ranges_holding(metarange_id, paths):
            wanted = paths[first:stop]
            table = self.storage.range_table(range_id)
            if len(wanted) <= _SEARCHED_PATHS:
                rows = (_row_of(table.column("path"), path) for path in wanted)
                entries = [decode_entries(table, r, r + 1)[0] for r in rows if r is not None]
            else:
                entries = decode_entries(_rows_among(table, wanted))
            for entry in entries:
                found[first + bisect.bisect_left(wanted, entry.path)] = entry
        return found

    def rows_at(self, metarange_id: str, paths: Sequence[str]) -> pa.Table:
        """The stored rows at those of `paths` (sorted, distinct) the metarange holds, in
        path order and undecoded, for callers that compare them in Arrow."""
        parts = [
            _rows_among(self.storage.range_table(range_id), paths[first:stop])
            for range_id, first, stop in self._ranges_holding(metarange_id, paths)
        ]
        return pa.concat_tables(parts) if parts else EMPTY_RANGE

    def _ranges_holding(
        self, metarange_id: str, paths: Sequence[str]
    ) -> Iterator[tuple[str, int, int]]:
        """(range id, first, stop) for each range that `paths[first:stop]` (sorted) fall
        into: ranges that none of the paths can be in are never opened."""
        infos = self.storage.metarange(metarange_id)
        start = 0
        while start < len(paths):
            index = bisect.bisect_left(infos, paths[start], key=_max_key)
            if index == len(infos):
                return
            info = infos[index]
            stop = bisect.bisect_right(paths, info.max_key, lo=start)
            first = bisect.bisect_left(paths, info.min_key, lo=start, hi=stop)
            if first < stop:
                yield info.range_id, first, stop
            start = stop

    def diff(
        self, left_id: str, right_id: str, after: str = "", *, physical: bool = False
    ) -> Iterator[Change]:
        """Changes from left to right with path > `after`, sorted by path: "added" (right
        only), "removed" (left only; the left entry), "changed" (identities differ; the right
        entry). `physical` also counts an entry moved to another address as changed, as GC
        must.

        Ranges with the same id on both sides are skipped without reading; ranges that
        differ are compared with Arrow kernels, and only differing rows are decoded. A page
        that starts at `after` reads no range that ends before it.
        """
        left, right = self.storage.metarange(left_id), self.storage.metarange(right_id)
        return diff_ranges(left, right, self.storage.range_table, after, physical=physical)


def _row_of(paths: pa.ChunkedArray, path: str) -> int | None:
    """The row holding `path` in sorted `paths`, by binary search: O(log n) scalar reads."""
    row = bisect.bisect_left(paths, path, key=_as_py)
    return row if row < len(paths) and paths[row].as_py() == path else None


def _rows_among(table: pa.Table, paths: Sequence[str]) -> pa.Table:
    """The rows of a range whose path is one of `paths`: one set lookup over the range."""
    return table.filter(pc.is_in(table.column("path"), value_set=pa.array(paths, pa.string())))


def _as_py(scalar: pa.Scalar) -> str:
    return scalar.as_py()


def _count_prefixed(paths: pa.ChunkedArray, prefix: str) -> int:
    return pc.sum(pc.starts_with(paths, pattern=prefix)).as_py() or 0


def _max_key(info: RangeInfo) -> str:
    return info.max_key
