"""Committed addresses, read from the Parquet ranges of every commit, each range once.

Commits share ranges (unchanged ones keep their id), so the job first reads the distinct
metaranges, then the distinct ranges they list; an optimized run subtracts the metaranges and
ranges its base run read, which hold the same addresses as they did then. The tasks that
read the ranges also write the addresses they send on to scratch files, which the gate reads
back rather than Spark caching them.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from branchwater.engine import CommittedLayout
from branchwater.spark_jobs.gc.frames import parallel_frame
from branchwater.spark_jobs.gc.storage import Namespace


@dataclass
class CommittedInput:
    """What the committed listing produced: every metarange and range id known now (sorted),
    how many of each were new since the base run, the addresses (and recorded sizes) of the
    new ranges (all ranges without a base); the tasks that compute `addresses` also write
    them under the `copy_prefix` given to `read_committed`, for the gate."""

    metarange_ids: list[str]
    range_ids: list[str]
    new_metaranges: int
    new_ranges: int
    addresses: DataFrame


FILES_PER_TASK = 64
"""The fewest files a reading task is given (unless there are fewer): an optimized run reads
a handful, and a task's start would cost more than its reads."""
RANGE_ROWS = pa.schema([("range_id", pa.string()), ("min_key", pa.string())])
ADDRESS_ROWS = pa.schema([("address", pa.string()), ("size", pa.int64())])


def read_committed(
    spark: SparkSession,
    ns: Namespace,
    layout: CommittedLayout,
    known_metaranges: set[str],
    known_ranges: set[str],
    partitions: int,
    copy_prefix: str,
) -> CommittedInput:
    """Metaranges and ranges are read by pyarrow on the executors: they are many small files,
    for which Spark's own reader would first stat every path (and run a listing job).

    The new ranges are handed to tasks in key order, so the versions of one key range
    (commits rewrite the ranges they change, and keep the id of the others) mostly meet in
    one task, which sends each address on once. Each task also writes its addresses to a
    file of its own under `copy_prefix`: the gate checks the candidates against them, where
    caching them in Spark (which the mark reads once) would cost more than the file."""
    all_metaranges = layout.metarange_ids()
    new_metaranges = [m for m in all_metaranges if m not in known_metaranges]
    first_keys = _listed_ranges(spark, ns, layout, new_metaranges, partitions)
    found = set(first_keys)
    new_ranges = sorted(found - known_ranges, key=lambda r: (first_keys[r], r))
    files = _files_frame(spark, [layout.range_key(r) for r in new_ranges], partitions)
    columns = [layout.range_address_column, layout.range_size_column]
    addresses = files.mapInArrow(
        partial(_distinct_addresses, ns, columns, copy_prefix), "address string, size long"
    )
    return CommittedInput(
        sorted(set(all_metaranges) | known_metaranges),
        sorted(found | known_ranges),
        len(new_metaranges),
        len(new_ranges),
        addresses,
    )


def _listed_ranges(
    spark: SparkSession,
    ns: Namespace,
    layout: CommittedLayout,
    metaranges: list[str],
    partitions: int,
) -> dict[str, str]:
    """The ranges `metaranges` list, with each one's first key; no Spark job for none (an
    optimized run after no new commit)."""
    if not metaranges:
        return {}
    files = _files_frame(spark, [layout.metarange_key(m) for m in metaranges], partitions)
    columns = [layout.metarange_range_column, layout.metarange_min_key_column]
    ranges = partial(_distinct_ranges, ns, columns)
    listed = files.mapInArrow(ranges, "range_id string, min_key string")
    return {row[0]: row[1] for row in listed.collect()}


def _files_frame(spark: SparkSession, keys: list[str], partitions: int) -> DataFrame:
    tasks = min(partitions, math.ceil(len(keys) / FILES_PER_TASK))
    return parallel_frame(spark, keys, "key", max(1, tasks))


def _distinct_ranges(
    ns: Namespace, columns: list[str], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    yield from _distinct(ns, columns, RANGE_ROWS, "min", _task_keys(batches)).to_batches()


def _distinct_addresses(
    ns: Namespace, columns: list[str], copy_prefix: str, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """Each address of the task's ranges once, with the size its entries record (what the
    summary counts for a committed object the listing did not stat); written first to a
    file named after the task's first range (a retried task writes the same file again)."""
    keys = _task_keys(batches)
    if not keys:
        return
    rows = _distinct(ns, columns, ADDRESS_ROWS, "max", keys)
    ns.write_parquet(
        f"{copy_prefix}/{keys[0].rsplit('/', 1)[-1]}.parquet", rows.select(["address"])
    )
    yield from rows.to_batches()


def _task_keys(batches: Iterator[pa.RecordBatch]) -> list[str]:
    return [key for batch in batches for key in batch.column(0).to_pylist()]


def _distinct(
    ns: Namespace, columns: list[str], schema: pa.Schema, how: str, keys: list[str]
) -> pa.Table:
    """The rows of the files `keys`, named as `schema`, one per value of its first column,
    the second aggregated by `how`: commits share most ranges, and ranges most addresses, so
    far fewer rows leave the task than it read."""
    read = list(ns.read_parquet_files(keys, columns))
    if not read:
        return schema.empty_table()
    key, value = schema.names
    rows = pa.Table.from_batches(read).rename_columns(schema.names)
    distinct = rows.group_by(key, use_threads=False).aggregate([(value, how)])
    return distinct.rename_columns(schema.names).cast(schema)
