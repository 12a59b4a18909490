"""The quality gate: Great Expectations suites on the candidates and on the prepare output.

No object is deleted unless every expectation holds. GX Core 1.x is called directly on the
Spark DataFrames with an ephemeral context (nothing written to disk, no analytics), and its
own results go into the summary and the report: verdicts for a suite that passed, and GX's
figures (element counts, unexpected counts and examples, observed values) for one that
failed. The context has no data-docs site: the job writes its own report.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pyspark import InheritableThread
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from branchwater.engine.gc.runs.files import Expectation
from branchwater.engine.gc.runs.layout import DATA_PREFIX, JVM_ADDRESS_PATTERN
from branchwater.spark_jobs.gc.frames import ADAPTIVE, cores, session_conf

LIMIT_PARTITIONS = "spark.sql.limit.initialNumPartitions"
SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
PASSING_FORMAT = {"result_format": "BOOLEAN_ONLY"}
"""GX's verdicts only. A suite that passes has no unexpected value to show, and asking for
its figures costs a query plan per expectation (a fifth of a second a suite, more than any
of its Spark jobs) that the run's own counts make redundant; a suite that fails is
validated again with GX's BASIC figures and examples of the unexpected values."""
ROWS_PER_PARTITION = 200_000
"""Rows a validated frame holds per partition, up to one partition per core. A frame in one
partition needs no shuffle for GX's aggregates (one stage, one task a query): a fifth off
the candidates' suite of an optimized run (500 rows); a million rows in one partition took
1.4 times as long as in two."""
AGE_CEILING_SECONDS = 1e12
"""Above any object's age (some 30,000 years): only a NaN or infinite age reaches it."""
CANDIDATES_SUITE = "gc-candidates"
EXPIRED_SUITE = "gc-expired"
"""The committed part's candidates (objects only expired commits hold)."""
PREPARE_SUITE = "gc-prepare-output"
_SUITE_ORDER = {CANDIDATES_SUITE: 0, EXPIRED_SUITE: 1}
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


class Gate:
    """One run's gate: an ephemeral GX context whose suites are validated as their frames
    become ready. The prepare output's is known before the mark starts and is validated in
    a thread of its own meanwhile (importing GX, seconds in a new process, included: GX
    waits on Spark, the mark on the executors); the candidates' after the mark. No object
    is deleted unless every expectation holds."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark
        self.cores = cores(spark)
        self._source: Any = None
        self._definitions: dict[str, Any] = {}
        self._expectations: list[Expectation] = []
        self._validations: dict[str, Any] = {}
        self._background: InheritableThread | None = None
        self._failure: BaseException | None = None

    def start_prepare_output(self, prepare_output: DataFrame, rows: int) -> None:
        """Validate the prepare output (address; `rows` of them) in the background, and set
        up the candidates' batch definition there too, while the mark runs."""

        def validate() -> None:
            try:
                checks = _prepare_checks()
                partitions = validation_partitions(rows, self.cores)
                self._validate(PREPARE_SUITE, prepare_output, partitions, checks, {})
                self._batch_definition(CANDIDATES_SUITE)
            except BaseException as exc:
                self._failure = exc

        self._background = InheritableThread(target=validate, daemon=True)
        self._background.start()

    def check_candidates(self, candidates: DataFrame, rows: int, limits: GateLimits) -> GateResult:
        """Validate `candidates` (address, age_seconds and the flags `MarkPath.flagged` adds;
        `rows` of them) once the prepare output's suite is done; the result of both.

        GX computes each suite's figures in a few aggregations plus one `limit` query per
        expectation (its examples of unexpected values, asked for only when the suite
        failed). Each frame is validated in a partition per `ROWS_PER_PARTITION` rows (at
        most one per core), so a `limit` query scans all partitions in one job instead of
        one partition, then four more, and so on, one job each. A count by address in
        Spark (the `duplicate` flag) shuffles into as many partitions, and adaptive
        execution, which re-plans a query at each stage, is off: these queries are small,
        and planning was most of their time."""
        self.wait()
        if self._failure is not None:
            raise self._failure
        partitions = validation_partitions(rows, self.cores)
        small_queries = {
            LIMIT_PARTITIONS: str(partitions),
            SHUFFLE_PARTITIONS: str(partitions),
            ADAPTIVE: "false",
        }
        checks = _candidate_checks(limits)
        self._validate(CANDIDATES_SUITE, candidates, partitions, checks, small_queries)
        return self.result()

    def result(self) -> GateResult:
        """Every suite validated so far, once the prepare output's is done: a committed-only
        run's gate is the prepare output's and `gc-expired`, with no uncommitted
        candidates to check."""
        self.wait()
        if self._failure is not None:
            raise self._failure
        expectations = sorted(self._expectations, key=lambda e: _SUITE_ORDER.get(e.suite, 2))
        success = all(e.success for e in expectations)
        return GateResult(success, expectations, dict(self._validations))

    def check_expired(self, expired: DataFrame, rows: int, limits: GateLimits) -> None:
        """Validate the committed part's candidates (`retention.flagged`): its expectations
        join the result `check_candidates` returns, which must come after."""
        self.wait()
        if self._failure is not None:
            raise self._failure
        partitions = validation_partitions(rows, self.cores)
        self._validate(EXPIRED_SUITE, expired, partitions, _expired_checks(limits), {})

    def wait(self) -> None:
        """Until the background suite is done (also when the mark failed)."""
        if self._background is not None:
            self._background.join()
            self._background = None

    def _validate(
        self,
        name: str,
        frame: DataFrame,
        partitions: int,
        checks: list[Any],
        settings: dict[str, str],
    ) -> None:
        """Validate one suite on `frame` in `partitions` (see `validation_partitions`). Each
        of GX's queries reads the frame again (files, rows the driver sent, or files joined
        with the few referenced candidates): less work than caching it, as `gc-clean` and
        `gc-optimized` measured, and a row count reads only the files' footers."""
        import great_expectations as gx

        definition = self._batch_definition(name)
        validated = frame.coalesce(partitions)
        with session_conf(self.spark, settings):
            batch = definition.get_batch(batch_parameters={"dataframe": validated})
            suite = gx.ExpectationSuite(name=name, expectations=checks)
            result = batch.validate(suite, result_format=PASSING_FORMAT)
            if not result.success:
                result = batch.validate(suite, result_format="BASIC")
        self._validations[name] = _json_safe(result.to_json_dict())
        self._expectations += [_expectation(name, r) for r in result.results]

    def _batch_definition(self, name: str) -> Any:
        """One suite's whole-frame batch definition in the run's GX context, made once
        (each addition to the context writes its configuration out again)."""
        if name not in self._definitions:
            if self._source is None:
                self._source = _spark_source()
            asset = self._source.add_dataframe_asset(name=name)
            self._definitions[name] = asset.add_batch_definition_whole_dataframe(name)
        return self._definitions[name]


def validation_partitions(rows: int, cores: int) -> int:
    """The partitions a frame of `rows` is validated in: `ROWS_PER_PARTITION` each, at least
    one, at most one per core."""
    return max(1, min(cores, math.ceil(rows / ROWS_PER_PARTITION)))


def with_age(candidates: DataFrame, start: datetime) -> DataFrame:
    """Candidates with their age at the run's start (`age_seconds`), which the gate checks."""
    age = F.lit(start).cast("double") - F.col("mtime").cast("double")
    return candidates.withColumn("age_seconds", age)


def _spark_source() -> Any:
    """A Spark data source in an ephemeral GX context (nothing on disk, no analytics) that
    leaves caching to the gate: by default GX caches every frame it validates."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
    import great_expectations as gx
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
    return context.data_sources.add_spark(name="branchwater-gc", persist=False)


def _candidate_checks(limits: GateLimits) -> list[Any]:
    """GX's column checks skip nulls, so a candidate of unknown age or reference would pass
    them: each is expected to be there first. Spark orders NaN above every number, so the
    age has a ceiling too (`AGE_CEILING_SECONDS`): a NaN or infinite age fails it."""
    import great_expectations.expectations as gxe

    return [
        gxe.ExpectColumnValuesToNotBeNull(column="address"),
        gxe.ExpectColumnValuesToBeNull(column="duplicate"),
        gxe.ExpectColumnValuesToMatchRegex(column="address", regex=JVM_ADDRESS_PATTERN),
        gxe.ExpectColumnValuesToNotBeNull(column="referenced"),
        gxe.ExpectColumnValuesToBeInSet(column="referenced", value_set=[False]),
        gxe.ExpectColumnValuesToNotBeNull(column="age_seconds"),
        gxe.ExpectColumnValuesToBeBetween(
            column="age_seconds", min_value=limits.min_age_seconds, max_value=AGE_CEILING_SECONDS
        ),
        gxe.ExpectTableRowCountToBeBetween(min_value=0, max_value=limits.max_candidates),
    ]


def _expired_checks(limits: GateLimits) -> list[Any]:
    """The candidates' checks, and no expired candidate staged on a branch: the flag
    `referenced` here means held by an active commit."""
    import great_expectations.expectations as gxe

    return [
        *_candidate_checks(limits),
        gxe.ExpectColumnValuesToBeInSet(column="uncommitted", value_set=[False]),
    ]


def _prepare_checks() -> list[Any]:
    import great_expectations.expectations as gxe

    return [
        gxe.ExpectColumnValuesToNotBeNull(column="address"),
        gxe.ExpectColumnValuesToMatchRegex(column="address", regex=f"^{DATA_PREFIX}"),
    ]


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
