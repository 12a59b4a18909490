"""Applying sorted changes to a metarange, range by range.

A base range that no change falls into and that starts on a range boundary of the output is
referenced by id, neither read nor written: content-defined boundaries bring the output back
in step with the base ranges shortly after each change, so an apply costs about the size of
the change, not of the repository. A range that must be rewritten is spliced as Arrow slices.

Changes travel as Arrow row batches (`format.CHANGE_SCHEMA`): staged rows arrive that way
from the KV without a Python object per entry, and `(path, entry)` items are converted a
batch at a time.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice

import pyarrow as pa
import pyarrow.compute as pc

from branchwater.engine.errors import InvalidArgument
from branchwater.engine.graveler.committed.format import (
    CHANGE_SCHEMA,
    RangeInfo,
    build_range,
    count_below,
    identities_differ,
    path_at,
)
from branchwater.engine.graveler.committed.writer import (
    ChangeItem,
    MetarangeWriter,
    live_rows,
    order_error,
)
from branchwater.engine.graveler.model import EMPTY_METADATA, Entry
from branchwater.engine.units import EPOCH


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


def apply_changes(
    base: Sequence[RangeInfo],
    changes: Iterable[ChangeItem],
    writer: MetarangeWriter,
    load: Callable[[str], pa.Table],
    replacements: Replacements | None = None,
) -> str:
    """`apply_rows` for sorted `(path, entry or None)` items."""
    return apply_rows(base, _as_rows(changes), writer, load, replacements)


def apply_rows(
    base: Sequence[RangeInfo],
    batches: Iterable[pa.Table],
    writer: MetarangeWriter,
    load: Callable[[str], pa.Table],
    replacements: Replacements | None = None,
    *,
    keep_equal: bool = True,
) -> str:
    """Write the `base` ranges with sorted change rows applied through a fresh `writer`, and
    return the metarange id it closes with. `load` reads a base range that must be spliced;
    `keep_equal` as `MetarangeWriter.add_changed_range` has it."""
    pending = deque(base)
    changes = _ChangeRows(batches)
    while pending or changes.head() is not None:
        _step(pending, changes, writer, load, replacements, keep_equal)
    return writer.close()


def settle_rows(
    head: Sequence[RangeInfo], batches: Iterable[pa.Table], load: Callable[[str], pa.Table]
) -> Iterator[pa.Table]:
    """Sorted change rows with HEAD's row in place of each entry of the identity HEAD holds
    at its path: what applying them on HEAD would keep, for changes applied on another base
    (a compacted metarange) with `keep_equal` off."""
    ends = [info.max_key for info in head]
    for batch in batches:
        if not batch.num_rows:
            continue
        first, last = path_at(batch, 0), path_at(batch, batch.num_rows - 1)
        tables = []
        for info in islice(head, bisect.bisect_left(ends, first), None):
            if info.min_key > last:
                break
            tables.append(load(info.range_id))
        yield _settled(batch, pa.concat_tables(tables)) if tables else batch


def _settled(changes: pa.Table, stored: pa.Table) -> pa.Table:
    position = pc.index_in(changes.column("path"), value_set=stored.column("path"))
    live = pc.and_(pc.is_valid(position), pc.invert(changes.column("deleted")))
    if not pc.any(live).as_py():
        return changes
    held = stored.take(pc.fill_null(position, 0))
    same = pc.and_(live, pc.invert(identities_differ(changes, held)))
    use_held = pc.fill_null(same, False)
    columns = [
        pc.if_else(use_held, held.column(field.name).cast(field.type), changes.column(field.name))
        if field.name in held.column_names
        else changes.column(field.name)
        for field in changes.schema
    ]
    return pa.Table.from_arrays(columns, schema=changes.schema)


def _step(
    base: deque[RangeInfo],
    changes: _ChangeRows,
    writer: MetarangeWriter,
    load: Callable[[str], pa.Table],
    replacements: Replacements | None,
    keep_equal: bool,
) -> None:
    """One move: write the changes before the next base range, reuse it, or splice it."""
    head = changes.head()
    if not base:
        _add_live(writer, changes.before(None))
    elif head is not None and head < base[0].min_key:
        _add_live(writer, changes.before(base[0].min_key))
    elif (head is None or head > base[0].max_key) and writer.try_reuse(
        base[0], final=head is None and len(base) == 1
    ):
        base.popleft()
    else:
        info = base.popleft()
        replacement = replacements.for_range(info) if replacements else None
        inside = list(changes.through(info.max_key))
        if replacement is not None and writer.can_reuse(replacement):
            writer.try_reuse(replacement)
        else:
            rows = pa.concat_tables(inside) if inside else CHANGE_SCHEMA.empty_table()
            writer.add_changed_range(load(info.range_id), rows, keep_equal=keep_equal)


def _add_live(writer: MetarangeWriter, batches: Iterable[pa.Table]) -> None:
    """Write the new entries among change rows: a delete with no base entry is a no-op."""
    for batch in batches:
        live = live_rows(batch)
        if live.num_rows:
            writer.add_rows(live)


class _ChangeRows:
    """A stream of sorted change-row batches, taken by key bounds as Arrow slices; refuses
    unsorted input instead of corrupting ranges."""

    def __init__(self, batches: Iterable[pa.Table]) -> None:
        self._batches = iter(batches)
        self._table: pa.Table | None = None
        self._pos = 0
        self._last = ""
        self._next_batch()

    def head(self) -> str | None:
        return None if self._table is None else path_at(self._table, self._pos)

    def before(self, key: str | None) -> Iterator[pa.Table]:
        """Take the rows with path < `key` (all if None), lazily, a slice per batch."""
        while self._table is not None:
            paths = self._table.column("path")
            stop = len(paths) if key is None else count_below(paths, key)
            if stop <= self._pos:
                return
            yield self._take(stop)

    def through(self, key: str) -> Iterator[pa.Table]:
        """Take the rows with path <= `key`, lazily, a slice per batch."""
        while self._table is not None:
            stop = count_below(self._table.column("path"), key, inclusive=True)
            if stop <= self._pos:
                return
            yield self._take(stop)

    def _take(self, stop: int) -> pa.Table:
        assert self._table is not None
        rows = self._table.slice(self._pos, stop - self._pos)
        self._pos = stop
        if stop == self._table.num_rows:
            self._next_batch()
        return rows

    def _next_batch(self) -> None:
        self._table, self._pos = None, 0
        for table in self._batches:
            if table.num_rows:
                _check_sorted(table, self._last)
                self._table, self._last = table, path_at(table, table.num_rows - 1)
                return


def _check_sorted(table: pa.Table, last: str) -> None:
    """Strictly increasing paths, within the batch (vectorised) and after `last`."""
    first = path_at(table, 0)
    if not first > last:
        raise order_error(first, last)
    paths = table.column("path")
    increasing = pc.less(paths.slice(0, len(paths) - 1), paths.slice(1))
    if len(paths) > 1 and not pc.all(increasing).as_py():
        bad = pc.index(increasing, False).as_py()
        raise order_error(path_at(table, bad + 1), path_at(table, bad))


_BATCH = 8192
"""Change items converted to Arrow at once: enough to amortise a conversion."""


def _as_rows(changes: Iterable[ChangeItem]) -> Iterator[pa.Table]:
    """Change items as change-row batches; a delete's row holds placeholders."""
    iterator = iter(changes)
    while batch := list(islice(iterator, _BATCH)):
        entries = [_entry_of(path, entry) for path, entry in batch]
        deleted = pa.array([entry is None for _, entry in batch], pa.bool_())
        yield build_range(entries).append_column(CHANGE_SCHEMA.field("deleted"), deleted)


def _entry_of(path: str, entry: Entry | None) -> Entry:
    if not isinstance(path, str) or not path:
        raise order_error(path, "")
    if entry is None:
        return Entry(path, "", 0, "", EPOCH, EMPTY_METADATA)
    if entry.path != path:
        raise InvalidArgument(f"change for {path!r} carries an entry for {entry.path!r}")
    return entry
