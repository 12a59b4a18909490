"""Streaming merges of sorted (path, value) layers: the combined and visible iterators.

Everything here is lazy and ordered by path, so a branch of any size is listed or committed
with memory bounded by the number of layers, never by the number of entries.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from branchwater.engine.graveler.model import Change, Entry

Layer = Iterable[tuple[str, Entry | None]]
T = TypeVar("T")
V = TypeVar("V")
K = TypeVar("K", str, bytes)
"""Paths as text, or as the UTF-8 bytes the KV keys them by: both sort the same."""


def combine(layers: list[Iterable[tuple[K, V]]]) -> Iterator[tuple[K, V]]:
    """Merge layers ordered top first: for a path in several layers the topmost wins.

    Tombstones (`None`, or an empty encoded value) are kept, because applying the result to
    committed data needs them.
    """
    if len(layers) == 1:
        return iter(layers[0])
    return _dedupe(heapq.merge(*(_tagged(layer, rank) for rank, layer in enumerate(layers))))


def _tagged(layer: Iterable[tuple[K, V]], rank: int) -> Iterator[tuple[K, int, V]]:
    for path, value in layer:
        yield path, rank, value


def _dedupe(merged: Iterator[tuple[K, int, V]]) -> Iterator[tuple[K, V]]:
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


def overlay(
    top: Iterable[tuple[str, V]], below: Iterable[Change]
) -> Iterator[tuple[str, V | None, Change | None]]:
    """Merge staged pairs over changes already known, both sorted by path: a pair comes out
    as (path, value, None), a change as (path, None, change), and where both hold a path,
    the pair alone."""
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


def reporting(
    items: Iterable[T],
    report: Callable[[int], None],
    every: int,
    size: Callable[[T], int] | None = None,
) -> Iterator[T]:
    """`items` unchanged, calling `report(n)` with each multiple of `every` the running count
    passes and with the total when they run out: progress for long streams for the price of
    a counter per item. An item counts `size(item)` (a batch its rows), else 1."""
    count = 0
    for item in items:
        yield item
        before, count = count, count + (1 if size is None else size(item))
        for mark in range((before // every + 1) * every, count + 1, every):
            report(mark)
    if count % every:
        report(count)
