"""Streaming merges of sorted (path, value) layers: the combined and visible iterators.

Everything here is lazy and ordered by path, so a branch of any size is listed or committed
with memory bounded by the number of layers, never by the number of entries.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from branchwater.engine.graveler.model import Entry

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
