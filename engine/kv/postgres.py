"""PostgreSQL driver (`postgresql://user[:password]@host:port/db?table=…&partitions=…`).

The production store for many workers. One table, hash-partitioned on the partition key so
partitions spread evenly and a partition's keys stay in one physical table; bytea columns
compare byte-wise, which is the scan order the contract asks for. Other query parameters
(`sslmode`, `connect_timeout`, `keepalives_idle`, …) go to libpq unchanged.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import re
import select as sockets
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import psycopg
from psycopg import pq
from psycopg.errors import error_from_result
from sqlalchemy import Engine, MetaData, create_engine, func, inspect, make_url, select
from sqlalchemy.engine import URL
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.pool import NullPool

from branchwater.engine.errors import (
    BranchwaterError,
    ConfigurationError,
    LakeNotFound,
    OutcomeUnknown,
    Unavailable,
)
from branchwater.engine.kv.sql import (
    DEFAULT_TABLE,
    Cursor,
    SQLStore,
    Statements,
    fetch_all,
    fetch_one,
    kv_table,
    statements,
)
from branchwater.engine.kv.store import UNKNOWN_OUTCOME, key_not_found
from branchwater.engine.urls import redact_url, scrub, url_password, url_secrets

DEFAULT_PARTITIONS = 16
ROUTED_KEYS = 4096
CONNECT_TIMEOUT_SECONDS = 10
KEEPALIVES = {
    "keepalives": "1",
    "keepalives_idle": "30",
    "keepalives_interval": "10",
    "keepalives_count": "3",
}
"""libpq's TCP keepalives (a URL's own win): a statement on a connection whose network path
died silently (a failover, a NAT dropping its state) fails after about a minute instead of
waiting for the kernel's default of over two hours; the server answers the probes while it
runs a long statement, so those are not cut."""
_TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,53}")


class PostgresStore(SQLStore):
    """A `Store` in one hash-partitioned PostgreSQL table, created on first use (unless
    opened with `create=False`)."""

    _errors = (psycopg.Error,)
    drop_chunk = 5_000
    """A drop's statement locks only its own rows here, so its size is what a commit's WAL
    flush is worth: SQLite's 64 rows made a 1M-entry token's drop 15,625 flushes, a long
    background load on the server after the commit."""

    def __init__(self, url: str, *, create: bool = True) -> None:
        self._redacted = redact_url(url)
        self._secrets = url_secrets(url)
        sa_url, self.table, self.partitions = self._parse(url)
        engine = create_engine(sa_url, poolclass=NullPool)
        self._quote = quote = engine.dialect.identifier_preparer.quote
        whole = _Route(
            statements(self.table, quote, "%s"),
            _fair_statements(self.table, quote, self.table),
            self.table,
        )
        super().__init__(url, engine, whole.sql)
        self._whole = whole
        self._routes: dict[bytes, _Route] = {}
        """Each partition key's statements, addressing the partition that holds its rows
        (`_route`); at most `ROUTED_KEYS`, the oldest forgotten first."""
        self._by_partition: dict[str, _Route] = {}
        self._partitions: tuple[str, ...] | None = None
        self._create_schema(create)

    def _parse(self, url: str) -> tuple[URL, str, int]:
        """The SQLAlchemy URL for psycopg 3 plus our own `table` and `partitions` options."""
        parsed = self._split(url)
        options = dict(parsed.query)
        table = str(options.pop("table", DEFAULT_TABLE))
        partitions = str(options.pop("partitions", DEFAULT_PARTITIONS))
        if not _TABLE_NAME.fullmatch(table):
            raise ConfigurationError(
                f"{self._redacted}: table must be a plain identifier of at most 54 characters"
            )
        if not partitions.isdigit() or not 1 <= int(partitions) <= 1024:
            raise ConfigurationError(f"{self._redacted}: partitions must be between 1 and 1024")
        options = {"connect_timeout": str(CONNECT_TIMEOUT_SECONDS), **KEEPALIVES, **options}
        sa_url = parsed.set(drivername="postgresql+psycopg", query=options)
        return sa_url, table, int(partitions)

    def _split(self, url: str) -> URL:
        """SQLAlchemy's reading of `url`, once it is known to agree with redaction's."""
        try:
            parsed = make_url(url)
            problem = _problem(parsed, url)
        except (ArgumentError, ValueError):
            problem = "its host or port cannot be read (a port is 1 to 65535, an IPv6 host "
            problem += "goes in brackets)"
        if problem:
            raise ConfigurationError(
                f"malformed PostgreSQL URL {self._redacted!r}: {problem}; write it as "
                "postgresql://user:password@host:port/database"
            ) from None
        return parsed

    def _create_schema(self, create: bool) -> None:
        """Create the table and its partitions once, even if many processes start together;
        without `create`, `LakeNotFound` where the table is not there, and no DDL is run.

        Table and partitions are made in one transaction under an advisory lock named after
        the table, so a store sees either nothing (and creates it, or reports no lake) or
        everything.
        """
        try:
            with self._lock, self._engine.begin() as conn:
                if inspect(conn).has_table(self.table):
                    return
                if not create:
                    raise LakeNotFound(self._redacted, f"table {self.table!r} does not exist")
                conn.execute(select(func.pg_advisory_xact_lock(_lock_id(self.table))))
                table = kv_table(
                    self.table, MetaData(), postgresql_partition_by="HASH (partition_key)"
                )
                table.create(conn, checkfirst=True)
                for ddl in _partition_ddl(self._engine, self.table, self.partitions):
                    conn.exec_driver_sql(ddl)
        except DBAPIError as exc:
            raise self._failure(exc) from exc

    def _set_guarded(
        self, partition: bytes, key: bytes, value: bytes, guard: tuple[bytes, bytes]
    ) -> bytes:
        """One statement: the guard row is read `FOR KEY SHARE` and the row written from
        it, so a fence of the guard waits until the write is committed (and a fence
        committed first is the value read). Run again after a lost session, as a `set` is."""
        params = (*guard, self._lock_key(*guard), partition, key, value)
        row = self._fetch(self._route(guard[0]).fair.set_guarded, params, fetch_one)
        if row is None:
            raise key_not_found(*guard)
        return bytes(row[0])

    def _delete_guarded(
        self, partition: bytes, key: bytes, guard: tuple[bytes, bytes], expected: bytes
    ) -> bool:
        """One statement, as `_set_guarded`: the guard row is read `FOR KEY SHARE` and the
        row removed only if the guard holds `expected`, so a fence of the guard waits until
        the removal is committed, and a fence committed first is the value read (nothing
        is removed). Run again after a lost session: removing twice is removing once."""
        locked, target = self._route(guard[0]).fair.guard, self._route(partition).table
        params = (*guard, self._lock_key(*guard), partition, key, expected)
        row = self._fetch(_guarded_delete(self._quote, locked, target), params, fetch_one)
        return row is not None and bytes(row[0]) == expected

    def _guarded_create(
        self,
        partition: bytes,
        key: bytes,
        value: bytes,
        guard: tuple[bytes, bytes],
        expected: bytes,
    ) -> tuple[str, tuple[Any, ...]]:
        """The guard row read `FOR KEY SHARE` after its advisory-lock queue, as `_set_guarded`
        reads it, and the row created from it only if it holds `expected`: a fence of the
        guard waits until the creation is committed, and a fence committed first is the
        value read (nothing is written)."""
        locked, target = self._route(guard[0]).fair.guard, self._route(partition).table
        sql = _guarded_create(self._quote, locked, target)
        return sql, (*guard, self._lock_key(*guard), partition, key, value, expected)

    def _statements(self, partition: bytes) -> Statements:
        return self._route(partition).sql

    def _route(self, partition: bytes) -> _Route:
        """The statements for a partition key's rows, reading and writing the partition
        that holds them, which the server names once per key (`ROUTED_KEYS`).

        A prepared (generic) plan of a statement on the partitioned table locks every
        partition and its index before pruning them (PostgreSQL 15 does): past the
        session's sixteen fast-path lock slots, each goes through the shared lock table,
        which made a read cost the server far more than it costs on the partition. A table
        not partitioned by hash as this store makes it keeps its whole-table statements."""
        try:
            return self._routes[partition]
        except KeyError:
            pass
        layout = self._layout()
        if not layout:
            return self._remember(partition, None)
        params = (len(layout), self._quote(self.table), len(layout), partition)
        (remainder,) = self._fetch(_REMAINDER_OF, params, fetch_one)
        return self._remember(partition, layout[int(remainder)])

    def _layout(self) -> tuple[str, ...]:
        """The table's hash partitions by remainder, read from the catalog once; none for a
        table not partitioned as this store makes it (one modulus, every remainder). Asking
        the server only for a new key's remainder, once per staging token, costs it far less
        than matching the key against each partition's bound in the catalog."""
        if self._partitions is None:
            rows = self._fetch(_HASH_PARTITIONS, (self._quote(self.table),), fetch_all)
            bounds = {(int(m), int(r)): bytes(name).decode() for m, r, name in rows}
            count = len(bounds)
            layout = tuple(bounds.get((count, r), "") for r in range(count))
            self._partitions = layout if all(layout) else ()
        return self._partitions

    def _remember(self, partition: bytes, table: str | None) -> _Route:
        route = self._whole
        if table is not None:
            route = self._by_partition.get(table) or self._by_partition.setdefault(
                table,
                _Route(
                    statements(table, self._quote, "%s"),
                    _fair_statements(self.table, self._quote, table),
                    table,
                ),
            )
        with self._lock:
            if len(self._routes) >= ROUTED_KEYS:
                del self._routes[next(iter(self._routes))]
            self._routes[partition] = route
        return route

    def _swap(self, partition: bytes, key: bytes, value: bytes, expected: bytes) -> None:
        """The fence: locks the row `FOR UPDATE` (after its place in the advisory lock's
        queue) before it swaps, so it waits for the guarded writes under way."""
        lock = self._lock_key(partition, key)
        params = (partition, key, lock, value, partition, key, expected)
        self._swap_by(self._route(partition).fair.swap, params, partition, key)

    def _swap_unfenced(self, partition: bytes, key: bytes, value: bytes, expected: bytes) -> None:
        """A plain `UPDATE`: its row lock (`FOR NO KEY UPDATE`) does not conflict with the
        guarded writes' `FOR KEY SHARE`, so neither waits for the other."""
        super()._swap(partition, key, value, expected)

    def _lock_key(self, partition: bytes, key: bytes) -> int:
        """The advisory lock a key's swaps and the writes it guards queue on (see
        `_fair_statements`)."""
        name = b"\0".join((self.table.encode(), partition, key))
        return int.from_bytes(hashlib.blake2b(name, digest_size=8).digest(), "big", signed=True)

    def _open_cursor(self, dbapi: Any) -> Cursor:
        dbapi.autocommit = True
        return _PreparedCursor(dbapi.pgconn)

    def _is_broken(self, dbapi: Any) -> bool:
        return bool(dbapi.closed or dbapi.broken)

    def _is_live(self, dbapi: Any) -> bool:
        """Not lost, and nothing to read: an idle session hears from the server unasked only
        when it is being closed (a terminated backend's FATAL message, a restart's EOF)."""
        if dbapi.closed or dbapi.broken:
            return False
        try:
            poll = sockets.poll()
            poll.register(dbapi.pgconn.socket, sockets.POLLIN)
            return not poll.poll(0)
        except (OSError, psycopg.Error):
            return False

    def _unknown_outcome(self, exc: Exception) -> BranchwaterError:
        reason = self._failure(exc)
        return OutcomeUnknown(
            f"{reason}; the session was lost while a conditional write was under way, so it "
            f"{UNKNOWN_OUTCOME}"
        )

    def _disown(self, dbapi: Any) -> None:
        """Point the inherited socket at /dev/null: a later close, even one at interpreter
        exit, then says goodbye to nobody instead of ending the parent's session."""
        with contextlib.suppress(Exception):
            devnull = os.open(os.devnull, os.O_RDWR)
            try:
                os.dup2(devnull, dbapi.pgconn.socket)
            finally:
                os.close(devnull)

    def _failure(self, exc: Exception) -> BranchwaterError:
        if isinstance(exc, BranchwaterError):
            return exc
        reason = str(getattr(exc, "orig", None) or exc).strip().splitlines()[0]
        reason = scrub(reason, self._secrets)
        return Unavailable(f"PostgreSQL at {self._redacted} is unavailable: {reason}")


_DONE = (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK)
_SQLSTATE = pq.DiagnosticField.SQLSTATE
_NO_SUCH_STATEMENT = b"26000"
"""A session whose prepared statements were dropped (`DEALLOCATE ALL`, `DISCARD ALL`, a
pooler that hands out another server session): this one's are prepared again, once."""


class _Statement(NamedTuple):
    """A statement prepared on one session: its name, each parameter's format (1: binary
    bytes, 0: text), and whether all are binary (the parameters then go as they are)."""

    name: bytes
    formats: list[int]
    binary: bool


class _PreparedCursor:
    """The hot statements straight on libpq: each prepared once per session under a name of
    its own, then run with binary parameters and results.

    psycopg's cursor spends as much client CPU per statement as libpq and the round trip
    together (query conversion, its prepared-statement cache, adapters, row building, its
    wait loop): with many writers on a few cores that CPU is the throughput. The session is
    in autocommit and runs one statement at a time (`_Connection`), so nothing psycopg
    tracks goes stale. Failures are psycopg's own exceptions, so the store's handling of
    lost sessions is unchanged; a lost session leaves `pgconn` BAD, hence `broken`. The
    call blocks in libpq, as psycopg's wait loop blocks in `select`, but without the GIL
    held; a Ctrl-C lands when the statement returns.
    """

    __slots__ = ("_names", "_pgconn", "_prepared", "_result", "rowcount")

    def __init__(self, pgconn: Any) -> None:
        self._pgconn = pgconn
        self._prepared: dict[str, _Statement] = {}
        self._names = itertools.count()
        self._result: Any = None
        self.rowcount = -1

    def execute(self, sql: str, params: Sequence[Any], /) -> _PreparedCursor:
        try:
            statement = self._prepared[sql]
        except KeyError:
            statement = self._prepare(sql, params)
        result = self._run(statement, params)
        if result.status not in _DONE and result.error_field(_SQLSTATE) == _NO_SUCH_STATEMENT:
            self._prepared.clear()
            result = self._run(self._prepare(sql, params), params)
        if result.status not in _DONE:
            raise error_from_result(result, encoding=self._pgconn._encoding)
        self._result = result
        self.rowcount = result.command_tuples or 0
        return self

    def _run(self, statement: _Statement, params: Sequence[Any]) -> Any:
        name, formats, binary = statement
        if binary:
            return self._pgconn.exec_prepared(name, params, formats, 1)
        values = [v if f else str(v).encode() for v, f in zip(params, formats, strict=True)]
        return self._pgconn.exec_prepared(name, values, formats, 1)

    def _prepare(self, sql: str, params: Sequence[Any]) -> _Statement:
        """Prepare `sql` on this session; integers (limits) go as text, the server's type
        for them being whatever it inferred, bytes as bytea in binary."""
        name = f"bw_{next(self._names)}".encode()
        numbered = iter(range(1, len(params) + 1))
        text = re.sub("%s", lambda _: f"${next(numbered)}", sql)
        result = self._pgconn.prepare(name, text.encode(), None)
        if result.status != pq.ExecStatus.COMMAND_OK:
            raise error_from_result(result, encoding=self._pgconn._encoding)
        formats = [int(isinstance(v, bytes)) for v in params]
        statement = self._prepared[sql] = _Statement(name, formats, all(formats))
        return statement

    def fetchone(self) -> Any:
        result = self._result
        if not result.ntuples:
            return None
        if result.nfields == 1:
            return (result.get_value(0, 0),)
        return tuple(result.get_value(0, c) for c in range(result.nfields))

    def fetchall(self) -> list[Any]:
        result = self._result
        get = result.get_value
        if result.nfields == 2:
            return [(get(r, 0), get(r, 1)) for r in range(result.ntuples)]
        return [tuple(get(r, c) for c in range(result.nfields)) for r in range(result.ntuples)]


class _FairStatements(NamedTuple):
    swap: str
    set_guarded: str
    guard: str
    """The guard row's locking read of `set_guarded`, for the guarded delete and creation to
    share."""


class _Route(NamedTuple):
    """The statements for the keys of one partition of the table (or the whole table's)."""

    sql: Statements
    fair: _FairStatements
    table: str
    """The table they address, unquoted."""


def _fair_statements(table: str, quote: Callable[[str], str], source: str) -> _FairStatements:
    """A fencing swap and `set_guarded` that queue on an advisory lock of the key first
    (exclusive for the fence, shared for the guarded write), then lock its row, read from
    the partition `source` (the guard's, for the write; it writes its row to `table`).

    The advisory lock orders a fence after the writes under way and a write after a fence
    under way, and it is granted in order: a share lock of a row is granted at once beside
    other share holders whatever waits, so a stream of writes to one branch could otherwise
    hold off its commit's seal for as long as the writes kept coming, while a write that
    comes after a waiting fence waits behind it. Each takes the advisory lock in the filter
    of its row's scan, before the row is locked, so the two never wait on each other in
    opposite orders.

    The row locks make what a write returns right. It locks the guard row `FOR KEY SHARE`,
    which only `FOR UPDATE` conflicts with; the fence takes `FOR UPDATE` before it swaps, so
    a write that waited for it locks and returns the version it committed (a `KEY SHARE`
    lock of a row that only a `NO KEY UPDATE` changed is granted on the version the write
    read: it would return the value the fence replaced). A plain `UPDATE`, an unfenced
    swap, takes no advisory lock and locks `FOR NO KEY UPDATE`, so it and the writes pass
    each other. The guarded write's row is selected from the locked guard row, so the guard
    is locked before the write and a missing guard writes nothing.
    """
    t, p, k, v = quote(table), quote("partition_key"), quote("key"), quote("value")
    part = quote(source)
    where = f"{p} = %s AND {k} = %s"

    def locking(lock: str, mode: str) -> str:
        return f"SELECT {v} FROM {part} WHERE {where} AND {lock}(%s) IS NOT NULL FOR {mode}"

    guard = locking("pg_advisory_xact_lock_shared", "KEY SHARE")
    return _FairStatements(
        swap=(
            f"WITH fence AS ({locking('pg_advisory_xact_lock', 'UPDATE')}) "
            f"UPDATE {part} SET {v} = %s WHERE {where} AND {v} = %s "
            "AND EXISTS (SELECT FROM fence)"
        ),
        set_guarded=(
            f"WITH guard AS ({guard}), "
            f"written AS (INSERT INTO {t} ({p}, {k}, {v}) "
            "SELECT CAST(%s AS BYTEA), CAST(%s AS BYTEA), CAST(%s AS BYTEA) FROM guard "
            f"ON CONFLICT ({p}, {k}) DO UPDATE SET {v} = excluded.{v}) "
            f"SELECT {v} FROM guard"
        ),
        guard=guard,
    )


def _guarded_delete(quote: Callable[[str], str], guard: str, target: str) -> str:
    """`_delete_guarded`'s statement: the guard locked as `set_guarded` locks it, the row
    removed from `target` (its partition) if the guard holds the value expected, and the
    guard's value returned."""
    p, k, v = quote("partition_key"), quote("key"), quote("value")
    return (
        f"WITH guard AS ({guard}), "
        f"gone AS (DELETE FROM {quote(target)} WHERE {p} = %s AND {k} = %s "
        f"AND EXISTS (SELECT FROM guard WHERE {v} = CAST(%s AS BYTEA))) "
        f"SELECT {v} FROM guard"
    )


def _guarded_create(quote: Callable[[str], str], guard: str, target: str) -> str:
    """`PostgresStore._guarded_create`'s statement: the guard locked as `set_guarded` locks
    it, the row written to `target` (its partition) where it is absent or empty, if the
    guard holds the value expected."""
    t, p, k, v = quote(target), quote("partition_key"), quote("key"), quote("value")
    return (
        f"WITH guard AS ({guard}) "
        f"INSERT INTO {t} ({p}, {k}, {v}) "
        "SELECT CAST(%s AS BYTEA), CAST(%s AS BYTEA), CAST(%s AS BYTEA) FROM guard "
        f"WHERE {v} = CAST(%s AS BYTEA) "
        f"ON CONFLICT ({p}, {k}) DO UPDATE SET {v} = excluded.{v} WHERE length({t}.{v}) = 0"
    )


_HASH_PARTITIONS = (
    "SELECT bound.mr[1], bound.mr[2], CAST(c.relname AS TEXT) FROM pg_inherits i "
    "JOIN pg_class c ON c.oid = i.inhrelid "
    "CROSS JOIN LATERAL regexp_match(pg_get_expr(c.relpartbound, c.oid), "
    "'^FOR VALUES WITH \\(modulus (\\d+), remainder (\\d+)\\)$') AS bound(mr) "
    "WHERE i.inhparent = CAST(%s AS REGCLASS)"
)
"""Modulus, remainder and name of each hash partition of the table named (quoted)."""

_REMAINDER_OF = (
    "SELECT CAST(r AS TEXT) FROM generate_series(0, %s - 1) AS r "
    "WHERE satisfies_hash_partition(CAST(%s AS REGCLASS), %s, r, CAST(%s AS BYTEA))"
)
"""The remainder of a partition key's hash (the server's) under the table's modulus."""


def _problem(parsed: URL, url: str) -> str | None:
    """What is wrong with a URL SQLAlchemy could split, if anything. An unencoded `@` or `/`
    in the user or password makes it split elsewhere than redaction does, and the driver
    would then be handed a piece of the password as host or database (and echo it)."""
    host = parsed.host or ""
    if parsed.password != url_password(url) or any(c in host for c in "@/?#"):
        return (
            "percent-encode '@', ':', '/', '?' and '#' in the user name and password, and "
            "'@' anywhere else (%40, %3A, %2F, %3F, %23)"
        )
    if parsed.port is not None and not 1 <= parsed.port <= 65535:
        return f"port {parsed.port} is not between 1 and 65535"
    return None


def _lock_id(table: str) -> int:
    """A stable signed 64-bit advisory-lock key, so every process picks the same lock."""
    digest = hashlib.blake2b(f"branchwater-kv:{table}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big", signed=True)


def _partition_ddl(engine: Engine, table: str, partitions: int) -> list[str]:
    """`PARTITION OF` statements; SQLAlchemy declares partitioned tables but not partitions."""
    quote = engine.dialect.identifier_preparer.quote
    return [
        f"CREATE TABLE IF NOT EXISTS {quote(f'{table}_p{i}')} PARTITION OF {quote(table)} "
        f"FOR VALUES WITH (MODULUS {partitions}, REMAINDER {i})"
        for i in range(partitions)
    ]
