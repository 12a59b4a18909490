"""Applying sorted changes to a metarange, range by range.

A base range that no change falls into and that starts on a range boundary of the output is
referenced by id, neither read nor written: content-defined boundaries bring the output back
in step with the base ranges shortly after each change, so an apply costs about the size of
the change, not of the repository. A range that must be rewritten is spliced as Arrow slices.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa

from branchwater.engine.errors import InvalidArgument
from branchwater.engine.graveler.committed.format import RangeInfo
from branchwater.engine.graveler.committed.writer import ChangeItem, MetarangeWriter, order_error
from branchwater.engine.graveler.model import Entry


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
    """Write the `base` ranges with sorted `changes` applied through a fresh `writer`, and
    return the metarange id it closes with. `load` reads a base range that must be spliced."""
    pending = deque(base)
    sorted_changes = _SortedChanges(changes)
    while pending or sorted_changes.peek() is not None:
        _step(pending, sorted_changes, writer, load, replacements)
    return writer.close()


def _step(
    base: deque[RangeInfo],
    changes: _SortedChanges,
    writer: MetarangeWriter,
    load: Callable[[str], pa.Table],
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
            writer.add_changed_range(load(info.range_id), list(changes.through(info.max_key)))


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
                raise order_error(path, self._last)
            if entry is not None and entry.path != path:
                raise InvalidArgument(f"change for {path!r} carries an entry for {entry.path!r}")
            self._last = path
        self._head = change
