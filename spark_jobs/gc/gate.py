"""The quality gate: Great Expectations suites on the candidates and on the prepare output.

No object is deleted unless every expectation holds. GX Core 1.x is called directly on the
Spark DataFrames with an ephemeral context (nothing written to disk, no analytics), and its
own figures (element counts, unexpected counts and examples, observed values) go into the
summary and the report. The context has no data-docs site: the job writes its own report.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pyspark import StorageLevel
from pyspark.sql import DataFrame, SparkSession

from branchwater.spark_jobs.gc.layout import ADDRESS_PATTERN, DATA_DIR
from branchwater.spark_jobs.gc.runs import Expectation

LIMIT_PARTITIONS = "spark.sql.limit.initialNumPartitions"
PASSING_FORMAT = {"result_format": "BASIC", "partial_unexpected_count": 0}
"""GX's BASIC figures without examples of unexpected values: a suite that passes has none,
and a `limit 0` query costs no Spark job. A suite that fails is validated again with them."""
CANDIDATES_SUITE = "gc-candidates"
PREPARE_SUITE = "gc-prepare-output"
_FIGURES = (
    "observed_value",
    "element_count",
    "unexpected_count",
    "unexpected_percent",
    "missing_count",
    "partial_unexpected_list",
)


@dataclass(frozen=True)
class GateLimits:
    """What the candidates must satisfy besides being well-formed and unreferenced."""

    min_age_seconds: float
    max_candidates: int


@dataclass
class GateResult:
    success: bool
    expectations: list[Expectation]
    validations: dict[str, Any]


def max_candidates(namespace: int, max_share: float) -> int:
    """The most candidates a run may mark: `max_share` of the namespace's objects old enough
    to be considered (an optimized run lists only what is new, yet its candidates are bounded
    by the whole namespace, so a day of mostly short-lived files does not trip the gate)."""
    return math.floor(namespace * max_share)


def run_gate(candidates: DataFrame, prepare_output: DataFrame, limits: GateLimits) -> GateResult:
    """Validate `candidates` (address, age_seconds, referenced, ...) and `prepare_output`
    (address).

    GX computes each suite's figures in a few aggregations plus one `limit` query per
    expectation (its examples of unexpected values, asked for only when the suite failed).
    Each frame is therefore cached in as many partitions as Spark has cores, so every one
    of those jobs reads memory, and a `limit` query scans all partitions in one job instead
    of one partition, then four more, and so on, one job each."""
    spark = candidates.sparkSession
    cores = max(1, spark.sparkContext.defaultParallelism)
    frames = [
        frame.coalesce(cores).persist(StorageLevel.MEMORY_AND_DISK)
        for frame in (candidates, prepare_output)
    ]
    try:
        with _session_conf(spark, LIMIT_PARTITIONS, str(cores)):
            return _validate(frames[0], frames[1], limits)
    finally:
        for frame in frames:
            frame.unpersist()


@contextmanager
def _session_conf(spark: SparkSession, key: str, value: str) -> Iterator[None]:
    """`key` set to `value` for the duration, then as it was (the session may be shared)."""
    before = spark.conf.get(key, None)
    spark.conf.set(key, value)
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)


def _validate(candidates: DataFrame, prepare_output: DataFrame, limits: GateLimits) -> GateResult:
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations as gx
    import great_expectations.expectations as gxe
    from great_expectations.data_context.types.base import (
        DataContextConfig,
        InMemoryStoreBackendDefaults,
        ProgressBarsConfig,
    )

    config = DataContextConfig(
        store_backend_defaults=InMemoryStoreBackendDefaults(init_temp_docs_sites=False),
        progress_bars=ProgressBarsConfig(globally=False),
    )
    context = gx.get_context(mode="ephemeral", project_config=config)
    source = context.data_sources.add_spark(name="branchwater-gc")
    suites: dict[str, tuple[DataFrame, list[Any]]] = {
        CANDIDATES_SUITE: (
            candidates,
            [
                gxe.ExpectColumnValuesToNotBeNull(column="address"),
                gxe.ExpectColumnValuesToBeUnique(column="address"),
                gxe.ExpectColumnValuesToMatchRegex(column="address", regex=ADDRESS_PATTERN),
                gxe.ExpectColumnValuesToBeInSet(column="referenced", value_set=[False]),
                gxe.ExpectColumnValuesToBeBetween(
                    column="age_seconds", min_value=limits.min_age_seconds
                ),
                gxe.ExpectTableRowCountToBeBetween(min_value=0, max_value=limits.max_candidates),
            ],
        ),
        PREPARE_SUITE: (
            prepare_output,
            [
                gxe.ExpectColumnValuesToNotBeNull(column="address"),
                gxe.ExpectColumnValuesToMatchRegex(column="address", regex=f"^{DATA_DIR}/"),
            ],
        ),
    }
    expectations: list[Expectation] = []
    validations: dict[str, Any] = {}
    for name, (frame, checks) in suites.items():
        asset = source.add_dataframe_asset(name=name)
        batch = asset.add_batch_definition_whole_dataframe(name).get_batch(
            batch_parameters={"dataframe": frame}
        )
        suite = gx.ExpectationSuite(name=name, expectations=checks)
        result = batch.validate(suite, result_format=PASSING_FORMAT)
        if not result.success:
            result = batch.validate(suite, result_format="BASIC")
        validations[name] = _json_safe(result.to_json_dict())
        expectations += [_expectation(name, r) for r in result.results]
    return GateResult(all(e.success for e in expectations), expectations, validations)


def _expectation(suite: str, result: Any) -> Expectation:
    config = result.expectation_config
    kwargs = {k: v for k, v in dict(config.kwargs).items() if k != "batch_id"}
    figures = {k: v for k, v in dict(result.result or {}).items() if k in _FIGURES}
    exception = dict(result.exception_info or {})
    if exception.get("raised_exception"):
        figures["exception"] = exception.get("exception_message")
    return Expectation(
        suite, config.type, _json_safe(kwargs), bool(result.success), _json_safe(figures)
    )


def _json_safe(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))
