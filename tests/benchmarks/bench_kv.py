"""KV driver overhead: our SQLite/PostgreSQL drivers against the bare DBAPI driver.

Both sides run the very same SQL strings (PostgreSQL's on the keys' partitions), on the
same keys of the same table, through the same DBAPI connection (a second cursor on the
store's own sqlite3/psycopg connection), so the ratio is exactly the cost our layer adds:
argument checks, the per-thread connection lookup, error mapping and result wrapping.
Separate connections were tried first; on a shared machine one PostgreSQL backend process
can be scheduled markedly worse than another for a whole run, which buried the small cost
being measured.

The embedded run (`make bench`) measures both drivers; on the stack (`BACKEND=stack`) the
default is the PostgreSQL driver alone, on a database of the run's own (`backends`).
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from branchwater.engine.kv import Store, open_store
from branchwater.engine.kv.sql import SQLStore, Statements
from tests.benchmarks.backends import EMBEDDED, postgres_database, selected
from tests.benchmarks.declarations import Benchmark, Suite

BENCHMARKS = Suite(
    section="Engine",
    benchmarks=tuple(
        Benchmark(
            f"kv-{driver}-{op}",
            measures=f"{what} through the {label} driver",
            reference=f"the same statements through `{dbapi}` on the same connection",
            target=1.3,
        )
        for driver, label, dbapi in (
            ("sqlite", "SQLite", "sqlite3"),
            ("postgres", "PostgreSQL", "psycopg"),
        )
        for op, what in (
            ("get", "a get per key"),
            ("set", "a set per key"),
            ("set_if", "a conditional set per key"),
            ("scan", "a scan of every key, a batch at a time"),
        )
    ),
)

POINT, SCAN = b"point", b"scan"
VALUE, OTHER_VALUE = b"v" * 64, b"w" * 64
CHUNK = 50
Op = Callable[[], None]


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="bench_kv", description=__doc__)
    parser.add_argument(
        "--drivers",
        default="sqlite,postgres" if selected() == EMBEDDED else "postgres",
        help="comma-separated",
    )
    parser.add_argument("--sqlite-ops", type=int, default=20_000, help="point ops per timing")
    parser.add_argument("--postgres-ops", type=int, default=2_000, help="point ops per timing")
    parser.add_argument("--scan-keys", type=int, default=10_000, help="keys in the scan")
    parser.add_argument("--batch-size", type=int, default=1_000, help="scan batch size")
    parser.add_argument("--repeats", type=int, default=7, help="timings per op (median)")
    parser.add_argument(
        "--sqlite-synchronous",
        default="normal",
        help="PRAGMA synchronous; 'full' (the driver default) makes every write fsync-bound",
    )
    return parser.parse_args(argv)


def timed_ns(op: Op) -> int:
    started = time.perf_counter_ns()
    op()
    return time.perf_counter_ns() - started


def compare(name: str, ours: list[Op], raw: list[Op], per_op: int, repeats: int) -> None:
    """Median per-operation cost of each side, timed in alternating small chunks.

    Alternating chunks of a few dozen operations exposes both sides to the same background
    load, and the median over repetitions drops those a burst spoiled. Which side goes
    first is random, not alternating, so periodic costs (SQLite's WAL checkpoint every
    thousand pages) cannot line up with one side. The first round warms caches and lets
    PostgreSQL prepare the statements (psycopg does so on a statement's fifth use).
    """
    ours_us: list[float] = []
    raw_us: list[float] = []
    coin = random.Random(len(name))
    gc.collect()
    gc.disable()
    try:
        for repeat in range(repeats + 1):
            mine = theirs = 0
            for our_chunk, raw_chunk in zip(ours, raw, strict=True):
                if coin.random() < 0.5:
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
        f"ours_us={mine_us:.2f} raw_us={theirs_us:.2f} backend={selected()}",
        flush=True,
    )


def our_ops(store: Store, keys: list[bytes], values: list[bytes]) -> dict[str, Op]:
    """Point operations through our driver; set_if swaps `values` (shared with raw) in turn."""

    def get() -> None:
        for key in keys:
            store.get(POINT, key)

    def set_() -> None:
        for key in keys:
            store.set(POINT, key, VALUE)

    def set_if() -> None:
        old, new = values
        for key in keys:
            store.set_if(POINT, key, new, old)
        values.reverse()

    return {"get": get, "set": set_, "set_if": set_if}


def raw_ops(cursor: Any, sql: Statements, keys: list[bytes], values: list[bytes]) -> dict[str, Op]:
    """The same statements on the same keys, issued straight on a DBAPI cursor."""

    def get() -> None:
        for key in keys:
            cursor.execute(sql.get, (POINT, key)).fetchone()[0]

    def set_() -> None:
        for key in keys:
            cursor.execute(sql.set, (POINT, key, VALUE))

    def set_if() -> None:
        old, new = values
        for key in keys:
            if cursor.execute(sql.swap, (new, POINT, key, old)).rowcount != 1:
                raise AssertionError("raw compare-and-swap lost its row")
        values.reverse()

    return {"get": get, "set": set_, "set_if": set_if}


def our_scan(store: Store, batch_size: int) -> Op:
    def scan() -> None:
        for _pair in store.scan(SCAN, batch_size=batch_size):
            pass

    return scan


def raw_scan(cursor: Any, sql: Statements, batch_size: int) -> Op:
    def scan() -> None:
        rows = cursor.execute(sql.scan_from, (SCAN, b"", batch_size)).fetchall()
        while True:
            for _key, _value in rows:
                pass
            if len(rows) < batch_size:
                return
            after = rows[-1][0]
            rows = cursor.execute(sql.scan_after, (SCAN, after, batch_size)).fetchall()

    return scan


def fill(store: Store, ops: int, scan_keys: int) -> list[bytes]:
    keys = [b"key-%08d" % i for i in range(max(ops, scan_keys))]
    for key in keys[:ops]:
        store.set(POINT, key, VALUE)
    for key in keys[:scan_keys]:
        store.set(SCAN, key, VALUE)
    return keys[:ops]


def run(driver: str, store: SQLStore, ops: int, args: argparse.Namespace) -> None:
    keys = fill(store, ops, args.scan_keys)
    sql, scan_sql = store._statements(POINT), store._statements(SCAN)
    cursor = store._idle[-1].dbapi.cursor()
    mine, theirs = [], []
    for start in range(0, len(keys), CHUNK):
        chunk, values = keys[start : start + CHUNK], [VALUE, OTHER_VALUE]
        mine.append(our_ops(store, chunk, values))
        theirs.append(raw_ops(cursor, sql, chunk, values))
    for op in ("get", "set", "set_if"):
        ours_chunks, raw_chunks = [m[op] for m in mine], [t[op] for t in theirs]
        compare(f"{driver}-{op}", ours_chunks, raw_chunks, len(keys), args.repeats)
    scans = args.repeats * 3
    compare(
        f"{driver}-scan",
        [our_scan(store, args.batch_size)] * scans,
        [raw_scan(cursor, scan_sql, args.batch_size)] * scans,
        scans,
        args.repeats,
    )


def bench_sqlite(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="bench-kv-") as directory:
        url = f"sqlite:///{Path(directory) / 'kv.db'}?synchronous={args.sqlite_synchronous}"
        with open_store(url) as store:
            assert isinstance(store, SQLStore)
            run("sqlite", store, args.sqlite_ops, args)


def bench_postgres(args: argparse.Namespace) -> None:
    with postgres_database() as url, open_store(url) as store:
        assert isinstance(store, SQLStore)
        run("postgres", store, args.postgres_ops, args)


def main(argv: list[str]) -> None:
    args = parse_args(argv)
    benches = {"sqlite": bench_sqlite, "postgres": bench_postgres}
    for driver in args.drivers.split(","):
        benches[driver](args)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
