"""What the SQLite and PostgreSQL drivers share: the table, the statements, the connections.

SQLModel/SQLAlchemy own the schema and the connecting; the hot paths run precompiled SQL
strings straight on a pooled DBAPI cursor, because a metadata operation is a single
statement and any per-call ORM or Core work would cost more than the statement itself.

Connections are pooled per store, not kept per thread: each statement takes an idle one
and gives it back. pyarrow and DuckDB call Python (a `branchwater://` filesystem) from
native threads with a thread state made and torn down around every call; anything a
`threading.local` held would be released inside that teardown, where closing a connection
crashes the interpreter. A pooled connection is only ever closed by ordinary code: `close`,
a lost session replaced, or a return to a pool that holds `MAX_IDLE` already.

A server that goes away (restarted, or its sessions terminated) leaves the idle connections
dead with it. The first statement to meet a lost session closes every idle connection too,
so the next calls connect afresh instead of failing once per dead connection, and:

- a statement that may run twice (a read, a scan, an unconditional `set` or `delete`, a
  drop chunk) is run again once, on a new connection;
- a conditional write (`set_if`, `delete_if`) is never run twice. Before sending one, the
  driver checks its connection is still alive (`_is_live`: for PostgreSQL, the socket has
  nothing unsolicited to read, which is how a terminated or restarted backend's goodbye
  arrives), so a session lost while idle costs a new connection, not an error. A session
  lost while the statement was under way is ambiguous: the server may have applied it and
  lost only the reply. Running it again would then report a false `PredicateFailed` (the
  key already holds our value) or, after another writer moved the key on and back, apply
  it twice; reading the key back cannot tell those apart either. So it raises
  `OutcomeUnknown` saying the write may have been applied (`store.UNKNOWN_OUTCOME`), and the
  caller, who knows what the value means, reads the key before deciding (graveler
  operations re-read the branch on their next call and finish or redo what is left). Only
  a read that shows the write settles it: across a network partition the server never
  hears the client go and runs the statement on, so it may land after the error, and a
  caller must never undo on a read that does not show it.

A fork lands between statements, never inside one. SQLite keeps lock state for the whole
process: a child forked while a thread of its parent held the write lock inherits that
state but not the thread, so to the child the lock stays held by a connection that will
never finish, and each of its writes waits out the busy timeout and fails. Each connection
has a lock its statement holds (uncontended: one statement uses a connection at a time);
before a fork, the process takes every store's lock (held while connecting and closing)
and every connection's, and the child forgets them with the connections.
"""

from __future__ import annotations

import abc
import contextlib
import itertools
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple, Protocol, TypeVar

from sqlalchemy import Engine, MetaData, Table
from sqlmodel import Field, SQLModel

from branchwater.engine.errors import BranchwaterError, PredicateFailed, lake_closed
from branchwater.engine.kv.store import KeyValue, Store, check_partition, key_not_found
from branchwater.engine.urls import redact_url

DEFAULT_TABLE = "branchwater_kv"
CHUNKS_PER_HOUSEKEEPING = 16
BUSY_TIMEOUT_SECONDS = 30.0
BUSY_FIRST_DELAY = 0.0001
BUSY_MAX_DELAY = 0.002
MAX_IDLE = 32
"""Idle connections a store keeps after a burst of threads; more are closed as they return."""

T = TypeVar("T")


class KVEntry(SQLModel, table=True):
    """One stored pair; bytes columns compare byte-wise in both SQLite and PostgreSQL."""

    __tablename__ = DEFAULT_TABLE

    partition_key: bytes = Field(primary_key=True)
    key: bytes = Field(primary_key=True)
    value: bytes


def kv_table(name: str, metadata: MetaData, **dialect_kwargs: Any) -> Table:
    """The `KVEntry` table under another name, so one database can hold several stores."""
    table = KVEntry.__table__.to_metadata(metadata, name=name)  # type: ignore[attr-defined]
    for option, value in dialect_kwargs.items():
        table.dialect_kwargs[option] = value
    return table


class Statements(NamedTuple):
    get: str
    set: str
    create: str
    replace: str
    swap: str
    delete: str
    delete_if: str
    delete_guarded: str
    create_guarded: str
    scan_from: str
    scan_after: str
    drop_chunk: str


def statements(table: str, quote: Callable[[str], str], mark: str) -> Statements:
    """The statements every operation needs, for a dialect's quoting and placeholder.

    Conditional writes are single statements judged by their row count, so they are atomic
    without an explicit transaction: `ON CONFLICT DO NOTHING` creates only if absent, and an
    `UPDATE` whose `WHERE` names the expected value swaps only if nobody changed it.
    """
    t, p, k, v = quote(table), quote("partition_key"), quote("key"), quote("value")
    where = f"{p} = {mark} AND {k} = {mark}"
    insert = f"INSERT INTO {t} ({p}, {k}, {v}) VALUES ({mark}, {mark}, {mark}) ON CONFLICT"
    scan = f"SELECT {k}, {v} FROM {t} WHERE {p} = {mark} AND {k} {{}} {mark} ORDER BY {k}"
    return Statements(
        get=f"SELECT {v} FROM {t} WHERE {where}",
        set=f"{insert} ({p}, {k}) DO UPDATE SET {v} = excluded.{v}",
        create=f"{insert} DO NOTHING",
        replace=f"UPDATE {t} SET {v} = {mark} WHERE {where}",
        swap=f"UPDATE {t} SET {v} = {mark} WHERE {where} AND {v} = {mark}",
        delete=f"DELETE FROM {t} WHERE {where}",
        delete_if=f"DELETE FROM {t} WHERE {where} AND {v} = {mark}",
        delete_guarded=(
            f"DELETE FROM {t} WHERE {where} AND EXISTS "
            f"(SELECT 1 FROM {t} WHERE {where} AND {v} = {mark})"
        ),
        create_guarded=(
            f"INSERT INTO {t} ({p}, {k}, {v}) SELECT {mark}, {mark}, {mark} WHERE EXISTS "
            f"(SELECT 1 FROM {t} WHERE {where} AND {v} = {mark}) "
            f"ON CONFLICT ({p}, {k}) DO UPDATE SET {v} = excluded.{v} WHERE length({t}.{v}) = 0"
        ),
        scan_from=f"{scan.format('>=')} LIMIT {mark}",
        scan_after=f"{scan.format('>')} LIMIT {mark}",
        drop_chunk=(
            f"DELETE FROM {t} WHERE {p} = {mark} AND {k} IN "
            f"(SELECT {k} FROM {t} WHERE {p} = {mark} ORDER BY {k} LIMIT {mark})"
        ),
    )


class Cursor(Protocol):
    """The slice of a DB-API cursor the hot paths use (sqlite3 and psycopg both fit)."""

    rowcount: int

    def execute(self, sql: str, params: Sequence[Any], /) -> Cursor: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class _Connection:
    """A pooled DBAPI connection and its reusable cursor, used by one statement at a time.

    The finalizer closes it when it is dropped (at `close`, or with its store); `usable`
    says it has not been closed.
    """

    __slots__ = ("__weakref__", "cursor", "dbapi", "finalizer", "lock", "pooled", "usable")

    def __init__(self, pooled: Any, cursor: Cursor) -> None:
        self.pooled = pooled
        self.dbapi = pooled.driver_connection
        self.cursor = cursor
        self.lock = threading.Lock()
        """Held by the statement using the connection, and by a fork (module docstring)."""
        self.finalizer = weakref.finalize(self, _close_quietly, pooled, self.lock)
        self.usable = True

    def close(self) -> None:
        self.usable = False
        self.finalizer()

    def discard(self) -> None:
        """Close a connection whose session is, or may be, lost: invalidated, so nothing
        (no rollback on return) is sent to a server that is gone."""
        self.usable = False
        if self.finalizer.detach() is not None:
            with self.lock, contextlib.suppress(Exception):
                self.pooled.invalidate()


def _close_quietly(pooled: Any, lock: threading.Lock) -> None:
    """Closing is best effort: the server may already be gone, and there is no one to tell."""
    with lock, contextlib.suppress(Exception):
        pooled.close()


_KEY_VALUE = itertools.repeat(KeyValue)
"""Endless `KeyValue` type arguments for `map(tuple.__new__, …)`, shared by every scan."""


class SQLStore(Store):
    """A `Store` over one SQL table, with a connection per thread and per process."""

    _errors: tuple[type[Exception], ...] = ()
    drop_chunk: int = 64
    """Rows each statement of `drop_partition` deletes: few, so each holds SQLite's write
    lock briefly (a driver whose statements lock only their rows sets more)."""

    def __init__(self, url: str, engine: Engine, sql: Statements) -> None:
        self.url = redact_url(url)
        """The store's URL with any password masked: it ends up in logs and reprs."""
        self._engine = engine
        self._sql = sql
        self._idle: list[_Connection] = []
        self._connections: weakref.WeakSet[_Connection] = weakref.WeakSet()
        self._lock = threading.Lock()
        """Held while connecting, while taking the connections to close, and by a fork."""
        self._closed = False
        """Set by `close`: the one place connections are made refuses to make another."""
        self._held_for_fork: list[_Connection] = []
        _LIVE_STORES.add(self)

    @abc.abstractmethod
    def _failure(self, exc: Exception) -> BranchwaterError:
        """The typed error to raise for a driver exception."""

    def _statements(self, partition: bytes) -> Statements:
        """The statements for one partition's keys (a driver may address where it lives)."""
        return self._sql

    @abc.abstractmethod
    def _open_cursor(self, dbapi: Any) -> Cursor:
        """Configure a new DBAPI connection and return its cursor."""

    def _is_broken(self, dbapi: Any) -> bool:
        """Whether a failed connection must be replaced (a lost PostgreSQL session)."""
        return False

    def _is_live(self, dbapi: Any) -> bool:
        """Whether an idle connection can take a statement that must not run twice (drivers
        with a network session override this)."""
        return True

    def _unknown_outcome(self, exc: Exception) -> BranchwaterError:
        """The error of a conditional write whose session was lost under way."""
        return self._failure(exc)

    def _disown(self, dbapi: Any) -> None:
        """In a forked child, make sure closing an inherited connection cannot reach the
        parent's session (drivers with a network session override this)."""

    def _take(self) -> _Connection:
        """An idle connection (list pops are atomic), else a new one."""
        try:
            return self._idle.pop()
        except IndexError:
            return self._connect()

    def _give(self, conn: _Connection) -> None:
        if not conn.usable:
            return
        if len(self._idle) < MAX_IDLE:
            self._idle.append(conn)
        else:
            conn.close()

    def _connect(self) -> _Connection:
        with self._lock:
            if self._closed:
                raise lake_closed()
            try:
                pooled = self._engine.raw_connection()
                conn = _Connection(pooled, self._open_cursor(pooled.driver_connection))
            except Exception as exc:
                raise self._failure(exc) from exc
            self._connections.add(conn)
        return conn

    def _drop_if_broken(self, conn: _Connection, exc: Exception) -> None:
        """Close a lost connection, and every idle one with it, so a retry gets a fresh one;
        any other failure is the statement's own and raises its typed error.

        Only a lost connection is worth retrying, and only for statements that may run
        twice: a conditional write whose reply was lost may have been applied already. A
        connection `close` took from under a statement is the store closing, not failing.
        """
        if self._closed:
            raise lake_closed() from exc
        if not self._is_broken(conn.dbapi):
            raise self._failure(exc) from exc
        conn.discard()
        self._drop_idle()

    def _drop_idle(self) -> None:
        """Close the idle connections: one session lost means the server restarted or cut
        its sessions, and the others went with it (a live one costs only a reconnect)."""
        idle = self._idle
        while idle:
            with contextlib.suppress(IndexError):
                idle.pop().discard()

    def _alive(self, conn: _Connection) -> _Connection:
        """`conn` if it can take a conditional write, else a new connection."""
        if self._is_live(conn.dbapi):
            return conn
        conn.discard()
        self._drop_idle()
        return self._connect()

    def _once(self, sql: str, params: Sequence[Any], fetch: Callable[[Cursor], T]) -> T:
        """The statement again, after a lost session, on a new connection; its failure final."""
        conn = self._connect()
        try:
            with conn.lock:
                return fetch(conn.cursor.execute(sql, params))
        except self._errors as exc:
            with contextlib.suppress(BranchwaterError):
                self._drop_if_broken(conn, exc)
            raise self._failure(exc) from exc
        finally:
            self._give(conn)

    def _is_busy(self, exc: Exception) -> bool:
        """Whether the database refused a statement only because of lock contention (another
        writer holds the lock): it then applied nothing, so running it again is always safe."""
        return False

    def _fetch(self, sql: str, params: Sequence[Any], fetch: Callable[[Cursor], T]) -> T:
        """The hot path: `_take` and `_give` inlined (an idle connection popped and given back),
        and the connection's lock taken without a `with`, which would cost a few times more."""
        idle = self._idle
        try:
            conn = idle.pop()
        except IndexError:
            conn = self._connect()
        try:
            conn.lock.acquire()
            try:
                return fetch(conn.cursor.execute(sql, params))
            finally:
                conn.lock.release()
        except self._errors as exc:
            if self._is_busy(exc):
                return self._when_free(conn, sql, params, fetch)
            self._drop_if_broken(conn, exc)
        finally:
            if conn.usable and len(idle) < MAX_IDLE:
                idle.append(conn)
            else:
                self._give(conn)
        return self._once(sql, params, fetch)

    def _write(self, sql: str, params: Sequence[Any], idempotent: bool) -> int:
        idle = self._idle
        try:
            conn = idle.pop()
        except IndexError:
            conn = self._connect()
        if not idempotent:
            conn = self._alive(conn)
        try:
            conn.lock.acquire()
            try:
                return conn.cursor.execute(sql, params).rowcount
            finally:
                conn.lock.release()
        except self._errors as exc:
            if self._is_busy(exc):
                return self._when_free(conn, sql, params, _rowcount)
            self._drop_if_broken(conn, exc)
            if not idempotent:
                raise self._unknown_outcome(exc) from exc
        finally:
            if conn.usable and len(idle) < MAX_IDLE:
                idle.append(conn)
            else:
                self._give(conn)
        return self._once(sql, params, _rowcount)

    def _when_free(
        self, conn: _Connection, sql: str, params: Sequence[Any], fetch: Callable[[Cursor], T]
    ) -> T:
        """Run a statement refused as busy again, backing off from a tenth of a millisecond.

        SQLite's own busy handler sleeps 1, 2, 5, 10 ms and more between tries, so a writer
        queued behind a short lock holder (a background drop's chunk) would wait far longer
        than the lock is held; these short sleeps take the lock soon after it is free.
        """
        deadline = time.monotonic() + BUSY_TIMEOUT_SECONDS
        delay = BUSY_FIRST_DELAY
        while True:
            time.sleep(delay)
            try:
                with conn.lock:
                    return fetch(conn.cursor.execute(sql, params))
            except self._errors as exc:
                if not self._is_busy(exc) or time.monotonic() >= deadline:
                    raise self._failure(exc) from exc
            delay = min(delay * 2, BUSY_MAX_DELAY)

    def _get(self, partition: bytes, key: bytes) -> bytes:
        row = self._fetch(self._statements(partition).get, (partition, key), fetch_one)
        if row is None:
            raise key_not_found(partition, key)
        return row[0]

    def _set(self, partition: bytes, key: bytes, value: bytes) -> None:
        self._write(self._statements(partition).set, (partition, key, value), idempotent=True)

    def _create(self, partition: bytes, key: bytes, value: bytes) -> None:
        sql = self._statements(partition).create
        if not self._write(sql, (partition, key, value), idempotent=False):
            raise PredicateFailed(f"key {key!r} already exists in partition {partition!r}")

    def _replace(self, partition: bytes, key: bytes, value: bytes) -> None:
        sql = self._statements(partition).replace
        if not self._write(sql, (value, partition, key), idempotent=False):
            raise PredicateFailed(f"key {key!r} does not exist in partition {partition!r}")

    def _swap(self, partition: bytes, key: bytes, value: bytes, expected: bytes) -> None:
        sql = self._statements(partition).swap
        self._swap_by(sql, (value, partition, key, expected), partition, key)

    def _swap_by(self, sql: str, params: tuple[Any, ...], partition: bytes, key: bytes) -> None:
        """Run a swap statement (a driver may have more than one), `PredicateFailed` if it
        changed no row."""
        if not self._write(sql, params, idempotent=False):
            raise PredicateFailed(f"key {key!r} in partition {partition!r} changed since read")

    def _delete(self, partition: bytes, key: bytes) -> None:
        self._write(self._statements(partition).delete, (partition, key), idempotent=True)

    def _delete_if(self, partition: bytes, key: bytes, expected: bytes) -> None:
        sql = self._statements(partition).delete_if
        if not self._write(sql, (partition, key, expected), idempotent=False):
            raise PredicateFailed(f"key {key!r} in partition {partition!r} changed since read")

    def _delete_guarded(
        self, partition: bytes, key: bytes, guard: tuple[bytes, bytes], expected: bytes
    ) -> bool:
        """One statement, atomic as SQLite runs it (PostgreSQL overrides it). No row
        removed means the guard failed or the key was absent: the guard, read again, says
        which (a guard changed since only turns an absent key into a refusal)."""
        sql = self._statements(partition).delete_guarded
        if self._write(sql, (partition, key, *guard, expected), idempotent=False):
            return True
        return self._guard_holds(guard, expected)

    def _create_guarded(
        self,
        partition: bytes,
        key: bytes,
        value: bytes,
        guard: tuple[bytes, bytes],
        expected: bytes,
    ) -> bool:
        """One statement (`_guarded_create`), judged by its row count: none written means
        the guard failed or the key holds a value, and the guard, read again, says which (a
        guard changed since only turns a taken key into a refusal)."""
        sql, params = self._guarded_create(partition, key, value, guard, expected)
        if self._write(sql, params, idempotent=False):
            return True
        return self._refused_creation(guard, expected)

    def _guarded_create(
        self,
        partition: bytes,
        key: bytes,
        value: bytes,
        guard: tuple[bytes, bytes],
        expected: bytes,
    ) -> tuple[str, tuple[Any, ...]]:
        """`_create_guarded`'s statement and its parameters: atomic as SQLite runs it
        (PostgreSQL locks the guard as `set_guarded` does)."""
        sql = self._statements(partition).create_guarded
        return sql, (partition, key, value, *guard, expected)

    def drop_partition(self, partition: bytes, *, pause: float = 0.0) -> None:
        """Delete in chunks: one statement per chunk keeps each write lock short, and the
        `pause` between chunks lets writers to other partitions (a branch's new staging
        token) take the lock instead of queueing behind the whole drop."""
        check_partition(partition)
        chunk = self.drop_chunk
        params = (partition, partition, chunk)
        sql = self._statements(partition).drop_chunk
        chunks = 0
        while self._write(sql, params, idempotent=True) >= chunk:
            chunks += 1
            if chunks % CHUNKS_PER_HOUSEKEEPING == 0:
                self._after_bulk_chunk()
            time.sleep(pause)
        self._after_bulk_chunk()

    def _after_bulk_chunk(self) -> None:
        """Housekeeping a bulk writer should pay for itself rather than leave to others."""

    def _scan_batch(
        self, partition: bytes, start: bytes, inclusive: bool, limit: int
    ) -> list[tuple[bytes, bytes]]:
        statements = self._statements(partition)
        sql = statements.scan_from if inclusive else statements.scan_after
        return self._fetch(sql, (partition, start, limit), fetch_all)

    def _batched_scan(self, partition: bytes, start: bytes, batch_size: int) -> Iterator[KeyValue]:
        """The base loop, but rows become `KeyValue`s in C, never in per-row Python.

        A scan row costs SQLite little; a Python-level generator step and `KeyValue(...)`
        call per row would add a large share of that again.
        """
        batches = self._raw_batches(partition, start, batch_size)
        return itertools.chain.from_iterable(map(_key_values, batches))

    def close(self) -> None:
        """Close every connection, for good: a statement still under way on another thread
        ends, and the next one gets `LakeClosed` rather than a new connection."""
        with self._lock:
            self._closed = True
            connections, self._connections = list(self._connections), weakref.WeakSet()
        self._idle = []
        for conn in connections:
            conn.close()
        self._idle = []
        self._engine.dispose()

    def _hold_for_fork(self) -> None:
        """Wait for the statements under way, and start no new one, until the fork is done."""
        self._lock.acquire()
        self._held_for_fork = list(self._connections)
        for conn in self._held_for_fork:
            conn.lock.acquire()

    def _release_after_fork(self) -> None:
        for conn in self._held_for_fork:
            conn.lock.release()
        self._held_for_fork = []
        self._lock.release()

    def _forget_connections(self) -> None:
        """In a forked child: never touch the parent's connections, not even to close them.

        Closing would end the parent's PostgreSQL session, so the inherited objects are
        detached from their finalizers, disowned and kept alive for the child's lifetime.
        """
        for conn in list(self._connections):
            conn.finalizer.detach()
            conn.usable = False
            self._disown(conn.dbapi)
            _INHERITED.append(conn)
        self._connections = weakref.WeakSet()
        self._idle = []
        self._lock = threading.Lock()
        self._held_for_fork = []
        self._engine.dispose(close=False)


def _key_values(batch: list[tuple[bytes, bytes]]) -> Iterator[KeyValue]:
    return map(tuple.__new__, _KEY_VALUE, batch)


def fetch_one(cursor: Cursor) -> Any:
    return cursor.fetchone()


def fetch_all(cursor: Cursor) -> list[Any]:
    return cursor.fetchall()


def _rowcount(cursor: Cursor) -> int:
    return cursor.rowcount


_LIVE_STORES: weakref.WeakSet[SQLStore] = weakref.WeakSet()
_INHERITED: list[_Connection] = []
_HELD_FOR_FORK: dict[int, list[SQLStore]] = {}
"""The stores each forking thread holds: exactly these are released after its fork (a store
opened by another thread meanwhile was never held; a second thread forking at once holds
them only after the first released them)."""


def _before_fork() -> None:
    held = _HELD_FOR_FORK[threading.get_ident()] = []
    for store in list(_LIVE_STORES):
        store._hold_for_fork()
        held.append(store)


def _after_fork_in_parent() -> None:
    for store in reversed(_HELD_FOR_FORK.pop(threading.get_ident(), [])):
        store._release_after_fork()


def _after_fork_in_child() -> None:
    _HELD_FOR_FORK.clear()
    for store in list(_LIVE_STORES):
        store._forget_connections()


os.register_at_fork(
    before=_before_fork,
    after_in_parent=_after_fork_in_parent,
    after_in_child=_after_fork_in_child,
)
