"""The uncommitted-GC Spark job on a generated namespace (issue 13), local Spark, on the
selected back end (`backends`): SQLite and local files, or PostgreSQL and SeaweedFS's S3
(the objects PUT there, the job given the server's S3 options).

Default: 1,000,000 objects in 200 slices, 100 branches, 1,000 commits, 100,000 uncommitted,
50,000 garbage (`--objects N` scales every count; `--quick` is a smoke run). Slices are named
as if opened between 214 and 14 hours ago, so an optimized run may skip them. Runs use a zero
minimum age (every object counts) and mark only (`dry_run`) unless said otherwise; the
clean, optimized and floor figures are each the best of three, the two kinds compared
alternating, after five untimed clean runs that warm the JVM.

- `gc-clean`: a clean run against the floor of what it must do: `obstore` listing the same
  slices, as many at once as Spark's cores (on S3 the listing is most of a run), and in
  the same Spark session an anti-join of the same three address sets (listed, committed,
  uncommitted) cached beforehand. Target ≤ 2.
- `gc-optimized`: after a swept clean run and 1% new writes (new slices, commits, staged
  objects and garbage), an optimized run against a clean run of the same state. Target ≤ 0.2.
- `gc-clean-mark`: the clean run's mark phase alone (on the executors, where a clean run
  marks) against the same floor.
- `gc-mark-driver`: the optimized run of `gc-optimized`, marking on the driver as
  `mark_paths.choose` picks for it, against the same run marking on the executors
  (`driver_rows=0`), the two alternating on the same state: whether the driver path earns
  its keep.
- `gc-gate-floor`: the candidates' suite of the quality gate alone, on a cached frame as
  large as the optimized run's candidates, against the same clean run: a part of every
  optimized run that reading less cannot shrink, as a ratio.
- `gc-vacuum`: the optimized run (with its sweep) against `deltalake`'s full
  `DeltaTable.vacuum` of a Delta table with as many files and the same share unreferenced, on
  the same disk (the same S3 server on the stack). Target ≤ 1.
- `gc-optimized-idle`: an optimized run with nothing written since its (swept) base run,
  against a clean run of the same state: the least an optimized run costs at this size
  (prepare, the previous run's sets, the gate), which no pruning of new ranges and slices
  can lower.
- `gc-scaling`: clean-run seconds at 1/4, 1/2 and 1 times the size, per million objects.

The seed's bottom line (lakeFS's GC design's 20M-object repository) is `bench_seed`'s: a run
on a standalone cluster, projected from its per-object costs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import random
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from branchwater.engine.api import Lake, Repository
from branchwater.engine.gc.addresses import slice_name
from branchwater.engine.gc.runs.storage import Namespace
from branchwater.engine.graveler.committed import RangePolicy
from branchwater.engine.graveler.model import Entry, encode_entry
from tests.benchmarks.backends import Backend, open_backend
from tests.benchmarks.declarations import Benchmark, Suite

BENCHMARKS = Suite(
    section="Garbage collection",
    about="Over 1M objects in 200 slices, 100 branches, 1,000 commits, 100k uncommitted and "
    "50k garbage; the clean, optimized and floor figures are each the best of three runs, "
    "the two sides of a ratio alternating, after untimed clean runs that warm the JVM.",
    benchmarks=(
        Benchmark(
            "gc-clean",
            measures="the clean run (mark only)",
            reference="`obstore` listing the same slices, as many at once as Spark's cores "
            "(`listing_s`), and the anti-join (`left_anti`) of the same three address sets "
            "(listed, committed, uncommitted), cached beforehand, in the same Spark session "
            "(`join_s`)",
            target=2,
        ),
        Benchmark(
            "gc-clean-mark",
            measures="the clean run's mark phase alone, on the executors",
            reference="the same floor",
        ),
        Benchmark(
            "gc-optimized",
            measures="an optimized run after a swept clean run and 1% new writes",
            reference="a clean run of the same state",
            target=0.2,
        ),
        Benchmark(
            "gc-mark-driver",
            measures="that optimized run marking and flagging on the driver, as "
            "`mark_paths.choose` picks for it",
            reference="the same run marking and flagging on the executors (`driver_rows=0`)",
            target=1,
        ),
        Benchmark(
            "gc-optimized-idle",
            measures="an optimized run with nothing written since its swept base run",
            reference="a clean run of the same state",
        ),
        Benchmark(
            "gc-gate-floor",
            measures="the gate's candidates suite alone on as many candidates as the "
            "optimized run's",
            reference="that clean run",
        ),
        Benchmark(
            "gc-vacuum",
            measures="an optimized run with its sweep",
            reference="`deltalake`'s full `vacuum` of a Delta table of as many files, as many "
            "unreferenced, on the same disk or S3 server",
            target=1,
        ),
        Benchmark(
            "gc-scaling",
            measures="clean runs at a quarter, half and all of the size, seconds per million "
            "objects",
            reference="the same per million at a quarter of the size",
        ),
    ),
)

BEST_OF = 3
"""Clean runs and floors are each the best of this many: on a shared machine one run in a
few is slowed by other work."""
WARM_UP = 5
"""Full-size dry runs before anything is timed: the JVM compiles Spark's hot paths during
the first runs of a session, which are slower than later ones until it has (the first by
far); the floor, a simpler plan, needs far fewer."""
MTIME = datetime(2026, 11, 1, tzinfo=UTC)
RANGES = RangePolicy(target_entries=1_000)
"""Ranges of about 1,000 entries: lakeFS's GC design's large repository had ~400 entries
per range."""


@dataclass(frozen=True)
class Size:
    objects: int
    slices: int
    branches: int
    commits: int
    uncommitted: int
    garbage: int

    def scaled(self, factor: float) -> Size:
        return Size(
            max(1, int(self.objects * factor)),
            max(1, int(self.slices * factor)),
            self.branches,
            max(1, int(self.commits * factor)),
            max(1, int(self.uncommitted * factor)),
            max(1, int(self.garbage * factor)),
        )


@dataclass
class Generated:
    backend: Backend
    lake: Lake
    repo: Repository
    committed: list[str]
    uncommitted: list[str]
    garbage: list[str]


def old_slices(count: int, now: datetime) -> list[str]:
    span = timedelta(hours=200)
    return [slice_name(now - timedelta(hours=14) - span * i / count) for i in range(count)]


def addresses_in(slices: list[str], count: int, rng: random.Random) -> list[str]:
    return [
        f"data/{rng.choice(slices)}/{uuid.UUID(int=rng.getrandbits(128)).hex}" for _ in range(count)
    ]


def commit_all(lake: Lake, repo: Repository, addresses: list[str], commits: int, tag: str) -> None:
    """`commits` commits on main, each appending its share of `addresses` under its own
    folder: only the last range of each commit is rewritten, as in an append-mostly lake."""
    g, record = lake.graveler, repo.record
    committed = g.committed(record)
    head = g.refs.get_commit(record, g.refs.get_branch(record, "main")[0].commit_id)
    share = max(1, len(addresses) // commits)
    for number in range(commits):
        chunk = addresses[number * share : (number + 1) * share if number < commits - 1 else None]
        changes = [
            (
                f"t/{tag}{number:05d}/{i:07d}",
                Entry(f"t/{tag}{number:05d}/{i:07d}", a, 0, "c", MTIME),
            )
            for i, a in enumerate(chunk)
        ]
        metarange = committed.apply(head.metarange_id, changes)
        head = g.refs.add_commit(record, [head], metarange, f"load {tag}{number}")
    branch, predicate = g.refs.get_branch(record, "main")
    g.refs.set_branch_if(record, dataclasses.replace(branch, commit_id=head.id), predicate)


def stage(backend: Backend, tokens: list[str], addresses: list[str], tag: str) -> None:
    backend.stage_rows(
        (
            tokens[i % len(tokens)].encode(),
            f"u/{tag}{i:08d}".encode(),
            encode_entry(Entry(f"u/{tag}{i:08d}", a, 0, "c", MTIME)),
        )
        for i, a in enumerate(addresses)
    )


def write_objects(backend: Backend, addresses: list[str]) -> None:
    """Empty objects in namespace `ns`: listing and deleting cost the same whatever their
    size."""
    backend.put_empty([f"ns/{a}" for a in addresses])


def generate(backend: Backend, size: Size, seed: int = 7) -> Generated:
    rng = random.Random(seed)
    lake = backend.connect(range_cache_dir=backend.root / "cache", range_policy=RANGES)
    repo = lake.create_repository("bench", storage_namespace=backend.namespace("ns"))
    for b in range(1, size.branches):
        repo.create_branch(f"branch-{b:04d}")
    slices = old_slices(size.slices, datetime.now(UTC))
    committed_count = size.objects - size.uncommitted - size.garbage
    committed = addresses_in(slices, committed_count, rng)
    uncommitted = addresses_in(slices, size.uncommitted, rng)
    garbage = addresses_in(slices, size.garbage, rng)
    write_objects(backend, committed + uncommitted + garbage)
    commit_all(lake, repo, committed, size.commits, "a")
    tokens = [b.staging_token for b in lake.graveler.refs.branches(repo.record)]
    stage(backend, tokens, uncommitted, "a")
    return Generated(backend, lake, repo, committed, uncommitted, garbage)


def add_writes(gen: Generated, size: Size, share: float) -> None:
    """`share` new objects in a new slice: committed in new commits, staged, and garbage."""
    rng = random.Random(11)
    fresh = [slice_name(datetime.now(UTC))]
    new = size.scaled(share)
    committed = addresses_in(fresh, new.objects - new.uncommitted - new.garbage, rng)
    uncommitted = addresses_in(fresh, new.uncommitted, rng)
    garbage = addresses_in(fresh, new.garbage, rng)
    write_objects(gen.backend, committed + uncommitted + garbage)
    commit_all(gen.lake, gen.repo, committed, max(1, new.commits), "b")
    tokens = [b.staging_token for b in gen.lake.graveler.refs.branches(gen.repo.record)]
    stage(gen.backend, tokens, uncommitted, "b")


def spark_session() -> Any:
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from branchwater.spark_jobs.gc.job import SESSION_CONF

    cores = os.cpu_count() or 2
    spark = (
        SparkSession.builder.master(f"local[{cores}]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", str(4 * cores))
        .config("spark.driver.memory", "6g")
        .config(map=SESSION_CONF)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def run_gc(spark: Any, gen: Generated, **settings: Any) -> tuple[float, Any]:
    """One run's seconds and summary; `summary.spark_jobs` is how many Spark jobs it ran
    (a figure a busy machine does not change)."""
    from branchwater.engine.gc.runs.config import JobConfig
    from branchwater.spark_jobs.gc.job import GCJob

    settings.setdefault("min_age", timedelta(0))
    settings.setdefault("max_share", 1.0)
    settings.setdefault("dry_run", True)
    settings.setdefault("s3_options", gen.backend.s3_options)
    config = JobConfig(gen.backend.kv_url, gen.repo.name, **settings)
    group = f"bench-{uuid.uuid4().hex}"
    spark.sparkContext.setJobGroup(group, "bench_gc run")
    start = time.perf_counter()
    summary = GCJob(spark, config).run()
    seconds = time.perf_counter() - start
    summary.spark_jobs = len(spark.sparkContext.statusTracker().getJobIdsForGroup(group))
    return seconds, summary


Timed = tuple[float, Any]


def best_alternating(first: Callable[[], Timed], second: Callable[[], Timed]) -> list[Timed]:
    """The fastest of `BEST_OF` runs of each of two measurements (seconds and a result),
    run in turn: a slow spell of a shared machine, or the JVM still compiling Spark's hot
    paths, then weighs on both alike."""
    runs: list[list[Timed]] = [[], []]
    for _ in range(BEST_OF):
        runs[0].append(first())
        runs[1].append(second())
    return [min(timed, key=lambda result: result[0]) for timed in runs]


def optimized_against_clean(spark: Any, gen: Generated, name: str) -> tuple[Any, float]:
    """The best optimized run against the best clean run of the same state, printed as
    benchmark `name`; the optimized run's summary and the clean run's seconds."""
    (optimized_s, optimized), (clean_s, _) = best_alternating(
        lambda: run_gc(spark, gen, mode="optimized"), lambda: run_gc(spark, gen)
    )
    print(
        f"BENCH {name} ratio={optimized_s / clean_s:.3f} "
        f"optimized_s={optimized_s:.1f} clean_s={clean_s:.1f} "
        f"slices_read={optimized.slices['read']} ranges_read={optimized.ranges['ranges_read']} "
        f"spark_jobs={optimized.spark_jobs} phases={json.dumps(optimized.phases)} "
        f"{gen.backend.label}",
        flush=True,
    )
    return optimized, clean_s


def clean_against_floor(spark: Any, gen: Generated) -> tuple[float, Any, Floor]:
    """The best clean run, its summary, and the best floor: the slices listed by the object
    library, and the anti-join of the three address sets, cached and counted beforehand."""
    from branchwater.spark_jobs.gc.frames import cores
    from branchwater.spark_jobs.gc.listing import data_slices

    listed = [*gen.committed, *gen.uncommitted, *gen.garbage]
    frames = []
    for name, values in (("l", listed), ("c", gen.committed), ("u", gen.uncommitted)):
        path = gen.backend.root / f"floor-{name}.parquet"
        pq.write_table(pa.table({"address": pa.array(values, pa.string())}), path)
        frame = spark.read.parquet(str(path)).cache()
        frame.count()
        frames.append(frame)
    slices = data_slices(Namespace.of(gen.repo.storage_namespace, gen.backend.s3_options))
    workers = cores(spark)

    def floor() -> Timed:
        start = time.perf_counter()
        slices_listing(gen.backend, slices, workers)
        listed_at = time.perf_counter()
        frames[0].join(frames[1], "address", "left_anti").join(
            frames[2], "address", "left_anti"
        ).count()
        floor = Floor(listed_at - start, time.perf_counter() - listed_at)
        return floor.total_s, floor

    (clean_s, summary), (_, best) = best_alternating(lambda: run_gc(spark, gen), floor)
    for frame in frames:
        frame.unpersist()
    return clean_s, summary, best


@dataclass(frozen=True)
class Floor:
    """A clean run's floor, in seconds: its listing and its anti-join."""

    listing_s: float
    join_s: float

    @property
    def total_s(self) -> float:
        return self.listing_s + self.join_s

    def figures(self) -> str:
        return f"floor_s={self.total_s:.2f} listing_s={self.listing_s:.2f} join_s={self.join_s:.2f}"


def slices_listing(backend: Backend, slices: list[str], workers: int) -> int:
    """The objects of the namespace's (`ns`) `slices`, listed by `obstore` on the object
    root, `workers` slices at once: the listing's floor, a slice a task as the job lists."""
    import obstore

    store = backend.library()

    def one(name: str) -> int:
        listed = obstore.list(store, f"ns/data/{name}/", chunk_size=1000)
        return sum(len(batch) for batch in listed)

    return in_parallel(workers, one, slices)


def in_parallel(workers: int, work: Callable[[Any], int], items: list[Any]) -> int:
    """The sum of `work` over `items`, `workers` at once on threads."""
    with ThreadPoolExecutor(workers) as pool:
        return sum(pool.map(work, items))


def driver_against_executors(spark: Any, gen: Generated) -> None:
    """The optimized run on each mark path, best of each, alternating, on one state (dry
    runs leave it unchanged), printed as `gc-mark-driver`."""
    (driver_s, driver), (executors_s, executors) = best_alternating(
        lambda: run_gc(spark, gen, mode="optimized"),
        lambda: run_gc(spark, gen, mode="optimized", driver_rows=0),
    )
    print(
        f"BENCH gc-mark-driver ratio={driver_s / executors_s:.2f} "
        f"driver_s={driver_s:.2f} executors_s={executors_s:.2f} "
        f"marked_on={driver.slices['marked_on']}/{executors.slices['marked_on']} "
        f"driver_spark_jobs={driver.spark_jobs} executors_spark_jobs={executors.spark_jobs} "
        f"driver_phases={json.dumps(driver.phases)} "
        f"executors_phases={json.dumps(executors.phases)} {gen.backend.label}",
        flush=True,
    )


def gate_seconds(spark: Any, addresses: list[str]) -> float:
    """The candidates' suite of the quality gate alone, on a small cached frame: the least
    any run that deletes pays, however little it reads (the prepare output's suite, which
    runs beside the mark, comes on top)."""
    from branchwater.spark_jobs.gc.gate import Gate, GateLimits

    frame = spark.createDataFrame(
        [(a, False, None, 1e6) for a in addresses],
        "address string, referenced boolean, duplicate string, age_seconds double",
    ).cache()
    frame.count()
    best = float("inf")
    for _ in range(BEST_OF):
        start = time.perf_counter()
        Gate(spark).check_candidates(frame, len(addresses), GateLimits(0.0, len(addresses)))
        best = min(best, time.perf_counter() - start)
    frame.unpersist()
    return best


def delta_table(backend: Backend, files: int, partitions: int, unreferenced: float) -> str:
    """A Delta table of `files` empty data files, `unreferenced` of them not in its log, at
    object folder `delta`; its URI."""
    names = [f"p={i % partitions:04d}/part-{i:09d}.parquet" for i in range(files)]
    backend.put_empty([f"delta/{name}" for name in names])
    cut = int(files * (1 - unreferenced))
    now_ms = int(time.time() * 1000)
    schema = {
        "type": "struct",
        "fields": [
            {"name": "v", "type": "long", "nullable": True, "metadata": {}},
            {"name": "p", "type": "string", "nullable": True, "metadata": {}},
        ],
    }
    log = [json.dumps({"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}}) + "\n"]
    log.append(
        json.dumps(
            {
                "metaData": {
                    "id": str(uuid.uuid4()),
                    "format": {"provider": "parquet", "options": {}},
                    "schemaString": json.dumps(schema),
                    "partitionColumns": ["p"],
                    "configuration": {},
                    "createdTime": now_ms,
                }
            }
        )
        + "\n"
    )
    for name in names[:cut]:
        part = name.split("/", 1)[0].split("=", 1)[1]
        add = {
            "path": name,
            "partitionValues": {"p": part},
            "size": 0,
            "modificationTime": now_ms,
            "dataChange": True,
        }
        log.append(json.dumps({"add": add}) + "\n")
    backend.put_bytes(f"delta/_delta_log/{0:020d}.json", "".join(log).encode())
    return backend.uri("delta")


def vacuum_seconds(backend: Backend, table: str) -> tuple[float, int]:
    from deltalake import DeltaTable

    start = time.perf_counter()
    deleted = DeltaTable(table, storage_options=backend.delta_options()).vacuum(
        retention_hours=0, dry_run=False, enforce_retention_duration=False, full=True
    )
    return time.perf_counter() - start, len(deleted)


def timed(label: str, fn: Callable[[], Any]) -> Any:
    start = time.perf_counter()
    result = fn()
    print(f"  {label}: {time.perf_counter() - start:.1f} s", flush=True)
    return result


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench_gc")
    parser.add_argument("--objects", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true", help="100,000 objects, no scaling")
    parser.add_argument("--no-scaling", action="store_true")
    parser.add_argument("--warm-up", type=int, default=WARM_UP, help="untimed clean runs")
    args, _ = parser.parse_known_args(argv)
    objects = 100_000 if args.quick else args.objects
    factor = objects / 1_000_000
    size = Size(
        objects,
        max(4, int(200 * factor)),
        100,
        max(10, int(1000 * factor)),
        int(100_000 * factor),
        int(50_000 * factor),
    )
    scratch = Path(tempfile.mkdtemp(prefix="bench-gc-"))
    spark = spark_session()
    try:
        with open_backend(scratch / "full") as backend:
            measure(spark, backend, size, args.warm_up, not (args.quick or args.no_scaling))
    finally:
        spark.stop()
        shutil.rmtree(scratch, ignore_errors=True)


def measure(spark: Any, backend: Backend, size: Size, warm_up: int, scaling: bool) -> None:
    """Every benchmark of the module, on one generated lake (and, for `gc-scaling`, two
    smaller ones beside it)."""
    objects, label = size.objects, backend.label
    gen = timed("generate", lambda: generate(backend, size))
    for _ in range(warm_up):
        run_gc(spark, gen)
    clean_s, first, floor = clean_against_floor(spark, gen)
    floor_s = floor.total_s
    print(
        f"BENCH gc-clean ratio={clean_s / floor_s:.2f} clean_s={clean_s:.1f} "
        f"{floor.figures()} objects={objects} spark_jobs={first.spark_jobs} "
        f"phases={json.dumps(first.phases)} {label}",
        flush=True,
    )
    print(
        f"BENCH gc-clean-mark ratio={first.phases['mark'] / floor_s:.2f} "
        f"mark_s={first.phases['mark']:.2f} floor_s={floor_s:.2f} "
        f"marked_on={first.slices['marked_on']} {label}",
        flush=True,
    )
    run_gc(spark, gen, dry_run=False)
    timed("1% new writes", lambda: add_writes(gen, size, 0.01))
    optimized, clean_again_s = optimized_against_clean(spark, gen, "gc-optimized")
    driver_against_executors(spark, gen)
    gate_s = gate_seconds(spark, gen.garbage[: optimized.volume("candidates").objects])
    print(
        f"BENCH gc-gate-floor ratio={gate_s / clean_again_s:.2f} gate_s={gate_s:.2f} "
        f"clean_s={clean_again_s:.1f} rows={optimized.volume('candidates').objects} {label}",
        flush=True,
    )
    table = timed(
        "delta table",
        lambda: delta_table(backend, objects, size.slices, size.garbage / objects),
    )
    vacuum_s, vacuumed = vacuum_seconds(backend, table)
    add_writes(gen, size, 0.01)
    optimized_swept_s, _ = run_gc(spark, gen, mode="optimized", dry_run=False)
    print(
        f"BENCH gc-vacuum ratio={optimized_swept_s / vacuum_s:.2f} "
        f"optimized_s={optimized_swept_s:.1f} vacuum_s={vacuum_s:.1f} "
        f"vacuum_deleted={vacuumed} files={objects} {label}",
        flush=True,
    )
    optimized_against_clean(spark, gen, "gc-optimized-idle")
    times = {1.0: clean_s}
    if scaling:
        for share in (0.25, 0.5):
            root = backend.root.parent / f"scale-{share}"
            with open_backend(root, backend.server) as smaller:
                part = generate(smaller, size.scaled(share))
                times[share] = run_gc(spark, part)[0]
                part.lake.close()
    per_million = {s: t / (objects * s / 1e6) for s, t in sorted(times.items())}
    growth = per_million[1.0] / per_million[min(per_million)]
    print(
        "BENCH gc-scaling ratio="
        f"{growth:.2f} "
        + " ".join(f"s_at_{s:g}={t:.1f}" for s, t in sorted(times.items()))
        + " "
        + " ".join(f"s_per_million_at_{s:g}={v:.1f}" for s, v in per_million.items())
        + f" objects={objects} {label}",
        flush=True,
    )
    gen.lake.close()


if __name__ == "__main__":
    main(sys.argv[1:])
