"""DataFrames read from the namespace, and executor failures made readable.

Spark reads Parquet itself where it can (local files, or `s3a` on a cluster that has it);
otherwise each executor reads its share of the files with pyarrow. (Executors write with
one atomic put per file, see `marking`: a reader never sees a partial file, and a retried
task simply writes its file again.)
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import NoReturn

import pyarrow as pa
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession

from branchwater.engine import BranchwaterError, Unavailable
from branchwater.engine.gc.runs.events import error_class
from branchwater.engine.gc.runs.plan import UTC_MICROS
from branchwater.engine.gc.runs.storage import Namespace

ADAPTIVE = "spark.sql.adaptive.enabled"
S3A_CONF = "spark.branchwater.gc.s3a"
"""Set to `true` on a cluster with Hadoop's `s3a` file system to let Spark read S3 itself."""
GLOB_CHARACTERS = frozenset("{}[]*?\\")
"""What makes Spark's reader take a path for a glob pattern (Hadoop's `globPathIfNecessary`):
a namespace such as `file:///lake[prod]` would name no file, or other files, through it."""

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


def cores(spark: SparkSession) -> int:
    """The task slots of the session's executors (Spark's default parallelism)."""
    return max(1, spark.sparkContext.defaultParallelism)


@contextmanager
def session_conf(spark: SparkSession, settings: dict[str, str]) -> Iterator[None]:
    """`settings` for the duration, then as they were (the session may be shared)."""
    before = {key: spark.conf.get(key, None) for key in settings}
    for key, value in settings.items():
        spark.conf.set(key, value)
    try:
        yield
    finally:
        for key, previous in before.items():
            if previous is None:
                spark.conf.unset(key)
            else:
                spark.conf.set(key, previous)


ShareTask = Callable[[list[str]], Iterator[pa.RecordBatch]]
"""What a task of `map_shares` does with its share of the values."""


def map_shares(
    spark: SparkSession,
    values: list[str],
    task: ShareTask,
    ddl: str,
    partitions: int | None = None,
) -> DataFrame:
    """`task` run on the executors on `partitions` shares of `values` (one value each by
    default), its batches of columns `ddl` a DataFrame. The tasks receive positions from
    `spark.range` and take their values from the function: a DataFrame of the values made
    from Python rows would cost a Python pass of its own before the task's, and more
    planning."""
    count = max(1, min(len(values), partitions or len(values)))
    positions = spark.range(0, len(values), 1, count)
    return positions.mapInArrow(partial(_share, values, task), ddl)


def _share(
    values: list[str], task: ShareTask, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    share = [values[i] for batch in batches for i in batch.column(0).to_pylist()]
    if share:
        yield from task(share)


def arrow_schema(ddl: str) -> pa.Schema:
    """A DDL string of the job's own column types as an Arrow schema."""
    types = {
        "string": pa.string(),
        "int": pa.int32(),
        "long": pa.int64(),
        "timestamp": UTC_MICROS,
        "binary": pa.binary(),
    }
    fields = [part.split() for part in ddl.split(",")]
    return pa.schema([(name, types[kind]) for name, kind in fields])


def s3a_enabled(spark: SparkSession) -> bool:
    return (spark.conf.get(S3A_CONF, "false") or "").lower() == "true"


def read_parquet(
    spark: SparkSession,
    ns: Namespace,
    keys: list[str],
    schema: str,
    partitions: int,
) -> DataFrame:
    """The named columns (`schema`, a DDL string) of Parquet files in the namespace. Spark's
    own reader globs its paths, so a path holding a glob character is read by the executors'
    pyarrow instead: exactly these files, whatever the namespace is called."""
    columns = [part.split()[0] for part in schema.split(",")]
    if not keys:
        return spark.createDataFrame([], schema)
    paths = [ns.spark_path(key, s3a_enabled(spark)) for key in keys]
    if all(p and not GLOB_CHARACTERS.intersection(p) for p in paths):
        return spark.read.schema(schema).parquet(*[p for p in paths if p]).select(*columns)
    return map_shares(spark, keys, partial(_read_files, ns, columns), schema, partitions)


def _read_files(ns: Namespace, columns: list[str], keys: list[str]) -> Iterator[pa.RecordBatch]:
    for read in ns.read_parquet_files(keys, columns):
        yield read.select(columns)
