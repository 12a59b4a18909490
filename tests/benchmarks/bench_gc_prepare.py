"""`prepare_uncommitted_for_gc`, issue 12, on the selected back end (`backends`).

`gc-prepare`: a run over N uncommitted objects spread over B branches (default 1M on 200;
`--seed-size` for the 5M on 1K of lakeFS's GC design, `--quick` for a smoke run,
`--rowid-table`, printed as `gc-prepare-rowid`, on a KV file in the layout SQLite stores had
before `WITHOUT ROWID`) against
the floor in the same run: scanning the same staged rows through the KV store, a driver's
batch at a time with no Python per row, and writing their values as one Parquet file (on
the stack: to memory and one PUT to S3, where the run writes its files too). Rows
are staged interleaved across branches, as concurrent jobs write them. `projected_seed_s`
scales the run's time linearly to that design's 5M/1K (its figure: about 30 s to write the
files).
"""

from __future__ import annotations

import argparse
import tempfile
import time
import uuid
from datetime import datetime, timezone
from operator import itemgetter
from pathlib import Path

import pyarrow as pa

from branchwater.engine.api import Lake, Repository
from branchwater.engine.gc.addresses import slice_name
from branchwater.engine.gc.prepare import ROW_GROUP_ROWS, read_manifest
from branchwater.engine.graveler.model import Entry, encode_entry
from tests.benchmarks.backends import EMBEDDED, Backend, open_backend, selected
from tests.benchmarks.declarations import Benchmark, Suite
from tests.helpers.gc import rowid_sqlite_file

BENCHMARKS = Suite(
    section="Garbage collection",
    benchmarks=(
        Benchmark(
            "gc-prepare",
            measures="`prepare_uncommitted_for_gc` over 1M staged objects on 200 branches",
            reference="scanning the same staged rows and writing them as one Parquet file "
            "(`projected_seed_s`: the run scaled to lakeFS's GC design's 5M objects on 1K "
            "branches)",
            target=2,
            limits={"projected_seed_s": 30},
        ),
        Benchmark(
            "gc-prepare-rowid",
            measures="`gc-prepare` on a KV file in the older rowid table layout "
            "(`--rowid-table`, not run by default)",
            reference="the same floor on that file",
        ),
    ),
)

SEED_OBJECTS, SEED_BRANCHES = 5_000_000, 1_000
MTIME = datetime(2026, 11, 1, tzinfo=timezone.utc)
OBJECTS_PER_SLICE = 100_000


def entry(i: int, slice_: str) -> Entry:
    return Entry(
        f"tables/t{i % 97:02d}/date=2026-11-{i % 28 + 1:02d}/part-{i:09d}.parquet",
        f"data/{slice_}/{uuid.UUID(int=i).hex}",
        1024 + i % 7919,
        f"{i * 2654435761 % (1 << 128):032x}",
        MTIME,
    )


def stage(backend: Backend, tokens: list[str], objects: int) -> None:
    """Fill the branches' staging tokens straight through the driver: the benchmark is the
    run."""
    slices = [slice_name(MTIME) for _ in range(objects // OBJECTS_PER_SLICE + 1)]
    backend.stage_rows(
        (tokens[i % len(tokens)].encode(), e.path.encode(), encode_entry(e))
        for i, e in ((i, entry(i, slices[i // OBJECTS_PER_SLICE])) for i in range(objects))
    )
    backend.checkpoint()


def setup(
    backend: Backend, objects: int, branches: int, rowid: bool = False
) -> tuple[Lake, Repository, list[str]]:
    if rowid:
        rowid_sqlite_file(backend.db)
    lake = backend.connect(range_cache_dir=backend.root / "cache")
    repo = lake.create_repository("bench", storage_namespace=backend.namespace("ns"))
    for b in range(1, branches):
        repo.create_branch(f"branch-{b:04d}")
    g = lake.graveler
    tokens = [branch.staging_token for branch in g.refs.branches(repo.record)]
    stage(backend, tokens, objects)
    return lake, repo, tokens


def floor_seconds(backend: Backend, lake: Lake, tokens: list[str], name: str) -> float:
    start = time.perf_counter()
    values: list[bytes] = []
    for token in tokens:
        for batch in lake.graveler.kv.scan_batches(token.encode(), b"", ROW_GROUP_ROWS):
            values.extend(map(itemgetter(1), batch))
    backend.write_parquet(name, pa.table({"value": pa.array(values, pa.binary())}))
    return time.perf_counter() - start


def prepare_seconds(repo: Repository) -> tuple[float, str]:
    start = time.perf_counter()
    run = repo.prepare_uncommitted_for_gc()
    return time.perf_counter() - start, run.run_id


def bench_prepare(objects: int, branches: int, repeats: int, rowid: bool) -> None:
    """Alternate floor and run `repeats` times after a warm-up scan, and keep the best of
    each: on a shared machine the page cache and neighbours move single timings a lot."""
    with tempfile.TemporaryDirectory() as tmp, open_backend(Path(tmp)) as backend:
        lake, repo, tokens = setup(backend, objects, branches, rowid)
        floor_seconds(backend, lake, tokens, "warm-up.parquet")
        floors, runs = [], []
        for _ in range(repeats):
            floors.append(floor_seconds(backend, lake, tokens, "floor.parquet"))
            runs.append(prepare_seconds(repo))
        floor = min(floors)
        ours, run_id = min(runs)
        manifest = read_manifest(lake.graveler.objects(repo.storage_namespace), run_id)
        written = sum(manifest["branches"].values())
        lake.close()
    assert written == objects, (written, objects)
    projected = ours * SEED_OBJECTS / objects
    print(
        f"BENCH gc-prepare{'-rowid' if rowid else ''} ratio={ours / floor:.2f} "
        f"prepare_s={ours:.2f} floor_s={floor:.2f} "
        f"projected_seed_s={projected:.1f} files={len(manifest['files'])} "
        f"objects={objects} branches={branches} table={'rowid' if rowid else 'without-rowid'} "
        f"{backend.label}",
        flush=True,
    )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench_gc_prepare")
    parser.add_argument("--gc-objects", type=int, default=1_000_000)
    parser.add_argument("--gc-branches", type=int, default=200)
    parser.add_argument(
        "--seed-size", action="store_true", help="lakeFS's GC design's 5M objects on 1K branches"
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run: 20k objects")
    parser.add_argument("--gc-repeats", type=int, default=2)
    parser.add_argument(
        "--rowid-table", action="store_true", help="a KV file in the older rowid table layout"
    )
    args, _ = parser.parse_known_args(argv)
    objects, branches = args.gc_objects, args.gc_branches
    if args.seed_size:
        objects, branches = SEED_OBJECTS, SEED_BRANCHES
    if args.quick:
        objects, branches = 20_000, 20
    if args.rowid_table and selected() != EMBEDDED:
        raise SystemExit("--rowid-table is a SQLite file layout: run it on the embedded back end")
    bench_prepare(objects, branches, args.gc_repeats, args.rowid_table)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
