"""Streaming merges of sorted (path, value) layers: the combined and visible iterators.

Everything here is lazy and ordered by path, so a branch of any size is listed or committed
with memory bounded by the number of layers, never by the number of entries.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import TypeVar

from branchwater.engine.graveler.model import Change, Entry

Layer = Iterable[tuple[str, Entry | None]]
T = TypeVar("T")


def combine(layers: list[Layer]) -> Iterator[tuple[str, Entry | None]]:
    """Merge layers ordered top first: for a path in several layers the topmost wins.

    Tombstones (`None`) are kept, because applying the result to committed data needs them.
    """
    if len(layers) == 1:
        return iter(layers[0])
    return _dedupe(heapq.merge(*(_tagged(layer, rank) for rank, layer in enumerate(layers))))


def _tagged(layer: Layer, rank: int) -> Iterator[tuple[str, int, Entry | None]]:
    for path, value in layer:
        yield path, rank, value


def _dedupe(merged: Iterator[tuple[str, int, Entry | None]]) -> Iterator[tuple[str, Entry | None]]:
    previous = None
    for path, _, value in merged:
        if path != previous:
            previous = path
            yield path, value


def committed_layer(entries: Iterable[Entry]) -> Iterator[tuple[str, Entry | None]]:
    for entry in entries:
        yield entry.path, entry


def visible(stream: Iterable[tuple[str, Entry | None]]) -> Iterator[Entry]:
    """Drop tombstones: what a listing shows."""
    for _, value in stream:
        if value is not None:
            yield value


def staged_changes(
    staged: Iterable[tuple[str, Entry | None]],
    lookup_many: Callable[[list[str]], list[Entry | None]],
    settled: Iterable[Change] = (),
) -> Iterator[Change]:
    """Changes that `staged` makes to a base, over `settled` changes already known.

    A merge-join: staged paths are looked up in the base a batch at a time (`lookup_many`
    takes sorted paths and opens only the base ranges they fall into), never one by one. A
    settled change shows where no staged path hides it: what compaction already applied.
    """
    merged = _overlay(staged, settled)
    while batch := list(islice(merged, LOOKUP_BATCH)):
        bases = iter(lookup_many([path for path, _, known in batch if known is None]))
        for path, value, known in batch:
            if known is not None:
                yield known
                continue
            base = next(bases)
            if value is None:
                if base is not None:
                    yield Change(path, "removed", base)
            elif base is None:
                yield Change(path, "added", value)
            elif base.identity() != value.identity():
                yield Change(path, "changed", value)


LOOKUP_BATCH = 1024
"""Staged paths looked up together: one vectorised pass per base range they fall into."""

_Overlaid = tuple[str, Entry | None, Change | None]


def _overlay(
    top: Iterable[tuple[str, Entry | None]], below: Iterable[Change]
) -> Iterator[_Overlaid]:
    """Both sorted streams by path; where both hold a path, the top one alone."""
    lower = iter(below)
    pending = next(lower, None)
    for path, value in top:
        while pending is not None and pending.path < path:
            yield pending.path, None, pending
            pending = next(lower, None)
        if pending is not None and pending.path == path:
            pending = next(lower, None)
        yield path, value, None
    while pending is not None:
        yield pending.path, None, pending
        pending = next(lower, None)


def reporting(items: Iterable[T], report: Callable[[int], None], every: int) -> Iterator[T]:
    """`items` unchanged, calling `report(n)` after every `every`-th item and with the total
    when they run out: progress for long streams for the price of a counter per item."""
    count = 0
    for count, item in enumerate(items, 1):
        yield item
        if count % every == 0:
            report(count)
    if count % every:
        report(count)
