"""Committed addresses, read from the Parquet ranges of every commit, each range once.

Commits share ranges (unchanged ones keep their id), so the job first reads the distinct
metaranges, then the distinct ranges they list; an optimized run subtracts the metaranges and
ranges its base run read, which hold the same addresses as they did then.
"""

from __future__ import annotations

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
    how many of each were new since the base run, and the addresses (and recorded sizes) of
    the new ranges (all ranges without a base)."""

    metarange_ids: list[str]
    range_ids: list[str]
    new_metaranges: int
    new_ranges: int
    addresses: DataFrame


def read_committed(
    spark: SparkSession,
    ns: Namespace,
    layout: CommittedLayout,
    known_metaranges: set[str],
    known_ranges: set[str],
    partitions: int,
) -> CommittedInput:
    """Metaranges and ranges are read by pyarrow on the executors: they are many small files,
    for which Spark's own reader would first stat every path (and run a listing job).

    The new ranges are handed to tasks in key order, so the versions of one key range
    (commits rewrite the ranges they change, and keep the id of the others) mostly meet in
    one task, which sends each address on once."""
    all_metaranges = layout.metarange_ids()
    new_metaranges = [m for m in all_metaranges if m not in known_metaranges]
    metarange_files = parallel_frame(
        spark, [layout.metarange_key(m) for m in new_metaranges], "key", partitions
    )
    columns = [layout.metarange_range_column, layout.metarange_min_key_column]
    ranges = partial(_distinct_rows, ns, columns, ["range_id", "min_key"], "min")
    listed = metarange_files.mapInArrow(ranges, "range_id string, min_key string")
    first_keys = {row[0]: row[1] for row in listed.collect()}
    found = set(first_keys)
    new_ranges = sorted(found - known_ranges, key=lambda r: (first_keys[r], r))
    files = parallel_frame(spark, [layout.range_key(r) for r in new_ranges], "key", partitions)
    columns = [layout.range_address_column, layout.range_size_column]
    addresses = files.mapInArrow(
        partial(_distinct_rows, ns, columns, ["address", "size"], "max"),
        "address string, size long",
    )
    return CommittedInput(
        sorted(set(all_metaranges) | known_metaranges),
        sorted(found | known_ranges),
        len(new_metaranges),
        len(new_ranges),
        addresses,
    )


def _distinct_rows(
    ns: Namespace,
    columns: list[str],
    names: list[str],
    how: str,
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    """The task's files' rows, renamed `names`, one per value of the first column, the
    second aggregated by `how`: commits share most ranges, and ranges most addresses, so
    far fewer rows leave the task than it read."""
    keys = [key for batch in batches for key in batch.column(0).to_pylist()]
    read = list(ns.read_parquet_files(keys, columns))
    if read:
        rows = pa.Table.from_batches(read).rename_columns(names)
        distinct = rows.group_by(names[0], use_threads=False).aggregate([(names[1], how)])
        yield from distinct.rename_columns(names).to_batches()
