"""Two-way diff of metaranges, range by range.

Ranges with the same id on both sides are skipped without being read, so a diff costs what
differs, not the size of the repository; rows of ranges that differ are compared with Arrow
kernels, and only the rows that differ are decoded.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from branchwater.engine.graveler.committed.format import (
    EMPTY_RANGE,
    IDENTITY_COLUMNS,
    PHYSICAL_COLUMNS,
    RangeInfo,
    count_below,
    decode_entries,
    identities_differ,
    path_at,
)
from branchwater.engine.graveler.model import Change, ChangeType


def diff_ranges(
    left: Sequence[RangeInfo],
    right: Sequence[RangeInfo],
    load: Callable[[str], pa.Table],
    after: str = "",
    *,
    physical: bool = False,
) -> Iterator[Change]:
    """Changes from the `left` ranges to the `right` ranges with path > `after`, sorted by
    path: "added" (right only), "removed" (left only; the left entry), "changed" (identities
    differ, or with `physical` the addresses too; the right entry). `load` reads a range by
    id, and is called only for ranges that must be opened."""
    compared = PHYSICAL_COLUMNS if physical else IDENTITY_COLUMNS
    return _diff(_DiffSide(left, load, after), _DiffSide(right, load, after), compared)


def changed_ranges(left: Sequence[RangeInfo], right: Sequence[RangeInfo]) -> list[RangeInfo]:
    """The ranges of either side the other does not hold (by id): every path whose entry
    differs between the sides lies within the key bounds of one of them."""
    left_ids = {info.range_id for info in left}
    right_ids = {info.range_id for info in right}
    return [info for info in left if info.range_id not in right_ids] + [
        info for info in right if info.range_id not in left_ids
    ]


def spans_meet(left: Sequence[RangeInfo], right: Sequence[RangeInfo]) -> bool:
    """Whether the key bounds of a range of `left` overlap those of one of `right`, found
    from the bounds alone: no range is read."""
    spans = sorted(
        [(info.min_key, info.max_key, 0) for info in left]
        + [(info.min_key, info.max_key, 1) for info in right]
    )
    reach: list[str | None] = [None, None]
    """The highest max key of each side's spans so far, which start at or before this one."""
    for low, high, side in spans:
        other = reach[1 - side]
        if other is not None and low <= other:
            return True
        mine = reach[side]
        reach[side] = high if mine is None or high > mine else mine
    return False


class _DiffSide:
    """One side of a diff: ranges not opened yet, then the unread rows of the open one.

    The walk looks at `next_range()` first and either `skip()`s it (equal on both sides) or
    `open()`s it; only opening reads storage. Rows are taken as Arrow slices. Rows up to
    `after` are left out: ranges that end by it are dropped, an opened range starts past it.
    """

    def __init__(
        self, infos: Sequence[RangeInfo], load: Callable[[str], pa.Table], after: str = ""
    ) -> None:
        self._infos = deque(info for info in infos if info.max_key > after)
        self._load = load
        self._after = after
        self._table: pa.Table = EMPTY_RANGE
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
            return path_at(self._table, self._pos)
        return self._infos[0].min_key if self._infos else None

    def last_key(self) -> str:
        return path_at(self._table, self._table.num_rows - 1)

    def skip(self) -> None:
        self._infos.popleft()

    def open(self) -> None:
        self._table = self._load(self._infos.popleft().range_id)
        self._pos = count_below(self._table.column("path"), self._after, inclusive=True)

    def take_through(self, key: str) -> pa.Table:
        """The open rows with path <= `key`."""
        return self._take(count_below(self._table.column("path"), key, inclusive=True))

    def take_below(self, key: str | None) -> pa.Table:
        """The open rows with path < `key` (all if None)."""
        paths = self._table.column("path")
        return self._take(len(paths) if key is None else count_below(paths, key))

    def _take(self, stop: int) -> pa.Table:
        rows = self._table.slice(self._pos, max(stop - self._pos, 0))
        self._pos = max(stop, self._pos)
        return rows


def _diff(left: _DiffSide, right: _DiffSide, compared: Sequence[str]) -> Iterator[Change]:
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
            yield from _diff_rows(left.take_through(window), right.take_through(window), compared)
        elif left.buffered:
            yield from _changes_of("removed", left.take_below(right_key))
        else:
            yield from _changes_of("added", right.take_below(left_key))


def _diff_rows(left: pa.Table, right: pa.Table, compared: Sequence[str]) -> list[Change]:
    """Changes between two sorted row sets, found with Arrow kernels; only the rows that
    differ are decoded, so an unchanged row costs no Python. Where the paths are the same
    (entries changed in place, the common case) the set lookups are skipped."""
    if left.column("path").equals(right.column("path")):
        return _changed_rows(left, right, compared)
    in_right = pc.is_in(left.column("path"), value_set=right.column("path"))
    in_left = pc.is_in(right.column("path"), value_set=left.column("path"))
    old, new = left.filter(in_right), right.filter(in_left)
    changes = [
        *_changes_of("removed", left.filter(pc.invert(in_right))),
        *_changes_of("added", right.filter(pc.invert(in_left))),
        *_changed_rows(old, new, compared),
    ]
    changes.sort(key=_change_path)
    return changes


def _changed_rows(old: pa.Table, new: pa.Table, compared: Sequence[str]) -> list[Change]:
    """Rows of equal paths, row for row, that differ in a `compared` column."""
    return _changes_of("changed", new.filter(identities_differ(old, new, compared)))


def _changes_of(kind: ChangeType, rows: pa.Table) -> list[Change]:
    return [Change(entry.path, kind, entry) for entry in decode_entries(rows)]


def _change_path(change: Change) -> str:
    return change.path
