"""The GC job's S3 operations against the object library doing the same requests (issue 41,
item 2): runs on the stack only (`--backend stack`: PostgreSQL, SeaweedFS's S3, local
Spark); on the embedded back end it prints a note and measures nothing.

The namespace is `bench_gc`'s generated one at `--objects` (default 100,000 here; the
issue's 1,000,000 with `--objects 1000000`): a slice per 5,000 objects, 10 branches, a
commit per 1,000 committed objects, a tenth uncommitted and half of the objects garbage
(`size_for`), so the sweep has DeleteObjects batches enough to time. The library is
`obstore` (the engine's S3 base); each side's best of `--rounds` counts (of at least
`READ_ROUNDS` for the committed read), the two sides alternating.

- `gc-s3-list`: the job's listing (`list_slice` of every slice, in Spark tasks on the job's
  partitions, as its mark lists them) against `obstore` listing the same slice prefixes,
  as many at once as Spark runs tasks (its cores).
- `gc-s3-delete`: a clean run's sweep phase (every candidate deleted: reading the mark's
  files, DeleteObjects through the engine's store, the records it writes) against
  DeleteObjects batches of 1,000 of the same keys by `obstore`, as many in flight as the
  sweep's tasks at once times the store's requests in flight. The garbage is PUT again
  before each round.
- `gc-s3-committed-read`: the job's read of the committed ranges (`Namespace.
  read_parquet_files` of every range's address and size columns, `READERS` files at once,
  as each committed-read task reads its share) against one GET of each file by `obstore`
  and pyarrow reading the same columns from memory (`ParquetFile`, the fastest way, as ours
  does), as many at once. `task_s` beside it is the committed-read tasks' whole work on the
  same files (each address once, imported ones left out, the gate's copy PUT).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from branchwater.engine.gc.runs.storage import READERS, Namespace
from tests.benchmarks.backends import EMBEDDED, Backend, open_backend, selected
from tests.benchmarks.bench_gc import (
    Generated,
    Size,
    generate,
    in_parallel,
    run_gc,
    slices_listing,
    spark_session,
)
from tests.benchmarks.declarations import Benchmark, Suite

BENCHMARKS = Suite(
    section="Garbage collection",
    about="On S3 (the stack only): the GC job's own listing, deletes and committed read over "
    "a generated namespace of 100k objects (`--objects` for the issue's 1M), each against "
    "`obstore` making the same requests with the same parallelism, best of two rounds.",
    benchmarks=(
        Benchmark(
            "gc-s3-list",
            measures="the GC job's listing of every slice (`list_slice` in Spark tasks)",
            reference="`obstore` listing the same slice prefixes, as many at once as Spark's cores",
            target=1.3,
        ),
        Benchmark(
            "gc-s3-delete",
            measures="a clean run's sweep phase deleting every candidate",
            reference="`obstore` DeleteObjects batches of 1,000 of the same keys, as many in "
            "flight as the sweep's",
            target=1.2,
        ),
        Benchmark(
            "gc-s3-committed-read",
            measures="the GC job's read of every committed range's addresses and sizes "
            "(`Namespace.read_parquet_files`)",
            reference="a GET of each same Parquet file by `obstore` and pyarrow reading the "
            "same columns, as many at once",
            target=1.5,
        ),
    ),
)

OBJECTS_PER_SLICE = 5_000
DELETE_BATCH = 1_000
RANGE_COLUMNS = ["address", "size"]
READ_ROUNDS = 5
"""The fewest rounds of the committed read, whatever `--rounds`: a round is short even at
1M objects, and one sample of each side on a shared host is mostly noise."""


def size_for(objects: int) -> Size:
    return Size(
        objects,
        max(4, objects // OBJECTS_PER_SLICE),
        10,
        max(10, objects // 1_000),
        objects // 10,
        objects // 2,
    )


def best_of(rounds: int, ours: Callable[[], int], floor: Callable[[], int]) -> tuple[float, float]:
    """Each side's fastest of `rounds`, alternating, after an untimed round of each (Spark's
    Python workers and the connections start once); both sides must count the same."""
    best = [float("inf"), float("inf")]
    counts = {ours(), floor()}
    for _ in range(rounds):
        for i, side in enumerate((ours, floor)):
            start = time.perf_counter()
            counts.add(side())
            best[i] = min(best[i], time.perf_counter() - start)
    if len(counts) != 1:
        raise AssertionError(f"the two sides counted differently: {sorted(counts)}")
    return best[0], best[1]


# listing ------------------------------------------------------------------------------------


def _listed_rows(ns: Namespace, slices: list[str]) -> Iterator[pa.RecordBatch]:
    from branchwater.spark_jobs.gc.listing import list_slice

    rows = sum(list_slice(ns, name).num_rows for name in slices)
    yield pa.record_batch([pa.array([rows], pa.int64())], names=["rows"])


def bench_list(spark: Any, gen: Generated, rounds: int) -> None:
    from branchwater.spark_jobs.gc.frames import cores, map_shares
    from branchwater.spark_jobs.gc.listing import data_slices

    backend = gen.backend
    ns = Namespace.of(gen.repo.storage_namespace, backend.s3_options)
    slices = data_slices(ns)
    workers = cores(spark)

    def ours() -> int:
        task = partial(_listed_rows, ns)
        frame = map_shares(spark, slices, task, "rows long", 2 * workers)
        return sum(row.rows for row in frame.collect())

    def floor() -> int:
        return slices_listing(backend, slices, workers)

    ours_s, floor_s = best_of(rounds, ours, floor)
    print(
        f"BENCH gc-s3-list ratio={ours_s / floor_s:.2f} job_s={ours_s:.2f} "
        f"library_s={floor_s:.2f} objects={ours()} slices={len(slices)} parallel={workers} "
        f"{backend.label}",
        flush=True,
    )


# committed read -----------------------------------------------------------------------------


def bench_committed_read(gen: Generated, objects: int, rounds: int) -> None:
    backend = gen.backend
    ns = Namespace.of(gen.repo.storage_namespace, backend.s3_options)
    keys = [key.removeprefix("ns/") for key in backend.keys("ns/_branchwater/ranges")]

    def ours() -> int:
        return sum(batch.num_rows for batch in ns.read_parquet_files(keys, RANGE_COLUMNS))

    store = backend.library()

    def one(key: str) -> int:
        import obstore

        data = obstore.get(store, f"ns/{key}").bytes()
        parquet = pq.ParquetFile(pa.BufferReader(memoryview(data)))
        return parquet.read(columns=RANGE_COLUMNS).num_rows

    def floor() -> int:
        return in_parallel(READERS, one, keys)

    ours_s, floor_s = best_of(rounds, ours, floor)
    task_s = _committed_task(ns, keys, rounds)
    print(
        f"BENCH gc-s3-committed-read ratio={ours_s / floor_s:.2f} job_s={ours_s:.3f} "
        f"library_s={floor_s:.3f} task_s={task_s:.3f} ranges={len(keys)} rows={ours()} "
        f"parallel={READERS} objects={objects} {backend.label}",
        flush=True,
    )


def _committed_task(ns: Namespace, keys: list[str], rounds: int) -> float:
    """The best time of the whole work of the committed-read tasks over the same files, not
    only their reads: each address once (a group-by), the imported ones left out, and the
    copy the gate reads PUT (`committed._written_addresses`), so the figure next to the
    ratio does not under-count what the job does with what it reads."""
    from branchwater.spark_jobs.gc.committed import _written_addresses

    best = float("inf")
    for _ in range(rounds + 1):
        start = time.perf_counter()
        _written_addresses(ns, RANGE_COLUMNS, "_branchwater/bench-scratch", keys)
        best = min(best, time.perf_counter() - start)
    ns.delete_folder("_branchwater/bench-scratch")
    return best


# deletes ------------------------------------------------------------------------------------


def bench_delete(spark: Any, gen: Generated, objects: int, rounds: int) -> None:
    """Rounds of: PUT the garbage (the first round sweeps what `generate` PUT, which the
    dry runs before left in place), sweep it with a clean run; PUT it again, delete it with
    the library. Only deleting is timed on either side: at 1M objects each PUT of the
    garbage takes longer than either side's deletes."""
    from branchwater.engine.objects.s3 import REQUESTS_IN_FLIGHT
    from branchwater.spark_jobs.gc.frames import cores

    backend = gen.backend
    keys = [f"ns/{address}" for address in gen.garbage]
    batches = [keys[i : i + DELETE_BATCH] for i in range(0, len(keys), DELETE_BATCH)]
    store = backend.library()
    ours, floor, deleted, in_flight = [], [], 0, 0
    for number in range(rounds):
        if number:
            backend.put_empty(keys)
        _, summary = run_gc(spark, gen, dry_run=False)
        deleted = summary.volume("deleted").objects
        tasks = min(cores(spark), len(summary.files.get("candidates", [])) or 1)
        in_flight = tasks * REQUESTS_IN_FLIGHT
        ours.append(summary.phases["sweep"])
        backend.put_empty(keys)

        def one(batch: list[str]) -> int:
            import obstore

            obstore.delete(store, batch)
            return len(batch)

        start = time.perf_counter()
        in_parallel(in_flight, one, batches)
        floor.append(time.perf_counter() - start)
    if deleted != len(keys):
        raise AssertionError(f"the sweep deleted {deleted} objects, not the {len(keys)} garbage")
    survived = set(keys) & set(backend.keys("ns/data"))
    if survived:
        raise AssertionError(f"{len(survived)} objects survived the library's deletes")
    ours_s, floor_s = min(ours), min(floor)
    print(
        f"BENCH gc-s3-delete ratio={ours_s / floor_s:.2f} sweep_s={ours_s:.2f} "
        f"library_s={floor_s:.2f} deleted={deleted} batches={len(batches)} "
        f"in_flight={in_flight} objects={objects} {backend.label}",
        flush=True,
    )


def measure(backend: Backend, objects: int, rounds: int) -> None:
    spark = spark_session()
    try:
        started = time.perf_counter()
        gen = generate(backend, size_for(objects))
        print(f"  generate: {time.perf_counter() - started:.1f} s", flush=True)
        run_gc(spark, gen)  # untimed: the JVM's first run
        bench_list(spark, gen, rounds)
        bench_committed_read(gen, objects, max(rounds, READ_ROUNDS))
        bench_delete(spark, gen, objects, rounds)
        gen.lake.close()
    finally:
        spark.stop()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench_gc_s3")
    parser.add_argument("--objects", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=2)
    args, _ = parser.parse_known_args(argv)
    if selected() == EMBEDDED:
        print("  bench_gc_s3 measures S3 requests: run it with --backend stack", flush=True)
        return
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    with (
        tempfile.TemporaryDirectory(prefix="bench-gc-s3-") as tmp,
        open_backend(Path(tmp)) as backend,
    ):
        measure(backend, args.objects, args.rounds)


if __name__ == "__main__":
    main(sys.argv[1:])
