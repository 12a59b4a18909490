"""Where a run marks and flags its candidates, chosen in one place (`choose`).

Both ways run the same task (`marking.mark_slices`) and give the same rows
(`tests/spark_jobs/test_gc_model.py` plays the same histories through both against an
independent model; `tests/spark_jobs/test_gc_gate.py` checks their flags agree):

- `OnExecutors` (`mark_on_executors`): one Spark job, each task listing its own slices; the
  clean run's way, since its listing is the largest input and must stay on the executors.
  The `gc-clean-mark` benchmark compares its mark with Spark's `left_anti` join of the same
  sets.
- `OnDriver` (`mark_on_driver`): the task in the driver's process, for an optimized run
  that reads little (at most `DRIVER_SLICES` slices and `driver_rows` addresses).

Both are kept because they were measured: the `gc-mark-driver` benchmark (`bench_gc`) runs
the same optimized run on each path, and the run marking on the driver is the faster: a
Spark job's start, its shuffle and the gate's flag job cost more than such a run's work.
Marking there on the executors is what `driver_rows=0` does.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Protocol

from pyspark.sql import DataFrame, SparkSession

from branchwater.engine.gc.runs import plan
from branchwater.engine.gc.runs.config import DRIVER_SLICES
from branchwater.spark_jobs.gc.inputs import SetsRead
from branchwater.spark_jobs.gc.mark_on_driver import OnDriver
from branchwater.spark_jobs.gc.mark_on_executors import OnExecutors
from branchwater.spark_jobs.gc.marking import Marked


class MarkPath(Protocol):
    @property
    def where(self) -> str:
        """`driver` or `executors`, as the run's summary records it."""

    def mark(
        self,
        slices: list[str],
        read: SetsRead,
        window: plan.Window,
        late: timedelta,
        prefixes: dict[str, str],
        per_file: int,
    ) -> Marked:
        """List `slices`, combine them with the sets `read`, write the candidates and the
        next run's sets under `prefixes`, and return the counts and files."""

    def flagged(self, keys: list[str], read: SetsRead, scratch: str) -> DataFrame:
        """The candidates files `keys` read back with the gate's `referenced` and
        `duplicate` flags (`scratch` holds the committed addresses the range readers
        wrote)."""


def choose(
    spark: SparkSession,
    slices: list[str],
    read: SetsRead,
    driver_rows: int,
    partitions: int,
    cores: int,
) -> MarkPath:
    if len(slices) <= DRIVER_SLICES and read.small(driver_rows):
        return OnDriver(spark)
    return OnExecutors(spark, partitions, cores)
