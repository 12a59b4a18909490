"""DataFrames in and out of the namespace, with the executors doing the I/O.

Spark reads Parquet itself where it can (local files, or `s3a` on a cluster that has it);
otherwise each executor reads its share of the files with pyarrow. Writes always go through
the executors with one atomic put per file, so a reader never sees a partial file and a
retried task simply writes its file again.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import NoReturn

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from branchwater.engine import BranchwaterError, Unavailable
from branchwater.spark_jobs.gc.events import error_class
from branchwater.spark_jobs.gc.runs import part_name
from branchwater.spark_jobs.gc.storage import Namespace

S3A_CONF = "spark.branchwater.gc.s3a"
"""Set to `true` on a cluster with Hadoop's `s3a` file system to let Spark read S3 itself."""
WRITTEN_SCHEMA = "key string, rows long, bytes long"

BatchFunction = Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]
_RAISED = re.compile(r"^(?:[\w.]+\.)?(\w+): (.+)$")


@contextmanager
def executor_errors(what: str) -> Iterator[None]:
    """Turn a failed Spark action into one readable error (see `executor_failure`)."""
    try:
        yield
    except PySparkException as exc:
        executor_failure(exc, what)


def executor_failure(exc: Exception, what: str) -> NoReturn:
    """Re-raise an executor's failure as one line: the engine's own error class when the
    executor raised one, else `Unavailable` with the executor's last error line."""
    lines = [line.strip() for line in str(exc).splitlines() if _RAISED.match(line.strip())]
    last = lines[-1] if lines else str(exc).strip().splitlines()[-1]
    match = _RAISED.match(last)
    name, message = (match.group(1), match.group(2)) if match else ("", last)
    error = error_class(name)
    if error is not BranchwaterError:
        raise error(message) from exc
    raise Unavailable(f"{what} failed on an executor: {last}") from exc


def parallel_frame(
    spark: SparkSession, values: list[str], column: str, partitions: int | None = None
) -> DataFrame:
    """One string column spread over `partitions` partitions (one value each by default)."""
    count = max(1, min(len(values), partitions or len(values)))
    rdd = spark.sparkContext.parallelize([(v,) for v in values], count)
    return spark.createDataFrame(rdd, f"{column} string")


def s3a_enabled(spark: SparkSession) -> bool:
    return (spark.conf.get(S3A_CONF, "false") or "").lower() == "true"


def read_parquet(
    spark: SparkSession,
    ns: Namespace,
    keys: list[str],
    schema: str,
    partitions: int,
    *,
    native: bool = True,
) -> DataFrame:
    """The named columns (`schema`, a DDL string) of Parquet files in the namespace.

    `native=False` reads with pyarrow on the executors even where Spark could: for many
    small files Spark's file index (a stat, and a listing job, per path) costs more than
    reading them."""
    columns = [part.split()[0] for part in schema.split(",")]
    if not keys:
        return spark.createDataFrame([], schema)
    paths = [ns.spark_path(key, s3a_enabled(spark)) for key in keys] if native else [None]
    if all(paths):
        return spark.read.schema(schema).parquet(*[p for p in paths if p]).select(*columns)
    files = parallel_frame(spark, keys, "key", partitions)
    return files.mapInArrow(partial(_read_files, ns, columns), schema)


def _read_files(
    ns: Namespace, columns: list[str], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    for batch in batches:
        for read in ns.read_parquet_files(batch.column(0).to_pylist(), columns):
            yield read.select(columns)


def _write_partition(
    ns: Namespace, prefix: str, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    collected = [b for b in batches if b.num_rows]
    if not collected:
        return
    table = pa.Table.from_batches(collected)
    context = TaskContext.get()
    number = context.partitionId() if context is not None else 0
    key = f"{prefix}/{part_name(number)}"
    size = ns.write_parquet(key, table)
    yield pa.record_batch(
        [pa.array([key]), pa.array([table.num_rows]), pa.array([size])],
        names=["key", "rows", "bytes"],
    )


def write_sets(
    frame: DataFrame, ns: Namespace, prefixes: dict[str, str], partitions: int
) -> dict[str, list[str]]:
    """Write the rows of `frame` (first column: the set's name) as Parquet files under
    `prefixes[name]`, in one pass; returns each set's keys, sorted."""
    columns = frame.columns[1:]
    spread = frame.repartition(max(1, partitions), F.col(columns[0]))
    written = spread.mapInArrow(partial(_write_sets, ns, prefixes), WRITTEN_SCHEMA).collect()
    found: dict[str, list[str]] = {name: [] for name in prefixes}
    for row in written:
        name = next(n for n, p in prefixes.items() if row.key.startswith(p + "/"))
        found[name].append(row.key)
    return {name: sorted(keys) for name, keys in found.items()}


def _write_sets(
    ns: Namespace, prefixes: dict[str, str], batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    collected = [b for b in batches if b.num_rows]
    if not collected:
        return
    table = pa.Table.from_batches(collected)
    for name, prefix in prefixes.items():
        rows = table.filter(pc.equal(table.column(0), name)).drop_columns([table.column_names[0]])
        if rows.num_rows:
            yield from _write_partition(ns, prefix, iter(rows.to_batches()))
