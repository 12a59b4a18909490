"""Marking on the executors: the clean run's way, and an optimized run's whose inputs are
not small. One Spark job marks (`mark`); the gate's `referenced` flag is probed apart from it,
by tasks that read the sets' files (`referenced_hits`), and `duplicate` is counted in Spark
(`flag_candidates`)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from functools import partial

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import Broadcast
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from branchwater.engine.gc.runs import plan
from branchwater.engine.gc.runs.storage import Namespace
from branchwater.spark_jobs.gc.frames import ADAPTIVE, map_shares, read_parquet, session_conf
from branchwater.spark_jobs.gc.inputs import SetsRead
from branchwater.spark_jobs.gc.marking import (
    ADDRESSES,
    MARK_DDL,
    SET_DDL,
    TO_LIST,
    Marked,
    mark_task,
    marked_from,
    probe,
)
from branchwater.spark_jobs.gc.packing import PACKED_DDL


@dataclass(frozen=True)
class OnExecutors:
    """`MarkPath` on the executors: `partitions` shuffle partitions, `cores` task slots."""

    spark: SparkSession
    partitions: int
    cores: int
    where = "executors"

    def mark(
        self,
        slices: list[str],
        read: SetsRead,
        window: plan.Window,
        late: timedelta,
        prefixes: dict[str, str],
        per_file: int,
    ) -> Marked:
        frames = read.frames_read()
        return mark(
            self.spark, read.ns, slices, frames, window, late, prefixes, per_file, self.partitions
        )

    def flagged(self, keys: list[str], read: SetsRead, scratch: str) -> DataFrame:
        sets = [*read.ns.folder_keys(scratch), *read.referenced_keys()]
        hits = referenced_hits(self.spark, read.ns, keys, sets, self.cores)
        candidates = read_parquet(self.spark, read.ns, keys, SET_DDL, self.partitions)
        return flag_candidates(self.spark, candidates, hits)


def mark(
    spark: SparkSession,
    ns: Namespace,
    slices: list[str],
    read: list[DataFrame],
    window: plan.Window,
    late: timedelta,
    prefixes: dict[str, str],
    per_file: int,
    partitions: int,
) -> Marked:
    """Mark with one Spark job. `read` holds the sets read, packed (see `packing`); `late`
    is how long after a slice is opened objects may land in it (clock skew included);
    `prefixes` names the folder of each of `plan.SETS`. Adaptive execution is off for it: it
    has nothing to re-plan in one shuffle of a set number of partitions, and re-planning
    took time."""
    to_list = spark.createDataFrame([(name, TO_LIST, None) for name in slices], PACKED_DDL)
    keyed = to_list
    for frame in read:
        keyed = keyed.unionByName(frame)
    task = partial(mark_task, ns, window, late, prefixes, per_file)
    marked = keyed.repartition(max(1, partitions), "slice").mapInArrow(task, MARK_DDL)
    with session_conf(spark, {ADAPTIVE: "false"}):
        rows = marked.toArrow()
    return marked_from(rows.to_pylist())


def referenced_hits(
    spark: SparkSession, ns: Namespace, candidates: list[str], sets: list[str], readers: int
) -> pa.Array:
    """Which addresses of the Parquet files `candidates` the files `sets` hold too, each once.
    The candidates' addresses are read here and broadcast; the sets' files are read and
    probed by the executors' Python, in at most `readers` tasks. A candidate a set holds is
    a mark gone wrong, so the hits are normally none, and only they come back: a Spark join
    of the sets with the candidates would shuffle its hits to make them distinct, and cost
    more planning than its work."""
    wanted = ns.read_table(candidates, ADDRESSES).column("address").combine_chunks()
    if not sets or not len(wanted):
        return pa.array([], pa.string())
    shared = spark.sparkContext.broadcast(wanted)
    try:
        task = partial(_probe_files, ns, shared)
        found = map_shares(spark, sets, task, "address string", readers).toArrow()
    finally:
        shared.destroy()
    return pc.unique(found.column("address").combine_chunks())


def flag_candidates(spark: SparkSession, candidates: DataFrame, hits: pa.Array) -> DataFrame:
    """Candidates with the flags the gate expects unset: `referenced`, true for the `hits`
    (see `referenced_hits`), which reach Spark as a local relation, and `duplicate` (see
    `duplicates`), counted by address in Spark."""
    flags = spark.createDataFrame(
        pa.table({"address": hits, "referenced": pa.repeat(True, len(hits))}),
        "address string, referenced boolean",
    )
    copies = F.count(F.lit(1)).over(Window.partitionBy("address"))
    flagged = candidates.join(F.broadcast(flags), "address", "left")
    return flagged.withColumns(
        {
            "referenced": F.coalesce(F.col("referenced"), F.lit(False)),
            "duplicate": F.when(copies > 1, F.col("address")),
        }
    )


def _probe_files(ns: Namespace, wanted: Broadcast, keys: list[str]) -> Iterator[pa.RecordBatch]:
    for batch in ns.read_parquet_files(keys, ADDRESSES.names):
        hits = probe(batch.column(0), wanted.value)
        if len(hits):
            yield pa.record_batch([hits], schema=ADDRESSES)
