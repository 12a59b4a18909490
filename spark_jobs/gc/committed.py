"""Committed addresses, read from the Parquet ranges of every commit, each range once.

Commits share ranges (unchanged ones keep their id), so the job first reads the distinct
metaranges, then the distinct ranges they list; an optimized run subtracts the metaranges and
ranges its base run read, which hold the same addresses as they did then.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame, SparkSession

from branchwater.engine import CommittedLayout
from branchwater.spark_jobs.gc.frames import read_parquet
from branchwater.spark_jobs.gc.storage import Namespace


@dataclass
class CommittedInput:
    """What the committed listing produced: every metarange and range id known now (sorted),
    how many of each were new since the base run, and the addresses of the new ranges (all
    ranges without a base)."""

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
    for which Spark's own reader would first stat every path (and run a listing job)."""
    all_metaranges = layout.metarange_ids()
    new_metaranges = [m for m in all_metaranges if m not in known_metaranges]
    listed = read_parquet(
        spark,
        ns,
        [layout.metarange_key(m) for m in new_metaranges],
        f"{layout.metarange_range_column} string",
        partitions,
        native=False,
    )
    found = {row[0] for row in listed.distinct().collect()}
    new_ranges = sorted(found - known_ranges)
    addresses = read_parquet(
        spark,
        ns,
        [layout.range_key(r) for r in new_ranges],
        f"{layout.range_address_column} string",
        partitions,
        native=False,
    ).withColumnRenamed(layout.range_address_column, "address")
    return CommittedInput(
        sorted(set(all_metaranges) | known_metaranges),
        sorted(found | known_ranges),
        len(new_metaranges),
        len(new_ranges),
        addresses,
    )
