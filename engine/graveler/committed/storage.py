"""Ranges and metaranges by id in one storage namespace: stored once, verified when read.

Every id read from storage is checked against its content, so a damaged or missing object
surfaces as `CorruptedData` naming its key, never as wrong data. Verified objects are kept
in bounded in-process caches (ranges as Arrow tables, metaranges as their rows) and, when a
`RangeCache` is given, ranges also on local disk for the machine's other processes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pyarrow as pa

from branchwater.engine.background import Background
from branchwater.engine.errors import (
    CorruptedData,
    InvalidArgument,
    NotFound,
    OutcomeUnknown,
    Unavailable,
)
from branchwater.engine.graveler.committed.format import (
    EMPTY_METARANGE_ID,
    METARANGE_SCHEMA,
    RANGE_SCHEMA,
    RangeInfo,
    check_id,
    decode_metarange,
    metarange_key,
    metarange_to_parquet,
    range_key,
    range_to_parquet,
    read_parquet,
)
from branchwater.engine.graveler.committed.format import metarange_id as id_of_metarange
from branchwater.engine.graveler.committed.format import range_id as id_of_range
from branchwater.engine.graveler.committed.range_cache import RangeCache
from branchwater.engine.lru import LRU
from branchwater.engine.objects import ObjectStore

STORE_THREADS = 4
"""Threads a namespace's ranges are stored on, shared by every writer of the process."""

RANGES_IN_MEMORY_BYTES = 128 << 20
"""What a process keeps of recently used ranges in memory: a commit keeps every range it
writes, so a count alone let a commit of 1M entries hold all its 50 or so ranges and one of
larger ranges far more; the machine's range cache on disk serves what falls out."""


def _nbytes(table: pa.Table) -> int:
    return int(table.nbytes)


class RangeStorage:
    """Puts and gets ranges and metaranges of one namespace by id; see the module docstring.

    `cache_size` bounds each in-process cache (ranges, metaranges) in objects; 0 turns them off.
    """

    def __init__(
        self, objects: ObjectStore, cache_size: int = 64, disk_cache: RangeCache | None = None
    ) -> None:
        if cache_size < 0:
            raise InvalidArgument(f"cache_size must be >= 0, not {cache_size}")
        self.objects = objects
        self.disk_cache = disk_cache
        self._ranges: LRU[str, pa.Table] = LRU(cache_size, _nbytes, RANGES_IN_MEMORY_BYTES)
        self._metaranges: LRU[str, tuple[RangeInfo, ...]] = LRU(cache_size)
        self.storing = Background(STORE_THREADS, "range-store")
        """The threads ranges are stored on, kept until `close`, so that no commit pays for
        starting and joining them."""

    def close(self) -> None:
        """Stop the storing threads once their ranges are stored; a later write raises
        `LakeClosed` rather than start them again."""
        self.storing.close()

    def put_range(self, table: pa.Table) -> tuple[str, bool]:
        """Store a range unless its id is stored already; return (id, whether written).

        The range is cached as well: a merge retry or a diff right after a commit reads
        the ranges it just produced, and they are known to match their id.
        """
        range_id = id_of_range(table)
        written = self._put(range_key(range_id), lambda: range_to_parquet(table))
        self._keep(range_id, table)
        return range_id, written

    def put_metarange(self, rows: Sequence[RangeInfo]) -> str:
        """Store a metarange listing `rows` unless stored already; return its id."""
        metarange_id = id_of_metarange(rows)
        self._put(metarange_key(metarange_id), lambda: metarange_to_parquet(rows))
        self._metaranges.put(metarange_id, tuple(rows))
        return metarange_id

    def _put(self, key: str, encode: Callable[[], bytes]) -> bool:
        """`put_if_absent` of content named by its hash, a lost reply told as what it means
        here: nothing names the object yet, so the commit, merge or compaction that needed
        it stops before it records anything, and is to be run again (whether the object
        landed changes nothing: a later write finds it or writes it)."""
        try:
            return self.objects.put_if_absent(key, encode)
        except OutcomeUnknown as exc:
            raise Unavailable(
                f"storing {key!r} in {self.objects.url} got no reply, so nothing was "
                "recorded (no commit, no branch moved): try again"
            ) from exc

    def metarange(self, metarange_id: str) -> tuple[RangeInfo, ...]:
        """A metarange's rows in key order, verified (cached)."""
        check_id("metarange", metarange_id)
        if metarange_id == EMPTY_METARANGE_ID:
            return ()
        rows = self._metaranges.get(metarange_id)
        if rows is None:
            key = metarange_key(metarange_id)
            rows = tuple(decode_metarange(self._decode(key, METARANGE_SCHEMA)))
            if id_of_metarange(rows) != metarange_id:
                raise self._corrupted(key, "its content does not match its id")
            self._metaranges.put(metarange_id, rows)
        return rows

    def range_table(self, range_id: str) -> pa.Table:
        """One range as a verified Arrow table (cached), from memory, disk cache or storage."""
        table = self._ranges.get(range_id)
        if table is not None:
            return table
        check_id("range", range_id)
        table = self.disk_cache.get(range_id) if self.disk_cache is not None else None
        if table is not None:
            self._ranges.put(range_id, table)
            return table
        key = range_key(range_id)
        table = self._decode(key, RANGE_SCHEMA)
        if id_of_range(table) != range_id:
            raise self._corrupted(key, "its content does not match its id")
        self._keep(range_id, table)
        return table

    def _keep(self, range_id: str, table: pa.Table) -> None:
        """Cache a range known to match its id, in this process and on disk."""
        self._ranges.put(range_id, table)
        if self.disk_cache is not None:
            self.disk_cache.put(range_id, table)

    def _decode(self, key: str, schema: pa.Schema) -> pa.Table:
        try:
            data = self.objects.get(key)
        except NotFound:
            raise self._corrupted(
                key, "it is missing, yet a metarange or commit refers to it"
            ) from None
        try:
            return read_parquet(data, schema)
        except (pa.ArrowException, ValueError, OSError) as exc:
            raise self._corrupted(key, f"it cannot be decoded ({exc})") from exc

    def _corrupted(self, key: str, reason: str) -> CorruptedData:
        return CorruptedData(f"committed object {key!r} in {self.objects.url}: {reason}")
