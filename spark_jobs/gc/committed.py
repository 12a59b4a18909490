"""Committed addresses, read from the Parquet ranges of every commit, each range once.

Commits share ranges (unchanged ones keep their id), so the job first reads the distinct
metaranges, then the distinct ranges they list; an optimized run subtracts the metaranges and
ranges its base run read, which hold the same addresses as they did then.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession

from branchwater.engine import CommittedLayout
from branchwater.spark_jobs.gc.frames import parallel_frame, read_parquet
from branchwater.spark_jobs.gc.storage import Namespace


@dataclass
class CommittedInput:
    """What the committed listing produced: every metarange and range id known now, and the
    addresses of the ranges that are new since the base run (all ranges without one)."""

    metaranges: DataFrame
    ranges: DataFrame
    new_ranges: DataFrame
    addresses: DataFrame
    new_metarange_count: int
    new_range_count: int


def read_committed(
    spark: SparkSession,
    ns: Namespace,
    layout: CommittedLayout,
    known_metaranges: DataFrame | None,
    known_ranges: DataFrame | None,
    partitions: int,
) -> CommittedInput:
    all_ids = layout.metarange_ids()
    metaranges = parallel_frame(spark, all_ids, "metarange_id", partitions)
    new_ids = all_ids
    if known_metaranges is not None:
        known = {row.metarange_id for row in known_metaranges.collect()}
        new_ids = [m for m in all_ids if m not in known]
        metaranges = metaranges.unionByName(known_metaranges).distinct()
    listed = read_parquet(
        spark,
        ns,
        [layout.metarange_key(m) for m in new_ids],
        f"{layout.metarange_range_column} string",
        partitions,
    ).withColumnRenamed(layout.metarange_range_column, "range_id")
    new_ranges = listed.distinct()
    ranges = new_ranges
    if known_ranges is not None:
        new_ranges = new_ranges.join(known_ranges, "range_id", "left_anti")
        ranges = known_ranges.unionByName(new_ranges)
    range_ids = sorted(row.range_id for row in new_ranges.collect())
    addresses = read_parquet(
        spark,
        ns,
        [layout.range_key(r) for r in range_ids],
        f"{layout.range_address_column} string",
        partitions,
    ).withColumnRenamed(layout.range_address_column, "address")
    return CommittedInput(metaranges, ranges, new_ranges, addresses, len(new_ids), len(range_ids))
