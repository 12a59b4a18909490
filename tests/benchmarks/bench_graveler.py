"""Graveler benchmarks, issue 3's protocol, on the selected back end (`backends`).

- `commit`: commit N staged entries vs two floors measured in the same run. The physical
  floor (`ratio`): the database driver's raw scan of the staged rows into Arrow columns,
  values split vectorised, one Parquet write (to a file, or one PUT to S3). The decoding
  floor (`decode_ratio`): the KV scan with each staged row decoded in Python, then one
  Parquet write; it flatters the commit, since decoding a row in Python is most of what both
  cost.
- `long-commit-multiple-staging`: p50/p99 of single-object writes from another process while
  an N-entry commit runs, vs the same writes with no commit running.
- `list`: first page (1,000 entries) of a branch with N committed and M staged entries, vs the
  floor of reading 1,000 entries of one range and scanning 1,000 staged keys.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import tempfile
import time
from datetime import datetime, timezone
from itertools import islice
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

from branchwater.engine.api import Lake
from branchwater.engine.graveler.graveler import Graveler
from branchwater.engine.graveler.model import Entry, decode_entry, encode_entry
from tests.benchmarks.backends import Backend, open_backend
from tests.benchmarks.declarations import Benchmark, Suite

BENCHMARKS = Suite(
    section="Engine",
    benchmarks=(
        Benchmark(
            "commit",
            measures="a commit of 1M staged entries",
            reference="the physical floor: the driver's raw scan (sqlite3, psycopg) of the "
            "staged rows into Arrow, split vectorised, one Parquet write (one PUT on S3) "
            "(`decode_ratio`: against the floor that decodes each row in Python)",
            target=1.5,
        ),
        Benchmark(
            "long-commit-multiple-staging",
            measures="p99 of another process's single-object writes while a 1M-entry commit runs",
            reference="the same writes with no commit running",
            target=3,
        ),
        Benchmark(
            "list",
            measures="the first 1,000 entries of 1M committed and 10k staged, range cache off",
            reference="reading 1,000 rows of one range and scanning 1,000 staged keys",
        ),
    ),
)

MTIME = datetime(2026, 11, 1, tzinfo=timezone.utc)


def entry(i: int) -> Entry:
    return Entry(
        f"tables/t{i % 97:02d}/part-{i:08d}.parquet",
        f"data/s/{i:032x}",
        1024 + i % 7,
        f"{i:032x}",
        MTIME,
    )


def bulk_stage(backend: Backend, token: str, count: int, offset: int = 0) -> None:
    """Fill a staging token straight through the driver: the benchmark is the commit, not
    this."""
    backend.stage_rows(
        (token.encode(), e.path.encode(), encode_entry(e))
        for e in (entry(i) for i in range(offset, offset + count))
    )
    backend.checkpoint()


def new_lake(backend: Backend) -> Lake:
    """A lake with repository `bench` on namespace `ns`."""
    lake = backend.connect(range_cache_dir=backend.root / "range-cache")
    lake.create_repository("bench", storage_namespace=backend.namespace("ns"))
    return lake


def staging_token(lake: Lake) -> str:
    repo = lake.repository("bench")
    return lake.graveler.read_branch(repo.record, "main").staging_token


def physical_floor_seconds(backend: Backend, token: str) -> float:
    """Raw rows from the driver into Arrow, NUL-split in Arrow, one zstd Parquet write."""
    start = time.perf_counter()
    rows = backend.scan_rows(token.encode())
    paths = pa.array([row[0] for row in rows], pa.binary()).cast(pa.string())
    values = pa.array([row[1] for row in rows], pa.binary()).cast(pa.string())
    fields = pc.split_pattern(values, "\x00")
    part = [pc.list_element(fields, i) for i in range(5)]
    table = pa.table(
        {
            "path": paths,
            "address": part[0],
            "size": part[1].cast(pa.int64()),
            "checksum": part[2],
            "mtime": part[3].cast(pa.int64()).cast(pa.timestamp("us", tz="UTC")),
            "metadata": part[4],
        }
    )
    backend.write_parquet("physical.parquet", table, compression="zstd")
    return time.perf_counter() - start


def floor_seconds(backend: Backend, lake: Lake, token: str) -> float:
    start = time.perf_counter()
    columns: dict[str, list] = {
        k: [] for k in ("path", "address", "size", "checksum", "mtime", "metadata")
    }
    for key, value in lake.graveler.kv.scan(token.encode(), batch_size=1000):
        e = decode_entry(key.decode(), value)
        columns["path"].append(e.path)
        columns["address"].append(e.address)
        columns["size"].append(e.size)
        columns["checksum"].append(e.checksum)
        columns["mtime"].append(e.mtime)
        columns["metadata"].append("")
    backend.write_parquet("floor.parquet", pa.table(columns))
    return time.perf_counter() - start


def bench_commit(entries: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, open_backend(Path(tmp)) as backend:
        lake = new_lake(backend)
        token = staging_token(lake)
        bulk_stage(backend, token, entries)
        physical = physical_floor_seconds(backend, token)
        floor = floor_seconds(backend, lake, token)
        start = time.perf_counter()
        lake.repository("bench").branch("main").commit("bench")
        ours = time.perf_counter() - start
        lake.close()
    print(
        f"BENCH commit ratio={ours / physical:.2f} commit_s={ours:.2f} "
        f"physical_floor_s={physical:.2f} decode_ratio={ours / floor:.2f} "
        f"decode_floor_s={floor:.2f} entries={entries} {backend.label}",
        flush=True,
    )


def _timed_upload(main, path: str) -> float:
    started = time.perf_counter()
    main.upload(path, b"x")
    return time.perf_counter() - started


def _writer(backend: Backend, quiet_count: int, ready, done) -> tuple[list[float], list[tuple]]:
    """Warm up, time `quiet_count` writes with nothing else running, then time writes (with
    their start time) until the commit and its background cleanup are done."""
    with backend.connect() as lake:
        main = lake.repository("bench").branch("main")
        for i in range(200):
            _timed_upload(main, f"warm/{i:06d}")
        quiet = [_timed_upload(main, f"quiet/{i:06d}") for i in range(quiet_count)]
        ready.set()
        loaded: list[tuple[float, float]] = []
        while not done.is_set():
            loaded.append((time.time(), _timed_upload(main, f"live/{len(loaded):07d}")))
        return quiet, loaded


def _percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def bench_long_commit(entries: int, writes: int) -> None:
    """Writes are timed in two windows: while the commit call runs (the target), and while
    the committed staging token is dropped in the background afterwards."""
    ctx = mp.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp, open_backend(Path(tmp)) as backend:
        lake = new_lake(backend)
        bulk_stage(backend, staging_token(lake), entries)
        with ctx.Manager() as manager, ctx.Pool(1) as pool:
            ready, done = manager.Event(), manager.Event()
            writer = pool.apply_async(_writer, (backend, writes, ready, done))
            ready.wait(600)
            started = time.time()
            lake.repository("bench").branch("main").commit("long")
            committed = time.time()
            lake.graveler.wait_for_background()
            cleaned = time.time()
            done.set()
            quiet, loaded = writer.get(600)
        lake.close()
    q50, q99 = _percentiles(quiet)
    c50, c99 = _percentiles([d for t, d in loaded if started <= t < committed])
    _, d99 = _percentiles([d for t, d in loaded if committed <= t] or [0.0])
    print(
        f"BENCH long-commit-multiple-staging ratio={c99 / q99:.2f} p50_ms={c50 * 1e3:.2f} "
        f"p99_ms={c99 * 1e3:.2f} quiet_p50_ms={q50 * 1e3:.2f} quiet_p99_ms={q99 * 1e3:.2f} "
        f"commit_s={committed - started:.1f} cleanup_ratio={d99 / q99:.2f} "
        f"cleanup_p99_ms={d99 * 1e3:.2f} cleanup_s={cleaned - committed:.1f} "
        f"writes={len(loaded)} entries={entries} {backend.label}",
        flush=True,
    )


class _CountingKV:
    """Counts calls into the KV store the lake uses."""

    def __init__(self, inner) -> None:
        self.inner, self.calls = inner, 0

    def __getattr__(self, name: str):
        attr = getattr(self.inner, name)
        if not callable(attr):
            return attr

        def counted(*args, **kwargs):
            self.calls += 1
            return attr(*args, **kwargs)

        return counted


def bench_list(committed: int, staged: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, open_backend(Path(tmp)) as backend:
        lake = new_lake(backend)
        bulk_stage(backend, staging_token(lake), committed)
        lake.repository("bench").branch("main").commit("base")
        bulk_stage(backend, staging_token(lake), staged, offset=committed // 2)
        lake.graveler.wait_for_background()
        counting = _CountingKV(lake.graveler.kv)
        options = backend.s3_options or None
        fresh = Lake(Graveler(counting, object_store_options=options))  # type: ignore[arg-type]
        main = fresh.repository("bench").branch("main")
        t0 = time.perf_counter()
        page = list(islice(main.list(), 1000))
        ours = time.perf_counter() - t0
        calls = counting.calls
        range_key = backend.keys("ns/_branchwater/ranges")[0]
        token = staging_token(fresh)
        t0 = time.perf_counter()
        backend.read_parquet(range_key).slice(0, 1000).to_pylist()
        list(islice(counting.inner.scan(token.encode(), batch_size=1000), 1000))
        floor = time.perf_counter() - t0
        lake.close()
    assert len(page) == 1000
    print(
        f"BENCH list ratio={ours / floor:.2f} first_page_ms={ours * 1e3:.1f} "
        f"floor_ms={floor * 1e3:.1f} kv_calls={calls} committed={committed} staged={staged} "
        f"{backend.label}",
        flush=True,
    )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench_graveler")
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--writes", type=int, default=2000)
    parser.add_argument("--staged", type=int, default=10_000)
    args, _ = parser.parse_known_args(argv)
    bench_commit(args.entries)
    bench_long_commit(args.entries, args.writes)
    bench_list(args.entries, args.staged)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
