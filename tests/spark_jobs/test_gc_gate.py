"""The gate's sizing of the frames it validates, and its own flags: that no candidate is
referenced and none occurs twice (its suites run in every GC test)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from branchwater.engine.gc.addresses import slice_name
from branchwater.engine.gc.runs.config import JobConfig
from branchwater.engine.gc.runs.storage import Namespace
from branchwater.spark_jobs.gc.gate import (
    ROWS_PER_PARTITION,
    Gate,
    GateLimits,
    validation_partitions,
)
from branchwater.spark_jobs.gc.job import start_session
from branchwater.spark_jobs.gc.mark_on_driver import duplicates, flag_candidates_on_driver
from branchwater.spark_jobs.gc.mark_on_executors import flag_candidates, referenced_hits

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


@pytest.mark.parametrize(
    ("rows", "cores", "partitions"),
    [
        (0, 2, 1),
        (500, 2, 1),
        (ROWS_PER_PARTITION, 8, 1),
        (ROWS_PER_PARTITION + 1, 8, 2),
        (10 * ROWS_PER_PARTITION, 8, 8),
        (10 * ROWS_PER_PARTITION, 2, 2),
    ],
)
def test_a_frame_is_validated_in_a_partition_per_share_of_rows_up_to_one_per_core(
    rows: int, cores: int, partitions: int
) -> None:
    assert validation_partitions(rows, cores) == partitions


@pytest.fixture
def namespace(tmp_path: Path) -> Namespace:
    ns = Namespace.of(f"file://{tmp_path}/ns", {})
    ns.write_parquet("gc/candidates/a.parquet", pa.table({"address": ["data/s/1", "data/s/2"]}))
    ns.write_parquet("gc/candidates/b.parquet", pa.table({"address": ["data/s/3", "data/s/4"]}))
    sizes = pa.array([10, 20], pa.int64())
    committed = pa.table({"address": ["data/s/0", "data/s/2"], "size": sizes})
    ns.write_parquet("gc/committed/part.parquet", committed)
    staged = pa.table({"branch": ["main", "dev"], "address": ["data/s/4", "data/s/9"]})
    ns.write_parquet("gc/uncommitted/part.parquet", staged)
    return ns


SLICE = slice_name(datetime(2026, 11, 1, tzinfo=UTC))
CANDIDATES = ["gc/candidates/a.parquet", "gc/candidates/b.parquet"]
SETS = ["gc/committed/part.parquet", "gc/uncommitted/part.parquet"]


def test_the_candidates_a_set_holds_are_found_once_whatever_the_sets_other_columns(
    spark: SparkSession, namespace: Namespace
) -> None:
    for readers in (1, 2):
        hits = referenced_hits(spark, namespace, CANDIDATES, SETS, readers)

        assert sorted(hits.to_pylist()) == ["data/s/2", "data/s/4"]


def test_without_sets_or_candidates_nothing_is_referenced(
    spark: SparkSession, namespace: Namespace
) -> None:
    assert referenced_hits(spark, namespace, CANDIDATES, [], 2).to_pylist() == []
    assert referenced_hits(spark, namespace, [], SETS, 2).to_pylist() == []


def test_the_referenced_flag_is_true_for_the_hits_only(spark: SparkSession) -> None:
    candidates = spark.createDataFrame(
        [("data/s/1", 1), ("data/s/2", 2)], "address string, size long"
    )

    flagged = flag_candidates(spark, candidates, pa.array(["data/s/2"]))
    unflagged = flag_candidates(spark, candidates, pa.array([], pa.string()))

    assert {r.address: r.referenced for r in flagged.collect()} == {
        "data/s/1": False,
        "data/s/2": True,
    }
    assert {r.referenced for r in unflagged.collect()} == {False}


ADDRESSES = [f"data/{SLICE}/{i:032x}" for i in (1, 2, 3)] + [f"data/{SLICE}/{2:032x}"]
"""Four candidates, one address twice."""


def flagged_in_spark(spark: SparkSession, referenced: list[str]) -> DataFrame:
    candidates = spark.createDataFrame([(a,) for a in ADDRESSES], "address string")
    return flag_candidates(spark, candidates, pa.array(referenced, pa.string()))


def flagged_on_driver(spark: SparkSession, referenced: list[str]) -> DataFrame:
    candidates = pa.table({"address": pa.array(ADDRESSES, pa.string())})
    sets = [pa.table({"address": pa.array(referenced, pa.string())})]
    return flag_candidates_on_driver(spark, candidates, sets)


FLAGGED = [flagged_in_spark, flagged_on_driver]


@pytest.mark.parametrize("flagged", FLAGGED)
def test_both_flags_agree_in_spark_and_on_the_driver(
    spark: SparkSession, flagged: Callable[[SparkSession, list[str]], DataFrame]
) -> None:
    rows = flagged(spark, [ADDRESSES[2], f"data/{SLICE}/{9:032x}"]).collect()

    assert sorted((r.address, r.referenced, r.duplicate) for r in rows) == [
        (ADDRESSES[0], False, None),
        (ADDRESSES[1], False, ADDRESSES[1]),
        (ADDRESSES[1], False, ADDRESSES[1]),
        (ADDRESSES[2], True, None),
    ]


def test_duplicates_names_each_repeated_address_and_nothing_else() -> None:
    addresses = pa.array(["a", "b", "a", None, "c", "c", "c"], pa.string())

    assert duplicates(addresses).to_pylist() == ["a", None, "a", None, "c", "c", "c"]


@pytest.mark.parametrize("flagged", FLAGGED)
def test_an_address_twice_among_the_candidates_fails_the_gate_with_gx_figures(
    spark: SparkSession, flagged: Callable[[SparkSession, list[str]], DataFrame]
) -> None:
    candidates = flagged(spark, []).withColumn("age_seconds", F.lit(1e6))

    result = Gate(spark).check_candidates(candidates, 4, GateLimits(0.0, 4))

    assert not result.success
    [failed] = [e for e in result.expectations if not e.success]
    assert (failed.type, failed.kwargs["column"]) == (
        "expect_column_values_to_be_null",
        "duplicate",
    )
    assert failed.observed["unexpected_count"] == 2
    assert set(failed.observed["partial_unexpected_list"]) == {ADDRESSES[1]}


@pytest.mark.parametrize(
    ("column", "value"),
    [("referenced", (None, "boolean")), ("age_seconds", (float("nan"), "double"))],
    ids=["reference-unknown", "age-nan"],
)
def test_a_candidate_of_unknown_reference_or_age_fails_the_gate(
    spark: SparkSession, column: str, value: tuple[Any, str]
) -> None:
    """GX's column checks skip nulls, and Spark orders NaN above every number: neither may
    pass the reference and minimum-age checks vacuously."""
    unique = spark.createDataFrame([(a,) for a in sorted(set(ADDRESSES))], "address string")
    candidates = flag_candidates(spark, unique, pa.array([], pa.string()))
    candidates = candidates.withColumn("age_seconds", F.lit(1e6))
    candidates = candidates.withColumn(column, F.lit(value[0]).cast(value[1]))

    result = Gate(spark).check_candidates(candidates, len(set(ADDRESSES)), GateLimits(0.0, 4))

    assert not result.success
    assert {e.kwargs["column"] for e in result.expectations if not e.success} == {column}


def test_the_job_session_never_skips_a_missing_or_corrupt_file(spark: SparkSession) -> None:
    """A cluster's defaults asking Spark to skip unreadable files are overridden: the gate
    must read every candidates file the sweep deletes from."""
    skips = ("spark.sql.files.ignoreMissingFiles", "spark.sql.files.ignoreCorruptFiles")
    for key in skips:
        spark.conf.set(key, "true")
    try:
        session = start_session(JobConfig("sqlite:///unused.db", "sales"))
        assert [session.conf.get(key) for key in skips] == ["false", "false"]
    finally:
        for key in skips:
            spark.conf.set(key, "false")
