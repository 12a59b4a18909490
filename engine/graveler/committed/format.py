"""The on-storage format of committed data: ranges and metaranges as Parquet, and their ids.

A **range** is a Parquet file of entries sorted by path; a **metarange** is a Parquet file
listing ranges in key order. Both are content-addressed, and the ids hash the *logical*
content (the values, in order), never the Parquet bytes: another pyarrow version may encode
the same rows differently, and the ids must not change with it, or ranges written before an
upgrade would stop being reused after it.

The range id covers every stored column, mtime included, so an id names exactly one content:
whoever reads a range by id gets the same rows, whichever process wrote it first.

Range boundaries depend on content (see `RangePolicy`): the same sorted entries always split
into the same ranges, so a change re-chunks only its neighbourhood and every other range keeps
its id. That is what lets commits and merges reuse ranges by id without reading them.
"""

from __future__ import annotations

import functools
import hashlib
import json
import sys
from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from itertools import repeat
from typing import NamedTuple, Protocol

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from branchwater.engine.errors import CorruptedData, InvalidArgument
from branchwater.engine.graveler.model import (
    EMPTY_METADATA,
    STAGED_FIELDS,
    STAGED_SEPARATOR,
    Entry,
    metadata_json,
)
from branchwater.engine.graveler.names import is_hex_id
from branchwater.engine.units import EPOCH

RANGES_PREFIX = "_branchwater/ranges/"
METARANGES_PREFIX = "_branchwater/metaranges/"

_RANGE_FORMAT = b"branchwater/range/v1"
_METARANGE_FORMAT = b"branchwater/metarange/v1"
_FORMAT_KEY = b"branchwater.format"

UTC_MICROS = pa.timestamp("us", tz="UTC")
RANGE_SCHEMA = pa.schema(
    [
        pa.field("path", pa.string(), nullable=False),
        pa.field("address", pa.string(), nullable=False),
        pa.field("size", pa.int64(), nullable=False),
        pa.field("checksum", pa.string(), nullable=False),
        pa.field("mtime", UTC_MICROS, nullable=False),
        pa.field("metadata", pa.string(), nullable=False),
    ],
    metadata={_FORMAT_KEY: _RANGE_FORMAT},
)
EMPTY_RANGE = pa.Table.from_batches([], schema=RANGE_SCHEMA)
"""A range table with no rows."""
IDENTITY_COLUMNS = ("size", "checksum", "metadata")
"""The stored columns of `Entry.identity()`: metadata is stored as the same canonical JSON."""
PHYSICAL_COLUMNS = ("address", *IDENTITY_COLUMNS)
"""Identity and the object it is stored in: what garbage collection must compare, since two
entries of equal content at different addresses keep two objects alive."""


def identities_differ(
    old: pa.Table, new: pa.Table, compared: Sequence[str] = IDENTITY_COLUMNS
) -> pa.Array:
    """Row for row, whether two tables of entries hold different objects (`Entry.identity`
    compared in Arrow, without decoding a row; `compared` may add the address)."""
    return functools.reduce(
        pc.or_, (pc.not_equal(old.column(name), new.column(name)) for name in compared)
    )


METARANGE_SCHEMA = pa.schema(
    [
        pa.field("range_id", pa.string(), nullable=False),
        pa.field("min_key", pa.string(), nullable=False),
        pa.field("max_key", pa.string(), nullable=False),
        pa.field("count", pa.int64(), nullable=False),
        pa.field("size_bytes", pa.int64(), nullable=False),
    ],
    metadata={_FORMAT_KEY: _METARANGE_FORMAT},
)


class _Digest(Protocol):
    def update(self, data: bytes | memoryview, /) -> None: ...


ENTRY_OVERHEAD = 16
"""Logical bytes of an entry's two integers (size, mtime), added to its strings' UTF-8 bytes."""


def entry_sizes(table: pa.Table) -> pa.Array:
    """Each row's logical size: UTF-8 bytes of its strings plus `ENTRY_OVERHEAD`.

    Deterministic (unlike Parquet bytes), so range cuts and `RangeInfo.size_bytes` are too.
    """
    total = pa.scalar(ENTRY_OVERHEAD, pa.int64())
    for name in ("path", "address", "checksum", "metadata"):
        total = pc.add(total, pc.binary_length(table.column(name)).cast(pa.int64()))
    return total.combine_chunks() if isinstance(total, pa.ChunkedArray) else total


def boundary_indexes(paths: Sequence[str], target_entries: int) -> list[int]:
    """Indexes of the paths after which the hash rule ends a range."""
    return _hash_rule_hits([path.encode() for path in paths], target_entries)


def boundary_rows(paths: pa.Array | pa.ChunkedArray, target_entries: int) -> list[int]:
    """`boundary_indexes` of an Arrow column, whose UTF-8 bytes are hashed as stored."""
    return _hash_rule_hits(paths.cast(pa.binary()).to_pylist(), target_entries)


_PATH_HASH = hashlib.blake2b(digest_size=8)
"""The empty hasher of the hash rule: copying it costs less than constructing one."""
_HASHER = type(_PATH_HASH)
_HASHED_AT_ONCE = 8192
"""Paths hashed per pass: a hasher takes about 0.5 kB while it is alive."""


def _hash_rule_hits(encoded: Sequence[bytes], target_entries: int) -> list[int]:
    """Where paths are hashed (`RangePolicy.is_boundary` hashes one path alike): a stable
    64-bit BLAKE2b (Python's `hash` is salted per process), read big-endian, is 0 modulo
    `target_entries`."""
    hits: list[int] = []
    for start in range(0, len(encoded), _HASHED_AT_ONCE):
        part = encoded[start : start + _HASHED_AT_ONCE]
        hits += (start + i for i in _multiple_indexes(_path_hashes(part), target_entries))
    return hits


def _path_hashes(encoded: Sequence[bytes]) -> pa.Array:
    """The paths' 64-bit hashes. It runs once per written entry, so no Python frame runs per
    path: the hashers are copied, fed and read by `map`."""
    hashers = list(map(_HASHER.copy, repeat(_PATH_HASH, len(encoded))))
    deque(map(_HASHER.update, hashers, encoded), maxlen=0)
    digests = array("Q", b"".join(map(_HASHER.digest, hashers)))
    if sys.byteorder == "little":
        digests.byteswap()
    return pa.Array.from_buffers(pa.uint64(), len(digests), [None, pa.py_buffer(digests)])


def _multiple_indexes(values: pa.Array, target_entries: int) -> list[int]:
    """Indexes of the values that are 0 modulo `target_entries`, in Arrow (which has no
    modulo in every supported version); a target beyond 64 bits divides only 0."""
    zero = pa.scalar(0, pa.uint64())
    if target_entries >> 64:
        return pc.indices_nonzero(pc.equal(values, zero)).to_pylist()
    target = pa.scalar(target_entries, pa.uint64())
    remainder = pc.subtract(values, pc.multiply(pc.divide(values, target), target))
    return pc.indices_nonzero(pc.equal(remainder, zero)).to_pylist()


@dataclass(frozen=True)
class RangePolicy:
    """Where ranges end: after an entry whose path hash is 0 modulo `target_entries`, or when
    the range reaches `max_entries` entries or `max_bytes` of logical size.

    The hash rule makes a cut depend only on the entry at the cut, so after a change the
    writer falls back in step with the old ranges; the caps bound a range when paths are
    unlucky. A repository must keep one policy: ranges written under another still read and
    apply correctly, but are not re-chunked, so ids stop matching a from-scratch write.
    """

    target_entries: int = 20_000
    max_entries: int = 100_000
    max_bytes: int = 32 * 1024 * 1024

    def __post_init__(self) -> None:
        for name in ("target_entries", "max_entries", "max_bytes"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise InvalidArgument(f"RangePolicy.{name} must be a positive int, not {value!r}")

    def is_boundary(self, path: str) -> bool:
        """True if a range ends after `path` whatever came before it in the range. Asked once
        per kept range of every apply, for one path: hashed without Arrow, whose fixed cost
        per pass, paid for each of a table's few hundred ranges, would weigh on every commit."""
        hasher = _PATH_HASH.copy()
        hasher.update(path.encode())
        return int.from_bytes(hasher.digest(), "big") % self.target_entries == 0

    def closes(self, info: RangeInfo) -> bool:
        """True if a writer starting this range's entries afresh would end a range exactly there.

        A range that ended only because its input ended (the last of a metarange) is not
        closed: entries appended after it belong in the same range, so it cannot be reused.
        """
        return (
            info.entry_count >= self.max_entries
            or info.size_bytes >= self.max_bytes
            or self.is_boundary(info.max_key)
        )


class RangeInfo(NamedTuple):
    """A metarange row: enough to skip a range (bounds) or reuse it (id) without opening it.

    `entry_count` is stored in the metarange's `count` column: the stored format, and so the
    metarange ids, do not depend on the Python field names.
    """

    range_id: str
    min_key: str
    max_key: str
    entry_count: int
    size_bytes: int


def range_key(range_id: str) -> str:
    return RANGES_PREFIX + range_id


def metarange_key(metarange_id: str) -> str:
    return METARANGES_PREFIX + metarange_id


def check_id(kind: str, object_id: object) -> str:
    """Ids become object keys; reject anything but a SHA-256 hex digest."""
    if not isinstance(object_id, str) or not is_hex_id(object_id):
        raise InvalidArgument(f"{kind} id must be 64 lowercase hex digits, not {object_id!r}")
    return object_id


# --- ranges -------------------------------------------------------------------------------


def build_range(entries: Sequence[Entry]) -> pa.Table:
    """A range table from entries: one pyarrow conversion per column, no per-entry Python
    beyond the metadata JSON of entries that have metadata."""
    paths, addresses, sizes, checksums, mtimes, metadata = zip(*entries, strict=True)
    texts = [metadata_json(m) for m in metadata]
    values = (paths, addresses, sizes, checksums, mtimes, texts)
    where = f"between {paths[0]!r} and {paths[-1]!r}"
    columns = [_column(field, v, where) for field, v in zip(RANGE_SCHEMA, values, strict=True)]
    return pa.Table.from_arrays(columns, schema=RANGE_SCHEMA)


def _column(field: pa.Field, values: Sequence[object], where: str) -> pa.Array:
    """One column; a bad value becomes `InvalidArgument` naming the field, not an Arrow error."""
    try:
        column = pa.array(values, field.type)
    except (pa.ArrowException, TypeError, ValueError, OverflowError) as exc:
        raise InvalidArgument(f"entry {field.name} {where}: {exc}") from exc
    if column.null_count:
        raise InvalidArgument(f"entry {field.name} {where} must not be None")
    return column


def range_id(table: pa.Table) -> str:
    """SHA-256 over the range's values, column by column, each length-prefixed.

    Hashing Arrow buffers (fixed by the Arrow format, not by a library version) keeps this
    vectorised: a per-entry Python encoding would cost more than writing the Parquet file.
    """
    digest = hashlib.sha256(_RANGE_FORMAT)
    digest.update(table.num_rows.to_bytes(8, "little"))
    for name in RANGE_SCHEMA.names:
        column = table.column(name).combine_chunks()
        digest.update(name.encode() + b"\x00")
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            _hash_strings(digest, column)
        else:
            _hash_int64(digest, column.cast(pa.int64()))
    return digest.hexdigest()


def _hash_strings(digest: _Digest, column: pa.Array) -> None:
    """Lengths (int64, little-endian) then the UTF-8 bytes, so no separator can be forged.

    The bytes are hashed in place, between the first and last offsets, whatever the offset
    width (Parquet reads give 32-bit, other producers 64-bit): no copy of the data.
    """
    _hash_int64(digest, pc.binary_length(column).cast(pa.int64()))
    width = 8 if pa.types.is_large_string(column.type) else 4
    _, offsets, data = column.buffers()
    first, last = column.offset, column.offset + len(column)
    view = memoryview(offsets)
    start, end = (
        int.from_bytes(view[i * width : (i + 1) * width], "little", signed=True)
        for i in (first, last)
    )
    if end > start and data is not None:
        digest.update(memoryview(data)[start:end])


def _hash_int64(digest: _Digest, column: pa.Array) -> None:
    """The values buffer as stored: Arrow buffers are little-endian on every supported host."""
    data = column.buffers()[1]
    if data is not None and len(column):
        digest.update(memoryview(data)[column.offset * 8 : (column.offset + len(column)) * 8])


def range_to_parquet(table: pa.Table) -> bytes:
    """Parquet bytes of a range; statistics on `path` let Spark prune by key."""
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink, compression="zstd", use_dictionary=["metadata"])
    return sink.getvalue().to_pybytes()


def decode_entries(table: pa.Table, start: int = 0, stop: int | None = None) -> list[Entry]:
    """Entries of rows [start, stop): one pass per column, then tuples built in C
    (`tuple.__new__` is what `Entry._make` calls, without a Python frame per entry).

    mtime goes through int64 microseconds because pyarrow's own datetime conversion with a
    time zone is slower; the result is a tz-aware UTC datetime either way. Each is the epoch
    plus `timedelta(0, 0, us)` made by `map`: positional, since keywords cost a dict a row.
    """
    part = table.slice(start, None if stop is None else stop - start)
    micros = part.column("mtime").cast(pa.int64()).to_pylist()
    mtimes = map(EPOCH.__add__, map(timedelta, repeat(0), repeat(0), micros))
    metadata = [json.loads(m) if m else EMPTY_METADATA for m in part.column("metadata").to_pylist()]
    return list(
        map(
            tuple.__new__,
            repeat(Entry),
            zip(
                part.column("path").to_pylist(),
                part.column("address").to_pylist(),
                part.column("size").to_pylist(),
                part.column("checksum").to_pylist(),
                mtimes,
                metadata,
                strict=True,
            ),
        )
    )


CHANGE_SCHEMA = RANGE_SCHEMA.append(pa.field("deleted", pa.bool_(), nullable=False))
"""Changes to apply, as rows: a range row and whether the path is deleted (a deleted row's
other columns are placeholders). Applying them row batch by row batch keeps per-entry
Python out of commits and compactions."""

_TOMBSTONE_FIELDS = pa.scalar(
    STAGED_SEPARATOR.join("0" if name in ("size", "mtime_us") else "" for name in STAGED_FIELDS),
    pa.string(),
)
"""What a tombstone (an empty staged value) is split as: empty strings and zeros."""


_STAGED_ROW = pa.struct([("path", pa.binary()), ("value", pa.binary())])
"""A staged row as the KV returns it: converted to Arrow whole, never split in Python."""


class StagedFields(NamedTuple):
    """Staged values split in Arrow: whether each is a tombstone (its other fields then empty
    strings and zeros), and one array per field of `model.STAGED_FIELDS`."""

    deleted: pa.Array
    address: pa.Array
    size: pa.Array
    checksum: pa.Array
    mtime: pa.Array
    metadata: pa.Array


def split_staged(values: pa.Array) -> StagedFields:
    """`model.decode_entry` vectorised, for commits, compactions and GC's prepare alike;
    `ValueError` or an Arrow error for a value that is no staged entry."""
    text = values.cast(pa.string())
    deleted = pc.equal(pc.binary_length(text), 0)
    fields = pc.split_pattern(pc.if_else(deleted, _TOMBSTONE_FIELDS, text), STAGED_SEPARATOR)
    count = len(STAGED_FIELDS)
    lengths = pc.min_max(pc.list_value_length(fields)).as_py()
    if len(values) and lengths != {"min": count, "max": count}:
        raise ValueError(f"a staged value has not {count} fields")
    address, size, checksum, mtime, metadata = (pc.list_element(fields, i) for i in range(count))
    return StagedFields(
        deleted,
        address,
        size.cast(pa.int64()),
        checksum,
        mtime.cast(pa.int64()).cast(UTC_MICROS),
        metadata,
    )


def staged_rows(pairs: Sequence[tuple[bytes, bytes]]) -> pa.Table:
    """Change rows from staged (path, value) pairs as the KV holds them, values split in
    Arrow (`split_staged`), an empty value (a tombstone) a deleted row."""
    try:
        staged = pa.array(pairs, _STAGED_ROW)
        path = staged.field("path").cast(pa.string())
        f = split_staged(staged.field("value"))
    except (pa.ArrowException, ValueError) as exc:
        where = f"{pairs[0][0]!r} to {pairs[-1][0]!r}" if len(pairs) else "a batch"
        raise CorruptedData(f"staged entries {where} cannot be decoded: {exc}") from exc
    arrays = [path, f.address, f.size, f.checksum, f.mtime, f.metadata, f.deleted]
    return pa.Table.from_arrays(arrays, schema=CHANGE_SCHEMA)


def path_at(table: pa.Table, row: int) -> str:
    return table.column("path")[row].as_py()


def count_below(paths: pa.Array | pa.ChunkedArray, key: str, inclusive: bool = False) -> int:
    """How many of the sorted paths are < `key` (<= if inclusive): the index a binary search
    would find, computed in one vectorised pass."""
    if not key:
        return 0
    compare = pc.less_equal if inclusive else pc.less
    return pc.sum(compare(paths, pa.scalar(key, pa.string()))).as_py() or 0


# --- metaranges ---------------------------------------------------------------------------


def metarange_id(rows: Sequence[RangeInfo]) -> str:
    """SHA-256 over the rows as canonical JSON: few rows, so clarity beats speed here."""
    text = json.dumps([list(row) for row in rows], separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(_METARANGE_FORMAT + b"\n" + text.encode()).hexdigest()


EMPTY_METARANGE_ID = metarange_id(())
"""The id of the metarange with no ranges; readers know it without reading storage."""


def metarange_to_parquet(rows: Sequence[RangeInfo]) -> bytes:
    columns = list(zip(*rows, strict=True)) if rows else [()] * len(METARANGE_SCHEMA)
    arrays = [
        pa.array(values, field.type)
        for values, field in zip(columns, METARANGE_SCHEMA, strict=True)
    ]
    sink = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_arrays(arrays, schema=METARANGE_SCHEMA), sink, compression="zstd")
    return sink.getvalue().to_pybytes()


def read_parquet(data: bytes, schema: pa.Schema) -> pa.Table:
    """Decode Parquet bytes and insist on the expected columns and types.

    Raises pyarrow's or `ValueError` on anything else; callers turn that into `CorruptedData`
    with the object's key, which only they know.
    """
    table = pq.ParquetFile(pa.BufferReader(data), pre_buffer=False).read(use_threads=False)
    expected = schema.metadata[_FORMAT_KEY]
    found = (table.schema.metadata or {}).get(_FORMAT_KEY)
    if found != expected:
        raise ValueError(f"format is {found!r}, expected {expected.decode()}")
    return table.select(schema.names).cast(schema).combine_chunks()


def decode_metarange(table: pa.Table) -> list[RangeInfo]:
    columns = [table.column(name).to_pylist() for name in METARANGE_SCHEMA.names]
    return list(map(RangeInfo._make, zip(*columns, strict=True)))
