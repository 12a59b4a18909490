"""Opening stores: URL parsing and the typed, password-free errors for unusable backends."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from branchwater.engine.errors import (
    ConfigurationError,
    InvalidArgument,
    PredicateFailed,
    Unavailable,
)
from branchwater.engine.kv import open_store
from branchwater.engine.kv.memory import MemoryStore
from branchwater.engine.kv.sqlite import SQLiteStore
from tests.helpers.servers import PG_HOST, PG_PORT, PG_USER, free_port, unique_name

SECRET = "s3cr3t-pass"


@pytest.mark.parametrize("url", ["redis://localhost/0", "kv.db", "mysql://u@h/db"])
def test_unknown_scheme_is_a_configuration_error(url: str) -> None:
    with pytest.raises(ConfigurationError, match="scheme"):
        open_store(url)


@pytest.mark.parametrize(
    "url",
    [SECRET, f"host=db user=bw password={SECRET}", f"bw:{SECRET}@db/lake"],
    ids=["bare", "libpq", "no-scheme"],
)
def test_a_kv_setting_that_is_no_url_is_refused_without_being_shown(url: str) -> None:
    """A password pasted where the URL goes, or a libpq string: no redaction can tell its
    secret apart, and the message reaches logs and the UI's error page."""
    with pytest.raises(ConfigurationError, match="scheme") as refused:
        open_store(url)
    assert SECRET not in str(refused.value)


def test_non_string_url_is_rejected() -> None:
    with pytest.raises(InvalidArgument):
        open_store(b"memory://")  # type: ignore[arg-type]


def test_memory_url_opens_memory_store() -> None:
    assert isinstance(open_store("memory://"), MemoryStore)


def test_relative_sqlite_path_is_resolved_against_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with open_store("sqlite:///nested/lake.db") as store:
        assert isinstance(store, SQLiteStore)
        store.set(b"p", b"k", b"v")
    assert (tmp_path / "nested" / "lake.db").is_file()


def test_sqlite_store_persists_across_opens(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'kv.db'}"
    with open_store(url) as store:
        store.set(b"p", b"k", b"kept")
    with open_store(url) as store:
        assert store.get(b"p", b"k").value == b"kept"


def test_sqlite_path_under_a_file_is_unavailable_and_names_path(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_bytes(b"")
    path = blocker / "sub" / "kv.db"
    with pytest.raises((Unavailable, ConfigurationError), match=str(blocker)):
        open_store(f"sqlite:///{path}")


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "sqlite:///kv.db?journal=off"])
def test_sqlite_url_without_file_or_with_unknown_option_is_rejected(url: str) -> None:
    with pytest.raises(ConfigurationError):
        open_store(url)


def test_sqlite_file_that_is_not_a_database_is_unavailable(tmp_path: Path) -> None:
    path = tmp_path / "garbage.db"
    path.write_bytes(b"this is not an SQLite database file" * 100)
    with pytest.raises(Unavailable, match=r"garbage\.db"):
        open_store(f"sqlite:///{path}")


@pytest.mark.postgres
def test_postgres_closed_port_is_unavailable_without_password() -> None:
    url = f"postgresql://postgres:{SECRET}@127.0.0.1:{free_port()}/postgres"
    with pytest.raises(Unavailable) as caught:
        open_store(url)
    message = str(caught.value)
    assert "127.0.0.1" in message
    assert SECRET not in message
    assert "***" in message


@pytest.mark.postgres
def test_postgres_store_url_masks_the_password(postgres_url: str) -> None:
    with_secret = postgres_url.replace(f"{PG_USER}@", f"{PG_USER}:{SECRET}@", 1)
    store = open_store(with_secret)
    try:
        assert SECRET not in store.url
        assert store.url == with_secret.replace(SECRET, "***")
    finally:
        store.close()


@pytest.mark.postgres
def test_postgres_unknown_role_is_unavailable(postgres_url: str) -> None:
    role = unique_name("nobody_")
    url = f"postgresql://{role}:{SECRET}@{PG_HOST}:{PG_PORT}/postgres"
    with pytest.raises(Unavailable, match=role) as caught:
        open_store(url)
    assert SECRET not in str(caught.value)


@pytest.mark.postgres
def test_postgres_missing_database_is_unavailable(postgres_url: str) -> None:
    database = unique_name("missing_")
    with pytest.raises(Unavailable, match=database):
        open_store(f"postgresql://postgres@{PG_HOST}:{PG_PORT}/{database}")


@pytest.mark.parametrize(
    "options", ["table=drop;table", "table=" + "x" * 60, "partitions=0", "partitions=many"]
)
def test_postgres_bad_options_are_configuration_errors(options: str) -> None:
    with pytest.raises(ConfigurationError):
        open_store(f"postgresql://postgres@127.0.0.1:1/db?{options}")


@pytest.mark.postgres
def test_postgres_reopening_an_existing_table_keeps_data(postgres_url: str) -> None:
    url = f"{postgres_url}?table={unique_name('kv_')}"
    with open_store(url) as store:
        store.set(b"p", b"k", b"kept")
    with open_store(url) as store:
        assert store.get(b"p", b"k").value == b"kept"


@pytest.mark.postgres
def test_postgres_reconnects_after_its_session_is_killed(postgres_url: str) -> None:
    import psycopg

    with open_store(f"{postgres_url}?table={unique_name('kv_')}") as store:
        store.set(b"p", b"k", b"v")
        backend = store._idle[-1].dbapi.info.backend_pid  # type: ignore[attr-defined]
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (backend,))
        assert store.get(b"p", b"k").value == b"v"
        store.set(b"p", b"k", b"after")
        assert store.get(b"p", b"k").value == b"after"
        assert store._idle[-1].dbapi.info.backend_pid != backend  # type: ignore[attr-defined]


def test_dynamodb_unreachable_endpoint_is_unavailable_quickly() -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(Unavailable, match=endpoint):
        open_store(f"dynamodb://some-table?endpoint_url={endpoint}&region=us-east-1")
    assert time.monotonic() - started < 20


@pytest.mark.parametrize(
    "url", ["dynamodb://x", "dynamodb://bad table", "dynamodb://tbl?colour=red"]
)
def test_dynamodb_bad_urls_are_configuration_errors(url: str) -> None:
    with pytest.raises(ConfigurationError):
        open_store(url)


def test_sqlite_write_lock_timeout_is_unavailable_naming_the_url(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sqlite3

    import branchwater.engine.kv.sql as sql_driver
    import branchwater.engine.kv.sqlite as sqlite_driver

    monkeypatch.setattr(sqlite_driver, "BUSY_TIMEOUT_SECONDS", 0.1)  # SQLite's busy handler
    monkeypatch.setattr(sql_driver, "BUSY_TIMEOUT_SECONDS", 0.5)  # the driver's own retries
    path = tmp_path / "locked.db"
    with open_store(f"sqlite:///{path}") as store:
        holder = sqlite3.connect(path, isolation_level=None)
        holder.execute("BEGIN EXCLUSIVE")
        try:
            with pytest.raises(Unavailable, match="locked") as caught:
                store.set(b"p", b"k", b"v")
            assert str(path) in str(caught.value)
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        store.set(b"p", b"k", b"v")
        assert store.get(b"p", b"k").value == b"v"


@pytest.mark.postgres
def test_postgres_conditional_write_on_a_session_lost_while_idle_uses_a_new_one(
    postgres_url: str,
) -> None:
    """Found lost before it is sent, the write goes on a new connection, applied once; one
    lost while under way is tests/integration/test_server_loss.py's."""
    import psycopg

    with open_store(f"{postgres_url}?table={unique_name('kv_')}") as store:
        store.set(b"p", b"k", b"v")
        backend = store._idle[-1].dbapi.info.backend_pid  # type: ignore[attr-defined]
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (backend,))
            while admin.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (backend,)
            ).fetchone()[0]:  # type: ignore[index]
                time.sleep(0.01)
        store.set_if(b"p", b"k", b"w", b"v")
        assert store.get(b"p", b"k").value == b"w"
        with pytest.raises(PredicateFailed):
            store.set_if(b"p", b"k", b"x", b"v")
