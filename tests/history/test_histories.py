"""Random histories of every operation, uncommitted and retention GC and hostile input, run
by several processes at once against one repository, checked against the model
(`tests.history.checker`).

The fast variant runs 20 seeds on each back end (SQLite + local files; PostgreSQL +
SeaweedFS) with failpoints raising in a share of the operations; the slow one histories whose
failpoints kill the worker, which the supervisor starts again to retry the operation it
died in (one per back end in `make test`; 200 of 16 processes, whose last GC run is the Spark
job, with `BRANCHWATER_LONG_TESTS=1`). A failure names its seed and the command that
runs it again (`BRANCHWATER_HISTORY_SEED`); the interleaving is the machine's, so a race may
need a few runs of it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from branchwater.engine import Lake
from branchwater.engine.api import Repository
from tests.fixtures.s3 import S3Server
from tests.helpers.gc import GCLake
from tests.helpers.long_run import LONG_TESTS
from tests.helpers.servers import unique_name
from tests.history.runner import (
    COUNT_ENV,
    SEED_ENV,
    Backend,
    Collect,
    Settings,
    reproduce,
    rule_sweep,
    run_history,
)
from tests.history.workers import Workers

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = pytest.mark.xdist_group("history")

REGRESSION_SEEDS = [36, 37, 41]
"""Seeds whose histories found something (`test_regressions.py` forces each): run on every
back end besides the 20."""
"""The long run (`BRANCHWATER_LONG_TESTS=1`, hours): 200 killed histories of 16 workers on
each back end. `make test` runs one of 6 workers per back end, on the fast variant's pool."""
FAST = Settings(workers=6, operations=12, fault="raise")
SLOW = Settings(
    workers=16 if LONG_TESTS else FAST.workers,
    operations=20 if LONG_TESTS else FAST.operations,
    fault="kill",
    fault_rate=0.1,
    gc_min_age=1.0,
)
SLOW_SEEDS = int(os.environ.get("BRANCHWATER_HISTORY_SLOW_SEEDS", "200" if LONG_TESTS else "1"))


def seeds(count: int) -> list[int]:
    """`count` seeds, as many as `BRANCHWATER_HISTORY_SEEDS` says, or the one
    `BRANCHWATER_HISTORY_SEED` names."""
    chosen = os.environ.get(SEED_ENV)
    if chosen:
        return [int(chosen)]
    return list(range(int(os.environ.get(COUNT_ENV, count))))


@pytest.fixture(scope="module")
def pools() -> Iterator[dict[int, Workers]]:
    """Worker pools by size, started once for the module."""
    made: dict[int, Workers] = {}
    yield made
    for pool in made.values():
        pool.close()


def pool(pools: dict[int, Workers], size: int) -> Workers:
    if size not in pools:
        pools[size] = Workers(size)
    return pools[size]


@pytest.fixture(scope="module")
def logs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("history-logs")


@pytest.fixture(scope="module")
def sqlite_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Lake, Backend]]:
    root = tmp_path_factory.mktemp("history-sqlite")
    backend = Backend("sqlite", f"sqlite:///{root}/lake.db", lambda name: f"file://{root}/{name}")
    with Lake.connect(backend.kv_url) as lake:
        yield lake, backend


@pytest.fixture(scope="module")
def postgres_s3_backend(postgres_url: str, s3_server: S3Server) -> Iterator[tuple[Lake, Backend]]:
    """A table of its own on the session's PostgreSQL and a bucket on the session's S3
    server, for every history of the module."""
    client = s3_server.client()
    bucket = unique_name("bw-history-")
    client.create_bucket(Bucket=bucket)
    backend = Backend(
        "postgres-s3",
        f"{postgres_url}?table={unique_name('history_')}",
        lambda name: f"s3://{bucket}/{name}",
        s3_server.options,
    )
    with Lake.connect(backend.kv_url, s3_options=backend.s3_options) as lake:
        yield lake, backend
    paginator = client.get_paginator("list_objects_v2")
    for page in paginator.paginate(Bucket=bucket):
        keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
        if keys:
            client.delete_objects(Bucket=bucket, Delete={"Objects": keys})
    client.delete_bucket(Bucket=bucket)
    client.close()


BACKENDS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres_s3", id="postgres-s3", marks=[pytest.mark.postgres, pytest.mark.s3]),
]


def run_and_check(
    request: pytest.FixtureRequest,
    backend_name: str,
    seed: int,
    settings: Settings,
    pools: dict[int, Workers],
    logs: Path,
    collect: Collect = rule_sweep,
) -> None:
    lake, backend = request.getfixturevalue(f"{backend_name}_backend")
    workers = pool(pools, settings.workers)
    outcome = run_history(lake, workers, backend, seed, settings, logs, collect)
    assert outcome.records, "the workers logged nothing"
    assert not outcome.violations, (
        f"seed {seed} on {backend.name}: {len(outcome.violations)} violations "
        f"(logs in {logs}); run it again: "
        f"{reproduce(seed, backend.name, request.node.originalname)}\n"
        + "\n".join(outcome.violations[:20])
    )


@pytest.mark.parametrize("seed", sorted(set(seeds(20)) | set(REGRESSION_SEEDS)))
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_history_keeps_the_model(
    request: pytest.FixtureRequest,
    backend_name: str,
    seed: int,
    pools: dict[int, Workers],
    logs: Path,
) -> None:
    run_and_check(request, backend_name, seed, FAST, pools, logs)


@pytest.mark.slow
@pytest.mark.parametrize("seed", seeds(SLOW_SEEDS))
@pytest.mark.parametrize("backend_name", BACKENDS)
def test_killed_histories_keep_the_model(
    request: pytest.FixtureRequest,
    backend_name: str,
    seed: int,
    pools: dict[int, Workers],
    logs: Path,
) -> None:
    """Workers killed at their failpoints and started again. In the long run the final GC
    run is the Spark job's (in this process, on the session's Spark); `make test` sweeps by
    the rule the Spark job is tested against, as the fast variant does."""
    lake, backend = request.getfixturevalue(f"{backend_name}_backend")

    def spark_job(repo: Repository) -> int:
        spark: SparkSession = request.getfixturevalue("spark")
        gc = GCLake(spark, lake, repo, backend.kv_url, backend.s3_options or {})
        summary = gc.run()
        return summary.counts["deleted"].objects

    collect = spark_job if LONG_TESTS else rule_sweep
    run_and_check(request, backend_name, seed, SLOW, pools, logs, collect)
