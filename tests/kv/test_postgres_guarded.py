"""`set_guarded` on PostgreSQL is one statement that reads the guard `FOR SHARE`: the
interleavings a staged write's single round trip rests on, forced with row locks held by
another session and observed in `pg_blocking_pids`, not left to timing.

- A swap of the guard (a commit sealing the branch's token) that comes while a guarded
  write is under way waits for the write to be committed, so the committer, which reads
  the sealed token after its swap, sees the row.
- A guarded write that comes while a swap is under way waits for it and returns the
  swapped value, so the writer learns its token was sealed and writes again.
- A guarded write that comes while a swap waits for earlier ones waits behind it, so a
  stream of writes cannot hold a commit's seal off.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import psycopg
import pytest

from branchwater.engine.kv import open_store
from branchwater.engine.kv.postgres import PostgresStore
from tests.helpers.servers import unique_name

pytestmark = pytest.mark.postgres

GUARD = (b"refs", b"branch")
ROW = (b"token-1", b"path")
LOCK_WAIT_SECONDS = 30.0


@pytest.fixture
def store(postgres_url: str) -> Iterator[PostgresStore]:
    with open_store(f"{postgres_url}?table={unique_name('kv_')}") as opened:
        assert isinstance(opened, PostgresStore)
        opened.set(*GUARD, b"token-1")
        yield opened


@pytest.fixture
def other(postgres_url: str) -> Iterator[psycopg.Connection]:
    """Another session, holding row locks in a transaction of its own."""
    with psycopg.connect(postgres_url) as conn:
        yield conn


def waiting(
    conn: psycopg.Connection, statement: str, besides: tuple[int, ...] = ()
) -> tuple[int, list[int]]:
    """The session running `statement` (a prefix of it), other than those `besides`, once it
    waits on a lock: its pid and the pids blocking it."""
    deadline = time.monotonic() + LOCK_WAIT_SECONDS
    with psycopg.connect(conn.info.dsn, autocommit=True) as watcher:
        while time.monotonic() < deadline:
            row = watcher.execute(
                "SELECT pid, pg_blocking_pids(pid) FROM pg_stat_activity "
                "WHERE wait_event_type = 'Lock' AND query LIKE %s AND NOT pid = ANY(%s)",
                (statement + "%", list(besides)),
            ).fetchone()
            if row is not None:
                return row[0], list(row[1])
            time.sleep(0.01)
    raise AssertionError(f"no session started waiting on a lock in {statement!r}")


@contextmanager
def row_locked(other: psycopg.Connection, table: str, row: tuple[bytes, bytes]) -> Iterator[None]:
    """`row` locked `FOR UPDATE` by the other session until the block ends, so a statement
    that writes it waits there, holding whatever it locked before."""
    with other.transaction():
        other.execute(
            f'SELECT 1 FROM "{table}" WHERE partition_key = %s AND key = %s FOR UPDATE', row
        )
        yield


def test_a_swap_of_the_guard_waits_for_the_guarded_write_under_way(
    store: PostgresStore, other: psycopg.Connection
) -> None:
    store.set(*ROW, b"older")
    with ThreadPoolExecutor(2) as pool:
        with row_locked(other, store.table, ROW):
            write = pool.submit(store.set_guarded, *ROW, b"written", GUARD)
            writer, blockers = waiting(other, "WITH guard")
            assert blockers == [other.info.backend_pid]
            swap = pool.submit(store.set_if, *GUARD, b"token-2", b"token-1")
            assert waiting(other, "UPDATE")[1] == [writer]
            assert not write.done() and not swap.done()
        assert write.result(LOCK_WAIT_SECONDS) == b"token-1"
        swap.result(LOCK_WAIT_SECONDS)
    assert store.get(*GUARD).value == b"token-2"
    assert store.get(*ROW).value == b"written"


def test_a_guarded_write_that_meets_a_swap_under_way_returns_the_swapped_value(
    store: PostgresStore, other: psycopg.Connection
) -> None:
    table = store.table
    with ThreadPoolExecutor(1) as pool:
        with other.transaction():
            other.execute(
                f'UPDATE "{table}" SET value = %s WHERE partition_key = %s AND key = %s',
                (b"token-2", *GUARD),
            )
            write = pool.submit(store.set_guarded, *ROW, b"written", GUARD)
            assert waiting(other, "WITH guard")[1] == [other.info.backend_pid]
            assert not write.done()
        assert write.result(LOCK_WAIT_SECONDS) == b"token-2"
    assert store.get(*ROW).value == b"written"


def test_a_guarded_write_does_not_overtake_a_swap_waiting_for_earlier_ones(
    store: PostgresStore, other: psycopg.Connection
) -> None:
    store.set(*ROW, b"older")
    later = (b"token-1", b"later")
    with ThreadPoolExecutor(3) as pool:
        with row_locked(other, store.table, ROW):
            first = pool.submit(store.set_guarded, *ROW, b"written", GUARD)
            writer, _ = waiting(other, "WITH guard")
            swap = pool.submit(store.set_if, *GUARD, b"token-2", b"token-1")
            swapper, _ = waiting(other, "UPDATE")
            second = pool.submit(store.set_guarded, *later, b"later", GUARD)
            assert waiting(other, "WITH guard", besides=(writer,))[1] == [swapper]
            assert not (first.done() or swap.done() or second.done())
        assert first.result(LOCK_WAIT_SECONDS) == b"token-1"
        swap.result(LOCK_WAIT_SECONDS)
        assert second.result(LOCK_WAIT_SECONDS) == b"token-2"
    assert store.get(*later).value == b"later"
