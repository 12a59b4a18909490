"""Forcing interleavings on the PostgreSQL server with row locks: another session holds a
row, and a statement's wait on it is observed in `pg_blocking_pids`, not left to timing."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

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
