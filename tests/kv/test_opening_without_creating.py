"""`open_store(url, create=False)`: a store that holds no lake (no SQLite file, or one without
the lake's table; no PostgreSQL table; no DynamoDB table) is `LakeNotFound` and nothing is
created; one that holds a lake opens as usual; one that cannot be reached or looked at is
`Unavailable`, never missing. And a read-only open racing a creation sees no lake or all of
it, never a half-made table."""

from __future__ import annotations

import os
import pickle
import sqlite3
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from branchwater.engine.errors import InvalidArgument, LakeNotFound, NotFound, Unavailable
from branchwater.engine.kv import open_store, postgres
from branchwater.engine.kv import sqlite as sqlite_driver
from branchwater.engine.kv.memory import MemoryStore
from branchwater.engine.kv.sql import DEFAULT_TABLE
from branchwater.engine.kv.sqlite import SQLiteStore
from tests.helpers.gc import rowid_sqlite_file
from tests.helpers.servers import PG_HOST, PG_PORT, free_port, unique_name
from tests.helpers.tables import dynamodb_tables, pg_tables

SECRET = "s3cr3t-pass"
READ_ONLY_SESSION = "options=-c%20default_transaction_read_only%3Don"
"""libpq's options for a session in which any DDL fails: what opening without creating runs
must pass there."""


@dataclass
class Place:
    """A URL naming a store that holds no lake yet, and how to tell whether anything of it
    was made."""

    url: str
    made: Callable[[], bool]
    missing: str
    """What `LakeNotFound` must say is missing."""


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
        pytest.param("dynamodb", id="dynamodb", marks=pytest.mark.s3),
    ]
)
def place(request: pytest.FixtureRequest, tmp_path: Path) -> Place:
    if request.param == "sqlite":
        folder = tmp_path / "nested"
        return Place(f"sqlite:///{folder / 'kv.db'}", folder.exists, "the file does not exist")
    if request.param == "postgres":
        base = request.getfixturevalue("postgres_url")
        table = unique_name("kv_")
        return Place(
            f"{base}?table={table}&partitions=4",
            lambda: bool(pg_tables(base, table)),
            f"table {table!r} does not exist",
        )
    endpoint = request.getfixturevalue("dynamodb_endpoint")
    table = unique_name("kv-")
    return Place(
        f"dynamodb://{table}?endpoint_url={endpoint}&region=us-east-1",
        lambda: table in dynamodb_tables(endpoint),
        f"DynamoDB table {table!r} does not exist",
    )


def test_a_store_without_a_lake_is_not_found_and_nothing_is_made(place: Place) -> None:
    with pytest.raises(LakeNotFound) as caught:
        open_store(place.url, create=False)
    error = caught.value
    assert isinstance(error, NotFound)
    assert error.missing == place.missing
    assert str(error).startswith(f"no lake at {error.where}: {place.missing}; check the URL")
    assert not place.made()
    with pytest.raises(LakeNotFound):  # and again: the first refusal left nothing behind
        open_store(place.url, create=False)
    assert not place.made()


def test_a_store_with_a_lake_opens_without_creating(place: Place) -> None:
    with open_store(place.url) as made:
        made.set(b"p", b"k", b"kept")
    assert place.made()
    with open_store(place.url, create=False) as opened:
        assert opened.get(b"p", b"k").value == b"kept"
        opened.set_if(b"p", b"k", b"changed", b"kept")
        assert [kv.key for kv in opened.scan(b"p")] == [b"k"]
    with open_store(place.url, create=False) as again:
        assert again.get(b"p", b"k").value == b"changed"


def test_lake_not_found_pickles_with_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(LakeNotFound) as caught:
        open_store(f"sqlite:///{tmp_path / 'kv.db'}", create=False)
    again = pickle.loads(pickle.dumps(caught.value))
    assert type(again) is LakeNotFound
    assert (again.where, again.missing) == (
        repr(str(tmp_path / "kv.db")),
        "the file does not exist",
    )
    assert str(again) == str(caught.value)


def test_create_must_be_a_bool(tmp_path: Path) -> None:
    with pytest.raises(InvalidArgument, match="create must be True or False"):
        open_store(f"sqlite:///{tmp_path / 'kv.db'}", create="False")  # type: ignore[arg-type]
    assert list(tmp_path.iterdir()) == []


def test_a_memory_store_is_always_there() -> None:
    with open_store("memory://", create=False) as store:
        assert isinstance(store, MemoryStore)


# -------------------------------------------------------------------------------- SQLite


def test_a_sqlite_lake_in_the_rowid_layout_opens_as_it_is(tmp_path: Path) -> None:
    url = rowid_sqlite_file(tmp_path / "kv.db")
    with open_store(url, create=False) as store:
        assert isinstance(store, SQLiteStore)
        assert not store.without_rowid
        store.set(b"p", b"k", b"v")
        assert store.get(b"p", b"k").value == b"v"


def test_a_sqlite_file_that_is_not_a_lake_is_not_found_and_left_as_it_was(tmp_path: Path) -> None:
    """Not even switched to WAL: the table is looked for before a store's connection would."""
    path = tmp_path / "theirs.db"
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE theirs (a)")
    conn.close()
    before = path.read_bytes()
    with pytest.raises(LakeNotFound, match=f"no table '{DEFAULT_TABLE}'") as caught:
        open_store(f"sqlite:///{path}", create=False)
    assert caught.value.where == repr(str(path))
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["theirs.db"]


def test_a_sqlite_lake_that_cannot_be_looked_at_is_unavailable_not_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lake behind a folder without permission is not reported as no lake: opening it says
    what is wrong, and opening without creating makes no file even where it may."""
    path = tmp_path / "kv.db"
    real_stat = os.stat

    def refused(target: str | os.PathLike[str], *args: Any, **kwargs: Any) -> os.stat_result:
        if os.fspath(target) == str(path):
            raise PermissionError(13, "Permission denied", str(path))
        return real_stat(target, *args, **kwargs)

    monkeypatch.setattr(os, "stat", refused)
    with pytest.raises(Unavailable, match="unable to open") as caught:
        open_store(f"sqlite:///{path}", create=False)
    assert not isinstance(caught.value, LakeNotFound)
    assert str(path) in str(caught.value)
    assert os.listdir(tmp_path) == []


def test_a_sqlite_read_only_open_racing_a_creation_sees_no_lake_or_all_of_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file exists before its table: an open in between says no lake, rather than
    creating the table itself or seeing an empty file as an empty lake."""
    url = f"sqlite:///{tmp_path / 'kv.db'}"
    holding, release = threading.Event(), threading.Event()
    new_table = sqlite_driver._new_table

    def held(name: str) -> object:
        holding.set()
        assert release.wait(60)
        return new_table(name)

    monkeypatch.setattr(sqlite_driver, "_new_table", held)
    with ThreadPoolExecutor(1) as pool:
        creating = pool.submit(open_store, url)
        try:
            assert holding.wait(60)
            assert (tmp_path / "kv.db").is_file()
            with pytest.raises(LakeNotFound, match=f"no table '{DEFAULT_TABLE}'"):
                open_store(url, create=False)
        finally:
            release.set()
        with creating.result(60) as made, open_store(url, create=False) as reader:
            made.set(b"p", b"k", b"v")
            assert reader.get(b"p", b"k").value == b"v"


# ---------------------------------------------------------------------------- PostgreSQL


@pytest.mark.postgres
def test_a_postgres_open_without_creating_runs_no_ddl(postgres_url: str) -> None:
    """In a session where DDL fails, creating fails but opening without creating says what
    is missing, and opens the lake once it is there."""
    table = unique_name("kv_")
    read_only = f"{postgres_url}?table={table}&{READ_ONLY_SESSION}"
    with pytest.raises(Unavailable, match="read-only transaction"):
        open_store(read_only)
    with pytest.raises(LakeNotFound, match=f"table '{table}' does not exist"):
        open_store(read_only, create=False)
    assert pg_tables(postgres_url, table) == set()
    with open_store(f"{postgres_url}?table={table}&partitions=2") as made:
        made.set(b"p", b"k", b"v")
    with open_store(read_only, create=False) as reader:
        assert reader.get(b"p", b"k").value == b"v"
    assert pg_tables(postgres_url, table) == {table, f"{table}_p0", f"{table}_p1"}


@pytest.mark.postgres
def test_a_missing_postgres_table_is_named_with_the_password_masked(postgres_url: str) -> None:
    table = unique_name("kv_")
    with_secret = postgres_url.replace("postgres@", f"postgres:{SECRET}@", 1)
    with pytest.raises(LakeNotFound) as caught:
        open_store(f"{with_secret}?table={table}", create=False)
    message = str(caught.value)
    assert SECRET not in message
    assert (
        caught.value.where
        == f"{postgres_url.replace('postgres@', 'postgres:***@', 1)}?table={table}"
    )
    assert f"table '{table}' does not exist" in message


@pytest.mark.postgres
def test_postgres_connection_failures_stay_unavailable_without_creating(
    postgres_url: str,
) -> None:
    closed = f"postgresql://postgres:{SECRET}@127.0.0.1:{free_port()}/postgres?table=kv"
    with pytest.raises(Unavailable) as caught:
        open_store(closed, create=False)
    assert not isinstance(caught.value, LakeNotFound)
    assert SECRET not in str(caught.value)
    database = unique_name("missing_")
    with pytest.raises(Unavailable, match=database) as caught:
        open_store(f"postgresql://postgres@{PG_HOST}:{PG_PORT}/{database}", create=False)
    assert not isinstance(caught.value, LakeNotFound)


@pytest.mark.postgres
def test_a_postgres_read_only_open_racing_creations_sees_no_lake_or_all_of_it(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first creator is held after its table is made, before its partitions are and
    before it commits: an open without creating then says no lake (and does not wait), a
    second creator waits for the first's advisory lock and then finds everything made, and
    both, and a read-only open after them, share one whole table."""
    table = unique_name("kv_")
    url = f"{postgres_url}?table={table}&partitions=4"
    holding, release = threading.Event(), threading.Event()
    partition_ddl = postgres._partition_ddl

    def held(*args: object) -> list[str]:
        holding.set()
        assert release.wait(60)
        return partition_ddl(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(postgres, "_partition_ddl", held)
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(open_store, url)
        try:
            assert holding.wait(60)
            started = time.monotonic()
            with pytest.raises(LakeNotFound):
                open_store(url, create=False)
            assert time.monotonic() - started < 5
            second = pool.submit(open_store, url)
            time.sleep(0.5)
            assert not second.done()
        finally:
            release.set()
        with (
            first.result(60) as one,
            second.result(60) as two,
            open_store(url, create=False) as reader,
        ):
            one.set(b"p", b"k", b"one")
            two.set(b"q", b"k", b"two")
            assert reader.get(b"p", b"k").value == b"one"
            assert reader.get(b"q", b"k").value == b"two"
            assert isinstance(reader, postgres.PostgresStore)
            assert len(reader._layout()) == 4
    assert pg_tables(postgres_url, table) == {table, *(f"{table}_p{i}" for i in range(4))}


# ------------------------------------------------------------------------------ DynamoDB


def test_an_unreachable_dynamodb_is_unavailable_not_missing() -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(Unavailable, match=endpoint) as caught:
        open_store(f"dynamodb://some-table?endpoint_url={endpoint}&region=us-east-1", create=False)
    assert not isinstance(caught.value, LakeNotFound)
