"""A bounded, thread-safe LRU map: the engine's in-process caches (ranges, metaranges, the
fsspec filesystem's resolved commits and entries) are shared by a process's threads and
must not grow with what a long-lived process reads."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Generic, TypeVar

from branchwater.engine.per_process import forget_in_child

K = TypeVar("K")
V = TypeVar("V")


class LRU(Generic[K, V]):
    """At most `capacity` items (0: none kept) and, where `weight` is given, at most
    `max_weight` of their weights (the newest item is kept whatever it weighs); the least
    recently used go first."""

    def __init__(
        self,
        capacity: int,
        weight: Callable[[V], int] | None = None,
        max_weight: int = 0,
    ) -> None:
        if capacity < 0:
            raise ValueError(f"an LRU's capacity must be >= 0, not {capacity}")
        self._capacity = capacity
        self._weight = weight
        self._max_weight = max_weight
        self._held = 0
        self._items: OrderedDict[K, V] = OrderedDict()
        self._lock = threading.Lock()
        forget_in_child(self)

    def after_fork_in_child(self) -> None:
        """In a forked child: start empty, as another thread may have held the lock."""
        self._items = OrderedDict()
        self._held = 0
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
            self._drop(key)
            self._items[key] = value
            self._held += self._weigh(value)
            while len(self._items) > 1 and (
                len(self._items) > self._capacity
                or (self._weight is not None and self._held > self._max_weight)
            ):
                _, dropped = self._items.popitem(last=False)
                self._held -= self._weigh(dropped)

    def discard(self, key: K) -> None:
        """Forget `key`, if held: its value turned out stale."""
        with self._lock:
            self._drop(key)

    def _drop(self, key: K) -> None:
        dropped = self._items.pop(key, None)
        if dropped is not None:
            self._held -= self._weigh(dropped)

    def _weigh(self, value: V) -> int:
        return self._weight(value) if self._weight is not None else 0
