"""`fsspec-read`: pandas reading a Parquet dataset at a commit id through `branchwater://`
against the floor, pyarrow reading the same physical files (the entries' addresses in the
namespace) into a pandas frame with its own file system: the local disk, or its S3 client on
the stack's server (`backends`).

The candidate pays for what the filesystem adds: resolving the commit, listing the folder,
one entry lookup per file and the verified file object over each physical file. The files
lie in one folder (no partition columns), so both sides build the same frame.

Most of the difference is not ours: pyarrow reads any fsspec file system through Python file
objects (`PyFileSystem(FSSpecHandler(...))`), each read under the GIL, where its own file
systems read natively from its threads. fsspec's own local file system under that wrapper,
with nothing of ours, already reads the same files slower than the floor; the verification's
SHA-256 of every byte, the lookups and the listing add comparatively little to that.
"""

from __future__ import annotations

import argparse
import io
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from branchwater.engine import BranchwaterFileSystem, Lake
from tests.benchmarks.backends import open_backend
from tests.benchmarks.declarations import Benchmark, Suite

Read = Callable[[], pd.DataFrame]

BENCHMARKS = Suite(
    section="Readers",
    benchmarks=(
        Benchmark(
            "fsspec-read",
            measures="pandas reading a 200-file Parquet dataset at a commit id through "
            "`branchwater://`",
            reference="pyarrow reading the same physical files into a pandas frame",
            target=1.15,
        ),
    ),
)


def write_dataset(lake: Lake, files: int, rows: int) -> tuple[str, list[str]]:
    """`files` Parquet files under `tables/orders/` committed on main: the commit id and the
    physical paths of the files."""
    repo = lake.repository("bench")
    main = repo.branch("main")
    for n in range(files):
        table = pa.table(
            {
                "id": pa.array(range(n * rows, (n + 1) * rows), pa.int64()),
                "amount": pa.array([float(i % 997) for i in range(rows)]),
                "customer": pa.array([f"c{i % 5003:05d}" for i in range(rows)]),
            }
        )
        buffer = io.BytesIO()
        pq.write_table(table, buffer)
        main.upload(f"tables/orders/part-{n:04d}.parquet", buffer.getvalue())
    commit = main.commit("orders").id
    root = repo.storage_namespace.removeprefix("file://")
    physical = [f"{root}/{entry.address}" for entry in repo.ref(commit).list("tables/orders/")]
    return commit, physical


def best_of(repeats: int, ours: Read, floor: Read) -> tuple[float, float, int, int]:
    """The best time of each side over `repeats` alternating rounds (the machine's load
    hits both alike), and the rows each returned."""
    times: dict[Read, float] = {ours: float("inf"), floor: float("inf")}
    rows: dict[Read, int] = {}
    for _ in range(repeats):
        for read in (ours, floor):
            t0 = time.perf_counter()
            rows[read] = len(read())
            times[read] = min(times[read], time.perf_counter() - t0)
    return times[ours], times[floor], rows[ours], rows[floor]


def bench_read(files: int, rows: int, repeats: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, open_backend(Path(tmp)) as backend:
        os.environ["BRANCHWATER_CACHE_DIR"] = f"{tmp}/cache"
        with backend.connect() as lake:
            lake.create_repository("bench", backend.namespace("ns"))
            commit, physical = write_dataset(lake, files, rows)
        options = {"kv_url": backend.kv_url, "s3_options": backend.s3_options or None}
        path = f"branchwater://bench/{commit}/tables/orders/"
        filesystem, _ = backend.arrow_filesystem()
        files_read = [p.removeprefix("s3://") for p in physical]

        def ours() -> pd.DataFrame:
            return pd.read_parquet(path, storage_options=options)

        def floor() -> pd.DataFrame:
            dataset = ds.dataset(files_read, format="parquet", filesystem=filesystem)
            return dataset.to_table().to_pandas()

        candidate, reference, got, expected = best_of(repeats, ours, floor)
        BranchwaterFileSystem.clear_instance_cache()
    assert got == expected == files * rows
    print(
        f"BENCH fsspec-read ratio={candidate / reference:.2f} "
        f"branchwater_ms={candidate * 1e3:.1f} pyarrow_ms={reference * 1e3:.1f} "
        f"files={files} rows={files * rows} {backend.label}",
        flush=True,
    )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench_fsspec")
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=7)
    args, _ = parser.parse_known_args(argv)
    import fsspec

    if "branchwater" not in fsspec.available_protocols():
        fsspec.register_implementation("branchwater", BranchwaterFileSystem)
    bench_read(args.files, args.rows, args.repeats)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
