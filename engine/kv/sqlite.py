"""SQLite driver (`sqlite:///relative.db`, `sqlite:////abs/path.db`): the embedded default.

WAL mode lets readers run beside the single writer; every statement commits on its own and
waits up to `busy_timeout` for the write lock, so several processes and threads can share
one file. Writes are fully synced by default (`?synchronous=normal` trades the last
commits on power loss for speed; an application crash loses nothing either way).

The table is `WITHOUT ROWID`: rows live in the primary key's B-tree, ordered by
(partition, key), so a partition's scan reads neighbouring pages instead of chasing rowids
across a file that concurrent writers filled interleaved, which slowed a staging token's
scan. A file made before that keeps its rowid table and works as it is;
`SQLiteStore.upgrade_table()` copies it into the new layout in one transaction.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import urllib.parse
from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, MetaData, Table, create_engine, event, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.pool import NullPool

from branchwater.engine.errors import (
    BranchwaterError,
    ConfigurationError,
    LakeNotFound,
    Unavailable,
    lake_closed,
)
from branchwater.engine.kv.sql import (
    BUSY_TIMEOUT_SECONDS,
    DEFAULT_TABLE,
    Cursor,
    SQLStore,
    fetch_all,
    fetch_one,
    kv_table,
    statements,
)
from branchwater.engine.urls import redact_url

SQLITE_BUSY = 5
SQLITE_PROTOCOL = 15
"""WAL lock contention SQLite gave up on: a connection starting a transaction lost the race
for the WAL index's locks again and again. Like a busy refusal it applied nothing."""
SYNCHRONOUS_MODES = ("full", "normal", "extra")
NO_TABLE = f"the file holds no table {DEFAULT_TABLE!r}"


class SQLiteStore(SQLStore):
    """A `Store` in one SQLite file, shared safely by threads and processes."""

    _errors = (sqlite3.Error,)

    def __init__(self, url: str, *, create: bool = True) -> None:
        self.path, self._synchronous = _parse(url)
        connect = _connector(self.path, create)
        engine = create_engine("sqlite://", poolclass=NullPool, creator=connect)
        event.listen(engine, "connect", self._on_connect)
        event.listen(engine, "begin", _begin_immediate)
        quote = engine.dialect.identifier_preparer.quote
        super().__init__(url, engine, statements(DEFAULT_TABLE, quote, "?"))
        self.without_rowid = _is_without_rowid(
            self._create_schema() if create else self._find_lake(connect)
        )
        """Whether the table has the key-ordered layout (False: a file from before it)."""

    def _on_connect(self, dbapi: sqlite3.Connection, _record: object) -> None:
        """WAL is a property of the file; asking again on every connection is a cheap no-op."""
        dbapi.execute("PRAGMA journal_mode = WAL")
        dbapi.execute(f"PRAGMA synchronous = {self._synchronous}")

    def _find_lake(self, connect: Callable[[], sqlite3.Connection]) -> str:
        """For a store opened without creating: the table's SQL, or `LakeNotFound` unless
        the file is there and holds the table. A file that cannot be looked at (a folder
        without permission) is not taken for missing: opening it then says what is wrong.
        The table is looked for on a connection of its own, before any makes the file WAL,
        so a file that is not a lake is left as it was."""
        try:
            os.stat(self.path)
        except FileNotFoundError:
            raise LakeNotFound(repr(self.path), "the file does not exist") from None
        except OSError:
            pass
        try:
            with contextlib.closing(connect()) as conn:
                found = conn.execute(TABLE_SQL, (DEFAULT_TABLE,)).fetchone()
        except sqlite3.Error as exc:
            raise self._failure(exc) from exc
        if found is None:
            raise LakeNotFound(repr(self.path), NO_TABLE)
        return str(found[0])

    def _create_schema(self) -> str:
        """Create the table, safely when several processes open a fresh file at once; returns
        its SQL, which says whether it is `WITHOUT ROWID` (an older file keeps its rowid
        table).

        A file that has the table (every open but the first) is only read, as WAL lets
        readers read beside the writer: taking the write lock to look would queue a new
        process behind busy writers, whose own waits (`SQLStore._when_free`) poll far more
        often than SQLite's busy handler, for as long as they keep writing. Otherwise the
        check and the `CREATE TABLE` run inside `BEGIN IMMEDIATE`, which holds the write
        lock, so a second process waits and then sees the table instead of failing.
        """
        try:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            row = self._fetch(TABLE_SQL, (DEFAULT_TABLE,), fetch_one)
            if row is not None:
                return str(row[0])
            with self._lock, self._engine.begin() as conn:
                _new_table(DEFAULT_TABLE).create(conn, checkfirst=True)
                return _table_sql(conn, DEFAULT_TABLE)
        except (OSError, DBAPIError, sqlite3.Error) as exc:
            raise self._failure(exc) from exc

    def upgrade_table(self) -> bool:
        """Copy a rowid table into the `WITHOUT ROWID` layout; False if it already has it.

        One transaction under the write lock: other processes wait (up to the busy timeout)
        and then see the new table, readers see the old one until the commit, and a crash
        leaves the old one as it was. It takes about as long as a scan of the whole file.
        """
        if self.without_rowid:
            return False
        quote = self._engine.dialect.identifier_preparer.quote
        old, new = quote(DEFAULT_TABLE), quote(f"{DEFAULT_TABLE}_upgrade")
        try:
            with self._lock:
                if self._closed:
                    raise lake_closed()
                with self._engine.begin() as conn:
                    if _is_without_rowid(_table_sql(conn, DEFAULT_TABLE)):
                        self.without_rowid = True
                        return False
                    conn.exec_driver_sql(f"DROP TABLE IF EXISTS {new}")
                    _new_table(f"{DEFAULT_TABLE}_upgrade").create(conn)
                    conn.exec_driver_sql(
                        f"INSERT INTO {new} SELECT partition_key, key, value FROM {old} "
                        "ORDER BY partition_key, key"
                    )
                    conn.exec_driver_sql(f"DROP TABLE {old}")
                    conn.exec_driver_sql(f"ALTER TABLE {new} RENAME TO {old}")
        except (DBAPIError, sqlite3.Error) as exc:
            raise self._failure(exc) from exc
        self.without_rowid = True
        return True

    def _open_cursor(self, dbapi: Any) -> Cursor:
        """Hot-path connections wait for the lock in `SQLStore._when_free`, not in SQLite."""
        dbapi.execute("PRAGMA busy_timeout = 0")
        return dbapi.cursor()

    def _after_bulk_chunk(self) -> None:
        """Checkpoint the WAL the drop just grew, so the foreground write that would cross
        the auto-checkpoint threshold does not pay for copying it; PASSIVE never blocks."""
        self._fetch("PRAGMA wal_checkpoint(PASSIVE)", (), fetch_all)

    def _is_busy(self, exc: Exception) -> bool:
        """`SQLITE_PROTOCOL` is waited out as well: it is contention for the WAL's locks
        that SQLite stopped retrying, which passes as a busy writer does."""
        return _primary_code(exc) in (SQLITE_BUSY, SQLITE_PROTOCOL)

    def _failure(self, exc: Exception) -> BranchwaterError:
        """The typed error; a lock never let go says what holds it and that the statement,
        refused as busy, applied nothing (a conditional write may be sent again as it is)."""
        if isinstance(exc, BranchwaterError):
            return exc
        reason = getattr(exc, "orig", None) or exc
        code = _primary_code(reason) if isinstance(reason, Exception) else 0
        if code == SQLITE_BUSY:
            reason = (
                f"{reason}: another connection held its write lock for the whole wait "
                f"({BUSY_TIMEOUT_SECONDS:g} s): a long transaction (upgrade_table, a backup, an "
                "sqlite3 shell) or a process stopped while writing; nothing was written, "
                "try again once it lets go"
            )
        elif code == SQLITE_PROTOCOL:
            reason = (
                f"{reason}: its WAL locks stayed contended for the whole wait "
                f"({BUSY_TIMEOUT_SECONDS:g} s): many connections starting transactions at "
                "once, or a file system whose locks SQLite cannot rely on (a network share: "
                "keep the file on a local disk); nothing was written, try again"
            )
        return Unavailable(f"SQLite database {self.path!r} ({self.url}) is unavailable: {reason}")


def _primary_code(exc: Exception) -> int:
    """The SQLite result code of a driver error without its extended bits (0 if none)."""
    return getattr(exc, "sqlite_errorcode", 0) & 0xFF


def _connector(path: str, create: bool) -> Callable[[], sqlite3.Connection]:
    """How the store's connections are made: without `create`, through a `mode=rw` URI,
    which opens the file only if it is there, so a lake file removed while the store is
    open is never made again, empty."""
    database = path if create else f"file:{urllib.parse.quote(path)}?mode=rw"

    def connect() -> sqlite3.Connection:
        return sqlite3.connect(
            database,
            timeout=BUSY_TIMEOUT_SECONDS,
            isolation_level=None,
            check_same_thread=False,
            uri=not create,
        )

    return connect


def _new_table(name: str) -> Table:
    return kv_table(name, MetaData(), sqlite_with_rowid=False)


TABLE_SQL = "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?"
"""A table's `CREATE` statement, the only place SQLite records its layout."""


def _table_sql(conn: Connection, table: str) -> str:
    return str(conn.exec_driver_sql(TABLE_SQL, (table,)).scalar_one())


def _is_without_rowid(create_sql: str) -> bool:
    return " ".join(create_sql.upper().split()).endswith("WITHOUT ROWID")


def _begin_immediate(conn: Connection) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def _parse(url: str) -> tuple[str, str]:
    """The absolute database path and the synchronous mode, or `ConfigurationError`."""
    redacted = redact_url(url)
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        parsed = None
    if parsed is None or parsed.username or parsed.password or parsed.host or parsed.port:
        raise ConfigurationError(
            f"malformed SQLite URL {redacted!r}: it takes a path only, sqlite:///relative.db "
            "or sqlite:////absolute/path.db"
        ) from None
    path = parsed.database or ""
    if not path or path == ":memory:" or path.startswith("file:"):
        raise ConfigurationError(
            f"SQLite URL {redacted!r} names no database file; use sqlite:///path.db "
            "(or memory:// for an in-process store)"
        )
    options = dict(parsed.query)
    synchronous = str(options.pop("synchronous", "full")).lower()
    if synchronous not in SYNCHRONOUS_MODES or options:
        raise ConfigurationError(
            f"SQLite URL {redacted!r}: the only option is synchronous={'|'.join(SYNCHRONOUS_MODES)}"
        )
    return os.path.abspath(path), synchronous
