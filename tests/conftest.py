"""Shared fixtures: real servers on loopback, one per test session, and the hypothesis
profiles.

In CI (`CI=true`) a server that cannot be reached fails the run instead of skipping tests.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from hypothesis import HealthCheck, settings

from branchwater.engine import Lake
from branchwater.engine.api import Repository
from branchwater.engine.graveler.committed import RangePolicy
from branchwater.engine.objects.local import SYNC_ENV as LOCAL_SYNC_ENV
from tests.helpers.long_run import LONG_TESTS
from tests.helpers.servers import (
    PG_HOST,
    PG_PORT,
    PG_USER,
    free_port,
    private_database,
    unique_name,
)

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
RANGE_CACHE_DIR = tempfile.mkdtemp(prefix="bw-range-cache-")
os.environ["BRANCHWATER_CACHE_DIR"] = RANGE_CACHE_DIR
"""Tests share one range cache of their own, never the user's (subprocesses inherit it)."""
os.environ.setdefault(LOCAL_SYNC_ENV, "off")
"""Test and benchmark lakes are thrown away: their local stores skip `fsync` (half the time
of the local-store tests); the tests of syncing turn it on."""

LONG_EXAMPLES = 10
"""The long run's factor on each hypothesis test's examples (most name their own count)."""
settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("long", settings.get_profile("ci"), derandomize=False)
settings.register_profile("dev", deadline=None, print_blob=True)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE")
    or ("long" if LONG_TESTS else "ci" if os.environ.get("CI") == "true" else "dev")
)
"""The profile is loaded before any test module builds its `settings(...)`, which inherit
what they do not name: in CI the examples are the same on every run (derandomized, so its
time does not vary) and a failure prints the blob that reproduces it; no deadline, since the
machine is shared. The long run (`BRANCHWATER_LONG_TESTS=1`) draws fresh examples, ten times
as many (`pytest_collection_modifyitems`)."""

pytest_plugins = [
    "tests.fixtures.spark",
    "tests.fixtures.airflow",
    "tests.fixtures.s3",
    "tests.fixtures.stack",
    "tests.fixtures.browser",
    "tests.fixtures.failpoints",
]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """In the long run, each hypothesis test runs `LONG_EXAMPLES` times its examples."""
    if settings.get_current_profile_name() != "long":
        return
    for item in items:
        test = getattr(getattr(item, "obj", None), "hypothesis", None)
        inner = getattr(test, "inner_test", None)
        chosen = getattr(item.obj, "_hypothesis_internal_use_settings", None)
        if inner is None or chosen is None:
            continue
        item.obj._hypothesis_internal_use_settings = settings(
            chosen, max_examples=chosen.max_examples * LONG_EXAMPLES
        )


def pytest_unconfigure(config: pytest.Config) -> None:
    shutil.rmtree(RANGE_CACHE_DIR, ignore_errors=True)


@pytest.fixture
def lake() -> Iterator[Lake]:
    """An in-memory lake whose ranges hold a few entries, so small trees span many ranges."""
    with Lake.connect(
        "memory://", range_policy=RangePolicy(target_entries=8, max_entries=32)
    ) as lake:
        yield lake


@pytest.fixture
def repo(lake: Lake, tmp_path: Path) -> Repository:
    """Repository `sales` on local files, in whichever `lake` the test's module provides."""
    return lake.create_repository("sales", storage_namespace=f"file://{tmp_path}/sales")


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A fresh database on the local PostgreSQL server for this test session, dropped after."""
    with private_database("bw_test_") as name:
        yield f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/{name}"


@pytest.fixture
def pg_session(postgres_url: str) -> Iterator[psycopg.Connection]:
    """Another session on the test database, to hold row locks in a transaction of its own
    (`tests.helpers.row_locks`)."""
    with psycopg.connect(postgres_url) as conn:
        yield conn


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def race_kv(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A lake's KV URL on SQLite, then on the PostgreSQL server (a table of its own): every
    race and every forced interleaving runs on both."""
    if request.param == "postgres":
        return f"{request.getfixturevalue('postgres_url')}?table={unique_name('race_')}"
    return f"sqlite:///{tmp_path}/lake.db"


@pytest.fixture(scope="session")
def dynamodb_endpoint() -> Iterator[str]:
    """moto's DynamoDB-compatible server on a free loopback port (S3 tests use `s3_server`).

    The DynamoDB KV driver takes credentials from boto3's usual chain, so dummy ones are
    set for the session unless the environment already has some.
    """
    from moto.server import ThreadedMotoServer

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()
