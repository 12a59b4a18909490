"""The `store` fixture: every KV test runs against each driver, on a fresh store (SQLite in
both table layouts: `WITHOUT ROWID`, and the rowid table of files made before it)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from branchwater.engine.kv import Store, open_store
from branchwater.engine.kv.dynamodb import DynamoDBStore
from branchwater.engine.kv.postgres import PostgresStore
from tests.helpers.gc import rowid_sqlite_file
from tests.helpers.row_locks import GENERIC_PLANS
from tests.helpers.servers import unique_name

GUARD = (b"branches", b"main")
"""The branch record a guarded step checks, as tests of the DynamoDB driver's own paths
write it."""

DRIVERS = [
    pytest.param("memory", id="memory"),
    pytest.param("sqlite", id="sqlite"),
    pytest.param("sqlite-rowid", id="sqlite-rowid"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    pytest.param("dynamodb", id="dynamodb", marks=pytest.mark.s3),
]


def store_url(driver: str, request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A URL naming a store nobody has used yet; servers are started only when needed."""
    if driver == "memory":
        return "memory://"
    if driver == "sqlite":
        return f"sqlite:///{tmp_path / 'kv.db'}"
    if driver == "sqlite-rowid":
        return rowid_sqlite_file(tmp_path / "kv.db")
    if driver == "postgres":
        base = request.getfixturevalue("postgres_url")
        return f"{base}?table={unique_name('kv_')}"
    endpoint = request.getfixturevalue("dynamodb_endpoint")
    return f"dynamodb://{unique_name('kv-')}?endpoint_url={endpoint}&region=us-east-1"


@pytest.fixture(params=DRIVERS)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    with open_store(store_url(request.param, request, tmp_path)) as opened:
        yield opened


@pytest.fixture
def pg_store(postgres_url: str) -> Iterator[PostgresStore]:
    """A PostgreSQL store on a fresh table, its sessions planning each prepared statement
    once for every key (`GENERIC_PLANS`), as a busy one soon does."""
    with open_store(f"{postgres_url}?table={unique_name('kv_')}&{GENERIC_PLANS}") as opened:
        assert isinstance(opened, PostgresStore)
        yield opened


@pytest.fixture
def dynamodb_store(dynamodb_endpoint: str) -> Iterator[DynamoDBStore]:
    """A DynamoDB store on a fresh table whose `GUARD` record holds `record`."""
    url = f"dynamodb://{unique_name('kv-')}?endpoint_url={dynamodb_endpoint}&region=us-east-1"
    with open_store(url) as opened:
        assert isinstance(opened, DynamoDBStore)
        opened.set(*GUARD, b"record")
        yield opened
