"""Shared fixtures: real servers on loopback, one per test session.

In CI (`CI=true`) a server that cannot be reached fails the run instead of skipping tests.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from branchwater.engine import Lake
from branchwater.engine.api import Repository
from branchwater.engine.graveler.committed import RangePolicy
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

pytest_plugins = [
    "tests.fixtures.spark",
    "tests.fixtures.airflow",
    "tests.fixtures.s3",
    "tests.fixtures.stack",
    "tests.fixtures.browser",
    "tests.fixtures.failpoints",
]


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
