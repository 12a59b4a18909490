"""In-process `Store` for fast unit tests (`memory://`): thread-safe, one process only."""

from __future__ import annotations

import bisect

from branchwater.engine.errors import PredicateFailed
from branchwater.engine.kv.store import Store, guard_failed, key_not_found
from branchwater.engine.per_process import ChildSafeLock


class _Partition:
    __slots__ = ("keys", "values")

    def __init__(self) -> None:
        self.keys: list[bytes] = []
        self.values: dict[bytes, bytes] = {}


class MemoryStore(Store):
    def __init__(self, url: str = "memory://") -> None:
        self.url = url
        self._partitions: dict[bytes, _Partition] = {}
        self._lock = ChildSafeLock()

    def _get(self, partition: bytes, key: bytes) -> bytes:
        with self._lock:
            part = self._partitions.get(partition)
            if part is None or key not in part.values:
                raise key_not_found(partition, key)
            return part.values[key]

    def _put(self, partition: bytes, key: bytes, value: bytes) -> None:
        part = self._partitions.setdefault(partition, _Partition())
        if key not in part.values:
            bisect.insort(part.keys, key)
        part.values[key] = value

    def _set(self, partition: bytes, key: bytes, value: bytes) -> None:
        with self._lock:
            self._put(partition, key, value)

    def _current(self, partition: bytes, key: bytes) -> bytes | None:
        part = self._partitions.get(partition)
        return None if part is None else part.values.get(key)

    def _create(self, partition: bytes, key: bytes, value: bytes) -> None:
        with self._lock:
            if self._current(partition, key) is not None:
                raise PredicateFailed(f"key {key!r} already exists in partition {partition!r}")
            self._put(partition, key, value)

    def _replace(self, partition: bytes, key: bytes, value: bytes) -> None:
        with self._lock:
            if self._current(partition, key) is None:
                raise PredicateFailed(f"key {key!r} does not exist in partition {partition!r}")
            self._put(partition, key, value)

    def _swap(self, partition: bytes, key: bytes, value: bytes, expected: bytes) -> None:
        with self._lock:
            if self._current(partition, key) != expected:
                raise PredicateFailed(f"key {key!r} in partition {partition!r} changed since read")
            self._put(partition, key, value)

    def _delete(self, partition: bytes, key: bytes) -> None:
        with self._lock:
            self._remove(partition, key)

    def _remove(self, partition: bytes, key: bytes) -> None:
        part = self._partitions.get(partition)
        if part is None or key not in part.values:
            return
        del part.values[key]
        del part.keys[bisect.bisect_left(part.keys, key)]

    def _delete_if(self, partition: bytes, key: bytes, expected: bytes) -> None:
        with self._lock:
            if self._current(partition, key) != expected:
                raise PredicateFailed(f"key {key!r} in partition {partition!r} changed since read")
            self._remove(partition, key)

    def _delete_guarded(
        self, partition: bytes, key: bytes, guard: tuple[bytes, bytes], expected: bytes
    ) -> bool:
        with self._lock:
            if self._current(*guard) != expected:
                return False
            self._remove(partition, key)
            return True

    def _create_guarded(
        self,
        partition: bytes,
        key: bytes,
        value: bytes,
        guard: tuple[bytes, bytes],
        expected: bytes,
    ) -> bool:
        with self._lock:
            if self._current(*guard) != expected:
                raise guard_failed(guard)
            if self._current(partition, key):
                return False
            self._put(partition, key, value)
            return True

    def _scan_batch(
        self, partition: bytes, start: bytes, inclusive: bool, limit: int
    ) -> list[tuple[bytes, bytes]]:
        with self._lock:
            part = self._partitions.get(partition)
            if part is None:
                return []
            find = bisect.bisect_left if inclusive else bisect.bisect_right
            first = find(part.keys, start)
            return [(k, part.values[k]) for k in part.keys[first : first + limit]]
