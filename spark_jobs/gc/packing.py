"""The mark's shuffle carries addresses packed by slice: one row per slice and reading task,
holding that slice's addresses as an Arrow IPC stream, instead of one row per address.

Spark turns each row a Python task yields into a row of its own, and back into Arrow for
the task that receives it; for the million addresses of a clean run that cost more than
reading them. A row per slice pays it once per slice, and the addresses cross the shuffle
as bytes. The tasks that read an input pack what they read (the range readers, and
`packed_files` for the sets read from Parquet files), and the mark's tasks unpack it (see
`marking`).
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession

from branchwater.engine.gc.runs.layout import named_slices
from branchwater.engine.gc.runs.storage import Namespace
from branchwater.spark_jobs.gc.frames import arrow_schema, map_shares

PACKED_DDL = "slice string, sources int, rows binary"
"""The key of the mark's shuffle (a slice), the bit of the set the rows were read from,
and the rows: an Arrow IPC stream with an `address` column and whichever of `size` and
`mtime` the set has (null for a slice to list)."""
PACKED_SCHEMA = arrow_schema(PACKED_DDL)
ROWS_PER_PACK = 20_000
"""The most addresses one packed row holds (some 2 MB): a large slice is split over
several rows, so that a batch of them stays far below Arrow's 2 GB bound on one array.
(Spark cuts the batches it sends to a task at `spark.sql.execution.arrow.maxBytesPerBatch`,
64 MB by default.)"""
BATCHES_OF = 32
"""Packed rows per Arrow batch a packing task yields (see `ROWS_PER_PACK`)."""


def slice_key(addresses: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """The slice each address names: `""` for one that names none (a malformed address,
    which the mark refuses wherever it lands)."""
    return pc.fill_null(named_slices(addresses), "")


def pack(table: pa.Table, bit: int) -> Iterator[pa.RecordBatch]:
    """The rows of `table` (addresses read from set `bit`) as packed rows, by slice."""
    if table.num_rows == 0:
        return
    keys = pc.dictionary_encode(slice_key(table.column("address"))).combine_chunks()
    codes = keys.indices.to_numpy(zero_copy_only=False)
    order = np.argsort(codes, kind="stable")
    ranked, codes = table.take(pa.array(order)), codes[order]
    starts = np.flatnonzero(np.diff(codes, prepend=-1)).tolist()
    names = keys.dictionary.to_pylist()
    packs: list[tuple[str, pa.Table]] = []
    for start, end in zip(starts, [*starts[1:], len(codes)], strict=True):
        for first in range(start, end, ROWS_PER_PACK):
            rows = ranked.slice(first, min(end - first, ROWS_PER_PACK))
            packs.append((names[codes[start]], rows))
    for first in range(0, len(packs), BATCHES_OF):
        yield _packed_batch(packs[first : first + BATCHES_OF], bit)


def packed_files(
    spark: SparkSession,
    ns: Namespace,
    keys: list[str],
    schema: pa.Schema,
    bit: int,
    partitions: int,
) -> DataFrame:
    """The addresses of a set's Parquet files (the columns of `schema`), read and packed by the
    executors' Python (Spark's own reader would hand them to Python row by row)."""
    return map_shares(spark, keys, partial(_pack_files, ns, schema, bit), PACKED_DDL, partitions)


def unpacked(batch: pa.RecordBatch) -> Iterator[tuple[str, int, pa.Table | None]]:
    """Each packed row of `batch`: its slice, its bit, and its rows (None for a slice to
    list)."""
    slices = batch.column(0).to_pylist()
    bits = batch.column(1).to_pylist()
    blobs = batch.column(2)
    for row, (name, bit) in enumerate(zip(slices, bits, strict=True)):
        blob = blobs[row]
        rows = pa.ipc.open_stream(blob.as_buffer()).read_all() if blob.is_valid else None
        yield name, bit, rows


def _pack_files(
    ns: Namespace, schema: pa.Schema, bit: int, keys: list[str]
) -> Iterator[pa.RecordBatch]:
    yield from pack(ns.read_table(keys, schema), bit)


def _packed_batch(packs: list[tuple[str, pa.Table]], bit: int) -> pa.RecordBatch:
    """The packs as rows, their IPC streams written one after another into one buffer that
    is the binary column's data."""
    sink = pa.BufferOutputStream()
    offsets = [0]
    for _, rows in packs:
        with pa.ipc.new_stream(sink, rows.schema) as writer:
            writer.write_table(rows)
        offsets.append(sink.tell())
    ends = pa.array(offsets, pa.int32()).buffers()[1]
    blobs = pa.Array.from_buffers(pa.binary(), len(packs), [None, ends, sink.getvalue()])
    slices = pa.array([name for name, _ in packs], pa.string())
    bits = pa.repeat(pa.scalar(bit, pa.int32()), len(packs))
    return pa.record_batch([slices, bits, blobs], schema=PACKED_SCHEMA)
