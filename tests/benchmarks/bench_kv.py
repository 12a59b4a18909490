"""KV driver overhead: our SQLite/PostgreSQL drivers against the bare DBAPI driver.

Both sides run the very same SQL strings on the same database in the same process, with
the same connection settings, so the ratio is the cost our layer adds (argument checks,
per-thread connection lookup, error mapping, result wrapping). Each repetition times ours
then raw back to back; the reported figure is the median over repetitions.
"""

from __future__ import annotations

import argparse
import gc
import sqlite3
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from branchwater.engine.kv import Store, open_store
from branchwater.engine.kv.sql import SQLStore, Statements
from tests.conftest import PG_HOST, PG_PORT, PG_USER, unique_name

OURS, RAW, SCAN = b"ours", b"raw", b"scan-"
VALUE, OTHER_VALUE = b"v" * 64, b"w" * 64
CHUNK = 50
Op = Callable[[], None]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench_kv", description=__doc__)
    parser.add_argument("--drivers", default="sqlite,postgres", help="comma-separated")
    parser.add_argument("--sqlite-ops", type=int, default=20_000, help="point ops per timing")
    parser.add_argument("--postgres-ops", type=int, default=2_000, help="point ops per timing")
    parser.add_argument("--scan-keys", type=int, default=10_000, help="keys in the scan")
    parser.add_argument("--batch-size", type=int, default=1_000, help="scan batch size")
    parser.add_argument("--repeats", type=int, default=7, help="timings per op (median)")
    parser.add_argument(
        "--sqlite-synchronous",
        default="normal",
        help="PRAGMA synchronous for both sides; 'full' makes writes fsync-bound",
    )
    return parser.parse_args(argv)


def timed_ns(op: Op) -> int:
    started = time.perf_counter_ns()
    op()
    return time.perf_counter_ns() - started


def compare(name: str, ours: list[Op], raw: list[Op], per_op: int, repeats: int) -> None:
    """Median per-operation cost of each side, timed in alternating small chunks.

    The machine is shared and noisy; alternating chunks of a few dozen operations (and
    which side goes first) exposes both sides to the same load, and the median over
    repetitions drops the repetitions a burst spoiled. The first round warms caches and
    lets PostgreSQL prepare the statements (it does so on a statement's fifth use).
    """
    ours_us: list[float] = []
    raw_us: list[float] = []
    gc.collect()
    gc.disable()
    try:
        for repeat in range(repeats + 1):
            mine = theirs = 0
            for index, (our_chunk, raw_chunk) in enumerate(zip(ours, raw, strict=True)):
                if (index + repeat) % 2:
                    theirs += timed_ns(raw_chunk)
                    mine += timed_ns(our_chunk)
                else:
                    mine += timed_ns(our_chunk)
                    theirs += timed_ns(raw_chunk)
            if repeat:
                ours_us.append(mine / 1000 / per_op)
                raw_us.append(theirs / 1000 / per_op)
    finally:
        gc.enable()
    mine_us, theirs_us = statistics.median(ours_us), statistics.median(raw_us)
    print(
        f"BENCH kv-{name} ratio={mine_us / theirs_us:.2f} "
        f"ours_us={mine_us:.2f} raw_us={theirs_us:.2f}",
        flush=True,
    )


def our_ops(store: Store, keys: list[bytes]) -> dict[str, Op]:
    """Point operations through our driver on `keys`; each call of set_if flips the value."""
    state = [VALUE, OTHER_VALUE]

    def get() -> None:
        for key in keys:
            store.get(OURS, key)

    def set_() -> None:
        for key in keys:
            store.set(OURS, key, VALUE)

    def set_if() -> None:
        old, new = state
        for key in keys:
            store.set_if(OURS, key, new, old)
        state.reverse()

    return {"get": get, "set": set_, "set_if": set_if}


def raw_ops(cursor: Any, sql: Statements, keys: list[bytes]) -> dict[str, Op]:
    """The same statements issued straight on a DBAPI cursor."""
    state = [VALUE, OTHER_VALUE]

    def get() -> None:
        for key in keys:
            cursor.execute(sql.get, (RAW, key)).fetchone()[0]

    def set_() -> None:
        for key in keys:
            cursor.execute(sql.set, (RAW, key, VALUE))

    def set_if() -> None:
        old, new = state
        for key in keys:
            if cursor.execute(sql.swap, (new, RAW, key, old)).rowcount != 1:
                raise AssertionError("raw compare-and-swap lost its row")
        state.reverse()

    return {"get": get, "set": set_, "set_if": set_if}


def our_scan(store: Store, batch_size: int) -> Op:
    def scan() -> None:
        for _pair in store.scan(SCAN + OURS, batch_size=batch_size):
            pass

    return scan


def raw_scan(cursor: Any, sql: Statements, batch_size: int) -> Op:
    def scan() -> None:
        rows = cursor.execute(sql.scan_from, (SCAN + RAW, b"", batch_size)).fetchall()
        while True:
            for _key, _value in rows:
                pass
            if len(rows) < batch_size:
                return
            after = rows[-1][0]
            rows = cursor.execute(sql.scan_after, (SCAN + RAW, after, batch_size)).fetchall()

    return scan


def fill(store: Store, ops: int, scan_keys: int) -> list[bytes]:
    keys = [b"key-%08d" % i for i in range(max(ops, scan_keys))]
    for key in keys[:ops]:
        store.set(OURS, key, VALUE)
        store.set(RAW, key, VALUE)
    for key in keys[:scan_keys]:
        store.set(SCAN + OURS, key, VALUE)
        store.set(SCAN + RAW, key, VALUE)
    return keys[:ops]


def run(driver: str, store: SQLStore, cursor: Any, ops: int, args: argparse.Namespace) -> None:
    keys = fill(store, ops, args.scan_keys)
    chunks = [keys[i : i + CHUNK] for i in range(0, len(keys), CHUNK)]
    mine = [our_ops(store, chunk) for chunk in chunks]
    theirs = [raw_ops(cursor, store._sql, chunk) for chunk in chunks]
    for op in ("get", "set", "set_if"):
        ours_chunks, raw_chunks = [m[op] for m in mine], [t[op] for t in theirs]
        compare(f"{driver}-{op}", ours_chunks, raw_chunks, len(keys), args.repeats)
    scans = args.repeats * 3
    compare(
        f"{driver}-scan",
        [our_scan(store, args.batch_size)] * scans,
        [raw_scan(cursor, store._sql, args.batch_size)] * scans,
        scans,
        args.repeats,
    )


def bench_sqlite(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-kv-") as directory:
        path = Path(directory) / "kv.db"
        store = open_store(f"sqlite:///{path}?synchronous={args.sqlite_synchronous}")
        assert isinstance(store, SQLStore)
        raw = sqlite3.connect(path, timeout=30, isolation_level=None)
        raw.execute("PRAGMA journal_mode = WAL")
        raw.execute(f"PRAGMA synchronous = {args.sqlite_synchronous}")
        try:
            run("sqlite", store, raw.cursor(), args.sqlite_ops, args)
        finally:
            raw.close()
            store.close()


@contextmanager
def fresh_postgres_database() -> Iterator[str]:
    import psycopg

    admin = f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/postgres"
    name = unique_name("bw_bench_")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/{name}"
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def bench_postgres(args: argparse.Namespace) -> None:
    import psycopg

    with fresh_postgres_database() as url:
        store = open_store(url)
        assert isinstance(store, SQLStore)
        raw = psycopg.connect(url, autocommit=True)
        try:
            run("postgres", store, raw.cursor(), args.postgres_ops, args)
        finally:
            raw.close()
            store.close()


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    benches = {"sqlite": bench_sqlite, "postgres": bench_postgres}
    for driver in args.drivers.split(","):
        benches[driver](args)
