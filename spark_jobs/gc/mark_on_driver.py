"""Marking on the driver: an optimized run whose inputs are small runs the mark's task in
this process (`mark_on_driver`) on the sets as read, and computes the gate's flags in Arrow
(`flag_candidates_on_driver`); no Spark job marks or flags."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession

from branchwater.engine.gc.runs import plan
from branchwater.engine.gc.runs.storage import Namespace
from branchwater.spark_jobs.gc.inputs import SetsRead
from branchwater.spark_jobs.gc.marking import SET_SCHEMA, Marked, mark_slices, marked_from, probe


@dataclass(frozen=True)
class OnDriver:
    """`MarkPath` in the driver's process."""

    spark: SparkSession
    where = "driver"

    def mark(
        self,
        slices: list[str],
        read: SetsRead,
        window: plan.Window,
        late: timedelta,
        prefixes: dict[str, str],
        per_file: int,
    ) -> Marked:
        tables = read.tables()
        return mark_on_driver(read.ns, slices, tables, window, late, prefixes, per_file)

    def flagged(self, keys: list[str], read: SetsRead, scratch: str) -> DataFrame:
        candidates = read.ns.read_table(keys, SET_SCHEMA)
        return flag_candidates_on_driver(self.spark, candidates, read.referenced_tables())


def mark_on_driver(
    ns: Namespace,
    slices: list[str],
    read: list[pa.Table],
    window: plan.Window,
    late: timedelta,
    prefixes: dict[str, str],
    per_file: int,
) -> Marked:
    """`mark` as one task in this process, on `arrow_addresses_read` tables."""
    task = mark_slices(ns, window, late, prefixes, per_file, slices, read)
    return marked_from([row for batch in task for row in batch.to_pylist()])


def flag_candidates_on_driver(
    spark: SparkSession, candidates: pa.Table, refs: list[pa.Table]
) -> DataFrame:
    """`flag_candidates` in Arrow, for a mark that ran on the driver and read the sets
    there: `referenced` from the sets as read, and `duplicate`; the candidates and their
    flags reach Spark as a local relation, and no Spark job computes them."""
    wanted = candidates.column("address").combine_chunks()
    found = pa.chunked_array([probe(t.column("address"), wanted) for t in refs], pa.string())
    flags = {
        "referenced": pc.is_in(wanted, found.combine_chunks()),
        "duplicate": duplicates(wanted),
    }
    for name, flag in flags.items():
        candidates = candidates.append_column(name, flag)
    return spark.createDataFrame(candidates)


def duplicates(addresses: pa.Array) -> pa.Array:
    """Each address that occurs more than once, null elsewhere: the gate expects it null, and
    GX's figures of a failure then name the repeated addresses. Counted here rather than by
    GX's uniqueness check, which runs a Spark job of its own (a third of the candidates'
    suite after a mark on the driver)."""
    counted = addresses.value_counts()
    repeated = counted.field("values").filter(pc.greater(counted.field("counts"), 1))
    return pc.if_else(pc.is_in(addresses, repeated), addresses, pa.scalar(None, pa.string()))
