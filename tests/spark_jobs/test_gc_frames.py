"""Work spread over the executors in shares of a list of values (file keys, mostly)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark import TaskContext

from branchwater.spark_jobs.gc.frames import map_shares

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DDL = "task int, value string"


def tagged(share: list[str]) -> Iterator[pa.RecordBatch]:
    context = TaskContext.get()
    assert context is not None
    task = pa.repeat(pa.scalar(context.partitionId(), pa.int32()), len(share))
    yield pa.record_batch([task, pa.array(share, pa.string())], names=["task", "value"])


def shares(spark: SparkSession, values: list[str], partitions: int | None) -> list[list[str]]:
    rows = map_shares(spark, values, tagged, DDL, partitions).collect()
    by_task: dict[int, list[str]] = {}
    for row in rows:
        by_task.setdefault(row.task, []).append(row.value)
    return [by_task[task] for task in sorted(by_task)]


def test_each_value_goes_to_one_task_in_order_and_in_the_shares_asked_for(
    spark: SparkSession,
) -> None:
    values = [f"key-{i:02d}" for i in range(10)]

    assert shares(spark, values, 3) == [values[0:3], values[3:6], values[6:10]]


def test_by_default_each_value_is_a_task_of_its_own(spark: SparkSession) -> None:
    values = ["a", "b", "c"]

    assert shares(spark, values, None) == [["a"], ["b"], ["c"]]
    assert shares(spark, values, 8) == [["a"], ["b"], ["c"]]


def test_no_values_run_no_task(spark: SparkSession) -> None:
    assert map_shares(spark, [], tagged, DDL).collect() == []
