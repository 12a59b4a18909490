"""Forcing interleavings with locks another session holds: on the PostgreSQL server a row,
whose wait a statement is observed in (`pg_blocking_pids`), not left to timing; on a SQLite
file its write lock, held by another process until the test lets go."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg

LOCK_WAIT_SECONDS = 30.0
GENERIC_PLANS = "options=-c%20plan_cache_mode%3Dforce_generic_plan"
"""libpq's options (a URL query) for a session whose prepared statements are planned once
for every parameter, as PostgreSQL chooses to for a statement run often enough: a plan for
the parameters would prune a partitioned table's partitions before locking them."""


def waiting(
    conn: psycopg.Connection, statement: str, besides: tuple[int, ...] = ()
) -> tuple[int, list[int]]:
    """The session of `conn`'s database running `statement` (a prefix of it), other than
    those `besides`, once it waits on a lock: its pid and the pids blocking it. Only that
    database's: another test worker forces the same waits in a database of its own."""
    deadline = time.monotonic() + LOCK_WAIT_SECONDS
    with psycopg.connect(conn.info.dsn, autocommit=True) as watcher:
        while time.monotonic() < deadline:
            row = watcher.execute(
                "SELECT pid, pg_blocking_pids(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND wait_event_type = 'Lock' "
                "AND query LIKE %s AND NOT pid = ANY(%s)",
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


def partitions_locked(conn: psycopg.Connection, pid: int, table: str) -> list[str]:
    """The partitions of `table` that the session `pid` holds a lock on."""
    rows = conn.execute(
        "SELECT DISTINCT CAST(CAST(relation AS REGCLASS) AS TEXT) FROM pg_locks "
        "WHERE pid = %s AND locktype = 'relation' AND CAST(relation AS REGCLASS) IN "
        "(SELECT relid FROM pg_partition_tree(%s) WHERE isleaf)",
        (pid, table),
    ).fetchall()
    return sorted(row[0] for row in rows)


SQLITE_HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("BEGIN IMMEDIATE")
conn.execute("INSERT OR REPLACE INTO branchwater_kv VALUES (x'70', x'686f6c646572', x'31')")
print("held", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
"""
"""Take the write lock of the SQLite file named by the first argument, with a write under
way, until a line (or the end) comes on stdin."""


class SQLiteWriteLock:
    """Another process holding a SQLite file's write lock until `let_go` (from any thread,
    once)."""

    def __init__(self, path: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", SQLITE_HOLDER, str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.released = threading.Event()
        self._lock = threading.Lock()

    def let_go(self) -> None:
        with self._lock:
            if not self.released.is_set():
                self.released.set()
                assert self.process.stdin is not None
                self.process.stdin.write("\n")
                self.process.stdin.close()


@contextmanager
def sqlite_write_lock_held(path: Path) -> Iterator[SQLiteWriteLock]:
    """The lock held once the block starts, let go (if the block did not) when it ends."""
    holder = SQLiteWriteLock(path)
    try:
        assert holder.process.stdout is not None
        assert holder.process.stdout.readline().strip() == "held"
        yield holder
    finally:
        holder.let_go()
        assert holder.process.wait(30) == 0
