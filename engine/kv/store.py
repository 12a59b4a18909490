"""The key-value `Store` contract every driver fulfils.

The metadata-KV design needs only read-after-write consistency, ordered scans within a
partition and a per-key compare-and-swap. Drivers implement the small `_` methods; the
public methods here check arguments once, so every driver rejects bad input the same way.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Iterator
from typing import NamedTuple

from branchwater.engine.errors import InvalidArgument, NotFound, OutcomeUnknown, PredicateFailed

DEFAULT_BATCH_SIZE = 1000
UNKNOWN_OUTCOME = (
    "may or may not have been applied, and may yet be: a read that shows it settles that, "
    "one that does not settles nothing, so send it again only as a conditional write"
)
"""What every driver says of a conditional write whose reply was lost. The server may
still be running it (across a network partition it never hears the client go), so it can
land after the error; a retry conditioned on the value read (or on absence) and the late
write cannot both apply."""


class _Exists:
    """Predicate meaning "the key must exist, whatever its value"."""

    _instance: _Exists | None = None

    def __new__(cls) -> _Exists:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "EXISTS"

    def __reduce__(self) -> str:
        return "EXISTS"


EXISTS = _Exists()

Predicate = bytes | None | _Exists
"""`bytes` last read (compare-and-swap), `None` (must not exist) or `EXISTS` (must exist)."""


class ValueWithPredicate(NamedTuple):
    value: bytes
    predicate: bytes


class KeyValue(NamedTuple):
    key: bytes
    value: bytes


class Store(abc.ABC):
    """A partitioned, ordered key-value store with compare-and-swap."""

    url: str = ""

    def get(self, partition: bytes, key: bytes) -> ValueWithPredicate:
        """Return the value and the predicate to pass to `set_if`; `NotFound` if absent."""
        check_key(partition, key)
        value = self._get(partition, key)
        return ValueWithPredicate(value, value)

    def set(self, partition: bytes, key: bytes, value: bytes) -> None:
        check_key(partition, key)
        check_value(value)
        self._set(partition, key, value)

    def set_if(
        self,
        partition: bytes,
        key: bytes,
        value: bytes,
        predicate: Predicate,
        *,
        fence: bool = True,
    ) -> None:
        """Write `value` only if `predicate` holds; otherwise raise `PredicateFailed`.

        A swap (`predicate` the bytes last read) is a fence for the guarded writes of the
        key (`set_guarded`): ordered after every one already under way. `fence=False`
        allows a driver to let it pass writes under way, which may then return the value
        it replaced: for a change those writes do not depend on."""
        check_key(partition, key)
        check_value(value)
        if predicate is None:
            self._create(partition, key, value)
        elif predicate is EXISTS:
            self._replace(partition, key, value)
        elif isinstance(predicate, bytes):
            swap = self._swap if fence else self._swap_unfenced
            swap(partition, key, value, predicate)
        else:
            kind = type(predicate).__name__
            raise InvalidArgument(f"predicate must be bytes from get(), None or EXISTS, not {kind}")

    def set_unique_if(
        self,
        partition: bytes,
        key: bytes,
        value: bytes,
        predicate: Predicate,
        *,
        fence: bool = True,
    ) -> None:
        """`set_if` of a value no other writer writes (it names a new id: a commit, a token,
        a lease): a lost reply (`OutcomeUnknown`) is settled by a read, landed when the key
        holds `value`. A read that does not show it settles nothing (the write may still
        land), so the error goes up."""
        try:
            self.set_if(partition, key, value, predicate, fence=fence)
        except OutcomeUnknown:
            if not self.landed(partition, key, value):
                raise

    def create_unique_guarded(
        self,
        partition: bytes,
        key: bytes,
        value: bytes,
        guard: tuple[bytes, bytes],
        expected: bytes,
    ) -> bool:
        """`create_guarded` of a value no other writer writes, a lost reply settled by a
        read as in `set_unique_if`."""
        try:
            return self.create_guarded(partition, key, value, guard, expected)
        except OutcomeUnknown:
            if not self.landed(partition, key, value):
                raise
            return True

    def landed(self, partition: bytes, key: bytes, value: bytes) -> bool:
        """Whether the key holds `value`: how a write of a value no other writer writes,
        whose reply was lost (`OutcomeUnknown`), is settled. False settles nothing: the
        write may still land."""
        try:
            return self._get(partition, key) == value
        except NotFound:
            return False

    def set_guarded(
        self, partition: bytes, key: bytes, value: bytes, guard: tuple[bytes, bytes]
    ) -> bytes:
        """`set`, returning the value the `guard` key (partition, key) holds at a moment the
        write is already applied: a swap of the guard (`set_if` with the value last read,
        a fence unless `fence=False`) or a `delete_if` of it that succeeds after that value
        is ordered after the write, so whoever swaps the guard and then reads sees the write.
        `NotFound` if the guard is absent (the write may then be applied or not).

        Here a `set` then a `get` of the guard, two calls; a driver that can write and read
        in one statement, holding the guard against fences until the write is visible,
        overrides `_set_guarded` (PostgreSQL)."""
        check_key(partition, key)
        check_value(value)
        check_key(*guard)
        return self._set_guarded(partition, key, value, guard)

    def _set_guarded(
        self, partition: bytes, key: bytes, value: bytes, guard: tuple[bytes, bytes]
    ) -> bytes:
        self._set(partition, key, value)
        return self._get(*guard)

    def delete(self, partition: bytes, key: bytes) -> None:
        """Remove the key; deleting an absent key is not an error."""
        check_key(partition, key)
        self._delete(partition, key)

    def delete_if(self, partition: bytes, key: bytes, predicate: bytes) -> None:
        """Remove the key only if it still holds `predicate` (the value last read), else
        `PredicateFailed`: a removal ordered after every `set_if` it did not see."""
        check_key(partition, key)
        if not isinstance(predicate, bytes):
            kind = type(predicate).__name__
            raise InvalidArgument(f"predicate must be bytes from get(), not {kind}")
        self._delete_if(partition, key, predicate)

    def delete_guarded(
        self, partition: bytes, key: bytes, guard: tuple[bytes, bytes], expected: bytes
    ) -> bool:
        """Remove the key only while the `guard` key holds `expected`, in one atomic step: a
        swap of the guard comes wholly before it (and it removes nothing) or wholly after
        it. True if the guard held (the key is then absent, whether or not it was there),
        False if it did not or is gone."""
        check_key(partition, key)
        check_key(*guard)
        check_value(expected)
        return self._delete_guarded(partition, key, guard, expected)

    def create_guarded(
        self,
        partition: bytes,
        key: bytes,
        value: bytes,
        guard: tuple[bytes, bytes],
        expected: bytes,
    ) -> bool:
        """Write `value` only where the key is absent or empty (staging's tombstone) and only
        while the `guard` key holds `expected`, in one atomic step: an exclusive creation
        that a swap of the guard comes wholly before or wholly after. True if written, False
        if the key holds a value while the guard held; `PredicateFailed` if the guard did not
        hold or is gone. Not run again after a lost session (its outcome is then unknown)."""
        check_key(partition, key)
        check_value(value)
        check_key(*guard)
        check_value(expected)
        return self._create_guarded(partition, key, value, guard, expected)

    def scan(
        self, partition: bytes, start: bytes = b"", batch_size: int = DEFAULT_BATCH_SIZE
    ) -> Iterator[KeyValue]:
        """Iterate the partition in ascending byte order from `start` (inclusive).

        Reads `batch_size` keys at a time, so deleting keys while iterating is safe and a
        huge partition is never held in memory.
        """
        _check_scan(partition, start, batch_size)
        return self._batched_scan(partition, start, batch_size)

    def scan_batches(
        self, partition: bytes, start: bytes = b"", batch_size: int = DEFAULT_BATCH_SIZE
    ) -> Iterator[list[tuple[bytes, bytes]]]:
        """`scan`, a list of (key, value) pairs at a time as the driver returns them: for
        callers that turn whole batches into columns, so no Python runs per row."""
        _check_scan(partition, start, batch_size)
        return self._raw_batches(partition, start, batch_size)

    def _raw_batches(
        self, partition: bytes, start: bytes, batch_size: int
    ) -> Iterator[list[tuple[bytes, bytes]]]:
        batch = self._scan_batch(partition, start, True, batch_size)
        while batch:
            yield batch
            if len(batch) < batch_size:
                return
            batch = self._scan_batch(partition, batch[-1][0], False, batch_size)

    def _batched_scan(self, partition: bytes, start: bytes, batch_size: int) -> Iterator[KeyValue]:
        for batch in self._raw_batches(partition, start, batch_size):
            for key, value in batch:
                yield KeyValue(key, value)

    def drop_partition(self, partition: bytes, *, pause: float = 0.0) -> None:
        """Delete every key of a partition, a batch at a time, sleeping `pause` seconds
        between batches so a background drop leaves room for foreground writes.

        Drivers with a cheaper bulk delete override this.
        """
        check_partition(partition)
        while batch := self._scan_batch(partition, b"", True, DEFAULT_BATCH_SIZE):
            for key, _ in batch:
                self._delete(partition, key)
            time.sleep(pause)

    def close(self) -> None:  # noqa: B027 - optional hook; stores without connections keep it
        """Release connections; the store must not be used afterwards."""

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @abc.abstractmethod
    def _get(self, partition: bytes, key: bytes) -> bytes:
        """Return the value or raise `NotFound`."""

    @abc.abstractmethod
    def _set(self, partition: bytes, key: bytes, value: bytes) -> None: ...

    @abc.abstractmethod
    def _create(self, partition: bytes, key: bytes, value: bytes) -> None:
        """Insert only if absent, else `PredicateFailed`."""

    @abc.abstractmethod
    def _replace(self, partition: bytes, key: bytes, value: bytes) -> None:
        """Update only if present, else `PredicateFailed`."""

    @abc.abstractmethod
    def _swap(self, partition: bytes, key: bytes, value: bytes, expected: bytes) -> None:
        """Update only if the stored value equals `expected`, else `PredicateFailed`."""

    def _swap_unfenced(self, partition: bytes, key: bytes, value: bytes, expected: bytes) -> None:
        """`_swap`, which may pass guarded writes under way (only PostgreSQL's does)."""
        self._swap(partition, key, value, expected)

    @abc.abstractmethod
    def _delete(self, partition: bytes, key: bytes) -> None: ...

    @abc.abstractmethod
    def _delete_if(self, partition: bytes, key: bytes, expected: bytes) -> None:
        """Delete only if the stored value equals `expected`, else `PredicateFailed`."""

    @abc.abstractmethod
    def _delete_guarded(
        self, partition: bytes, key: bytes, guard: tuple[bytes, bytes], expected: bytes
    ) -> bool: ...

    def _guard_holds(self, guard: tuple[bytes, bytes], expected: bytes) -> bool:
        """Whether the guard holds `expected` now: what tells a guarded step that changed
        nothing because the guard failed from one that found nothing to do (a guard changed
        since only turns the latter into the former)."""
        try:
            return self._get(*guard) == expected
        except NotFound:
            return False

    def _refused_creation(self, guard: tuple[bytes, bytes], expected: bytes) -> bool:
        """What a guarded creation that wrote nothing returns: False where the guard holds
        (the key holds a value), else `PredicateFailed`."""
        if not self._guard_holds(guard, expected):
            raise guard_failed(guard)
        return False

    @abc.abstractmethod
    def _create_guarded(
        self,
        partition: bytes,
        key: bytes,
        value: bytes,
        guard: tuple[bytes, bytes],
        expected: bytes,
    ) -> bool: ...

    @abc.abstractmethod
    def _scan_batch(
        self, partition: bytes, start: bytes, inclusive: bool, limit: int
    ) -> list[tuple[bytes, bytes]]:
        """Up to `limit` pairs with key >= start (or > start), ascending."""


def _check_scan(partition: object, start: object, batch_size: object) -> None:
    check_partition(partition)
    if not isinstance(start, bytes):
        raise InvalidArgument(f"scan start must be bytes, not {type(start).__name__}")
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise InvalidArgument(f"batch_size must be a positive integer, not {batch_size!r}")


def check_partition(partition: object) -> None:
    if not isinstance(partition, bytes):
        raise InvalidArgument(f"partition must be bytes, not {type(partition).__name__}")
    if not partition:
        raise InvalidArgument("partition must not be empty")


def guard_failed(guard: tuple[bytes, bytes]) -> PredicateFailed:
    return PredicateFailed(f"guard key {guard[1]!r} in partition {guard[0]!r} changed since read")


def key_not_found(partition: bytes, key: bytes) -> NotFound:
    """Every driver's `NotFound` for an absent key, in one wording."""
    return NotFound(f"key {key!r} not found in partition {partition!r}")


def check_key(partition: object, key: object) -> None:
    check_partition(partition)
    if not isinstance(key, bytes):
        raise InvalidArgument(f"key must be bytes, not {type(key).__name__}")
    if not key:
        raise InvalidArgument("key must not be empty")


def check_value(value: object) -> None:
    if not isinstance(value, bytes):
        raise InvalidArgument(f"value must be bytes, not {type(value).__name__}")
