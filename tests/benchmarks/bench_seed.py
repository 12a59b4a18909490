"""The seed's bottom line (issue 41, item 5): an uncommitted-GC run measured on a Spark
standalone cluster on the selected back end, its per-object cost in each phase, and the
projection of those costs to lakeFS's GC design's large repository.

The module starts a standalone cluster of its own (a master and `--workers` workers of one
core each, as `make stack` runs its worker: pyspark's own `spark-class`, on loopback),
generates `bench_gc`'s namespace at `--objects` (default 1M) in the seed's proportions (a
quarter uncommitted, a twentieth garbage, a commit per ~670 objects, 100 branches, a slice
per 5,000 objects), and times:

- the job's listing alone: `list_slice` of every slice in Spark tasks, as its mark lists
  them (the mark phase holds it; `marking` is the mark phase less this);
- one swept clean run after an untimed dry one: its phases (`prepare` on the driver over the
  staged entries in the KV store; `committed`, the ranges read; `mark`; `gate`; `sweep`,
  the deletes).

- `seed-gc`: the projection of this run to 20M objects, 1K branches, 30K commits, 5M
  uncommitted and 1M stale on 16 executors, against lakeFS's published "about 3 hours" for
  that repository (`ratio` = projected / 3 h). How it is projected is the declaration's
  text, shown beside the figures on the benchmarks page.
- `seed-retention`: the committed part (retention) of a run on the same cluster and server,
  over `bench_gc_retention`'s history (a year of commits rewriting files of a table's date
  partitions, 30 days' retention) in a repository of its own, projected to the seed's 20M
  objects and 30K commits against the same 3 hours.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa

from tests.benchmarks.backends import Backend, open_backend
from tests.benchmarks.bench_gc import Generated, Size, generate, run_gc
from tests.benchmarks.bench_gc_retention import generate as generate_history
from tests.benchmarks.bench_gc_retention import range_sets
from tests.benchmarks.declarations import Benchmark, Suite

SEED = {
    "objects": 20_000_000,
    "branches": 1_000,
    "commits": 30_000,
    "uncommitted": 5_000_000,
    "stale": 1_000_000,
    "executors": 16,
}
SEED_HOURS = 3.0
"""lakeFS's GC design ("Garbage collection of uncommitted objects"): about 3 hours for the
repository of `SEED`."""
OBJECTS_PER_SLICE = 5_000

BENCHMARKS = Suite(
    section="Garbage collection",
    benchmarks=(
        Benchmark(
            "seed-gc",
            measures="a swept uncommitted-GC run on a Spark standalone cluster of 2 one-core "
            "workers (1M objects: a quarter uncommitted, a twentieth garbage), projected to "
            "lakeFS's GC design's 20M objects, 1K branches, 30K commits, 5M uncommitted and 1M "
            "stale on 16 executors. Assumptions: each executor is one core as fast as a "
            "worker here; listing, marking, the committed read, the gate and the sweep run on "
            "the executors and scale linearly (listing, marking and the gate with the objects, "
            "the committed read with the committed entries, the sweep with the objects "
            "deleted) and divide evenly over the executors; prepare, slice planning and the "
            "state writes stay on the driver and scale linearly with the uncommitted entries "
            "(prepare) or the objects; S3 answers each LIST and DeleteObjects as fast as "
            "SeaweedFS on loopback does (a real region's tens of milliseconds per request "
            "overlap across the executors' requests in flight); the run's fixed cost "
            "(session, lease, records) stays as measured. On the embedded back end (local "
            "files) the same projection is a floor, not a promise",
            reference='that design\'s "about 3 hours"',
            target=1,
        ),
        Benchmark(
            "seed-retention",
            measures="the committed part (retention) of a GC run (`--only committed`) on the "
            "same cluster and back end, over a year of commits rewriting files of a table's "
            "date partitions with 30 days' retention (bench_gc_retention's history: "
            "`--history-objects`, "
            "`--history-commits`), projected to the seed's 20M objects and 30K commits on 16 "
            "executors. Assumptions: the commit classes (`retention_input`: the KV's commits, "
            "timed apart from the run on the driver) scale with the commits and stay on the "
            "driver; the rest of the retention phase (the active and expired-only ranges read, "
            "their addresses anti-joined and attributed) scales with the addresses the history "
            "holds (every object a version of a path, as here) and divides evenly over the "
            "executors, each one core as fast as a worker here; `per_range_us` is that rest per "
            "range file read, given for comparison, not projected (range versions per commit "
            "depend on how a commit's changes spread over the paths); the run's fixed cost "
            "stays as measured",
            reference="lakeFS's GC design's \"about 3 hours\" for the same repository",
            target=1,
        ),
    ),
)

LOOPBACK = "127.0.0.1"
READY_SECONDS = 180.0
MASTER_URL = re.compile(r"Starting Spark master at (spark://\S+)")
MASTER_UI = re.compile(r"Successfully started service 'MasterUI' on port (\d+)")


@dataclass(frozen=True)
class Cluster:
    master: str
    cores: int


@contextmanager
def standalone_cluster(scratch: Path, workers: int, memory: str) -> Iterator[Cluster]:
    """A master and `workers` one-core workers on loopback, each in a process group of its
    own, stopped by their pids on the way out. Ports are the daemons' own choice (0): the
    master's log says which it took."""
    from branchwater.engine.cli.gc import spark_home

    home = spark_home()
    if home is None:
        raise SystemExit("pyspark is not installed: the standalone cluster needs spark-class")
    scratch.mkdir(parents=True, exist_ok=True)
    daemons: list[subprocess.Popen[bytes]] = []

    def start(name: str, *args: str) -> None:
        env = {
            **os.environ,
            "SPARK_HOME": home,
            "SPARK_LOCAL_IP": LOOPBACK,
            "SPARK_WORKER_DIR": str(scratch / "work"),
            "PYSPARK_PYTHON": sys.executable,
        }
        with open(scratch / f"{name}.log", "wb") as log:
            daemons.append(
                subprocess.Popen(
                    [str(Path(home) / "bin" / "spark-class"), *args],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    env=env,
                    start_new_session=True,
                )
            )

    def wait(what: str, ready: Any) -> Any:
        deadline = time.monotonic() + READY_SECONDS
        while (value := ready()) is None:
            if time.monotonic() > deadline or any(d.poll() is not None for d in daemons):
                logs = "\n".join(p.read_text()[-2000:] for p in scratch.glob("*.log"))
                raise RuntimeError(f"{what} did not come up:\n{logs}")
            time.sleep(0.5)
        return value

    any_port = ("--port", "0", "--webui-port", "0")
    try:
        start("master", "org.apache.spark.deploy.master.Master", "--host", LOOPBACK, *any_port)

        def address() -> tuple[str, int] | None:
            log = (scratch / "master.log").read_text(errors="replace")
            url, ui = MASTER_URL.search(log), MASTER_UI.search(log)
            return (url[1], int(ui[1])) if url and ui else None

        url, ui = wait("the Spark master", address)
        for number in range(workers):
            start(
                f"worker-{number}",
                "org.apache.spark.deploy.worker.Worker",
                *("--host", LOOPBACK, *any_port, "--cores", "1", "--memory", memory, url),
            )

        def alive() -> int | None:
            try:
                with urllib.request.urlopen(f"http://{LOOPBACK}:{ui}/json/", timeout=2) as page:
                    count = int(json.load(page).get("aliveworkers", 0))
            except OSError:
                return None
            return count if count >= workers else None

        wait("the Spark workers", alive)
        yield Cluster(url, workers)
    finally:
        for daemon in reversed(daemons):
            if daemon.poll() is None:
                os.killpg(daemon.pid, signal.SIGTERM)
                daemon.wait(timeout=60)


def cluster_session(cluster: Cluster, executor_memory: str) -> Any:
    """A driver on the cluster: every core of it, the job's own session settings."""
    os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    os.environ["PYSPARK_PYTHON"] = sys.executable
    from pyspark.sql import SparkSession

    from branchwater.spark_jobs.gc.job import SESSION_CONF

    spark = (
        SparkSession.builder.master(cluster.master)
        .appName("bench_seed")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.cores.max", str(cluster.cores))
        .config("spark.executor.memory", executor_memory)
        .config("spark.driver.memory", "2g")
        .config("spark.sql.shuffle.partitions", str(4 * cluster.cores))
        .config(map=SESSION_CONF)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def seed_size(objects: int) -> Size:
    """`objects` in the seed's proportions; 100 branches (their count costs prepare nothing
    per entry: it scans the staged entries, not the branches)."""
    share = objects / SEED["objects"]
    return Size(
        objects,
        max(4, objects // OBJECTS_PER_SLICE),
        100,
        max(10, round(SEED["commits"] * share)),
        round(SEED["uncommitted"] * share),
        round(SEED["stale"] * share),
    )


def _listed(ns: Any, slices: list[str]) -> Iterator[pa.RecordBatch]:
    from branchwater.spark_jobs.gc.listing import list_slice

    rows = sum(list_slice(ns, name).num_rows for name in slices)
    yield pa.record_batch([pa.array([rows], pa.int64())], names=["rows"])


def listing_seconds(spark: Any, gen: Generated) -> tuple[float, int]:
    """The job's listing alone, as its mark lists (`list_slice` of every slice in Spark
    tasks): seconds and objects listed."""
    from branchwater.engine.gc.runs.storage import Namespace
    from branchwater.spark_jobs.gc.frames import cores, map_shares
    from branchwater.spark_jobs.gc.listing import data_slices

    ns = Namespace.of(gen.repo.storage_namespace, gen.backend.s3_options)
    slices = data_slices(ns)
    started = time.perf_counter()
    frame = map_shares(spark, slices, partial(_listed, ns), "rows long", 2 * cores(spark))
    listed = sum(row.rows for row in frame.collect())
    return time.perf_counter() - started, listed


@dataclass(frozen=True)
class Measured:
    """One swept run's seconds by phase, the listing's, and what each phase is over."""

    run_s: float
    phases: dict[str, float]
    listing_s: float
    size: Size
    deleted: int
    cores: int

    @property
    def committed(self) -> int:
        return self.size.objects - self.size.uncommitted - self.size.garbage

    def parts(self) -> dict[str, tuple[float, float, bool]]:
        """Each projected part: (seconds here, how many times as much in the seed, whether
        it divides over executors)."""
        p, size = self.phases, self.size
        objects = SEED["objects"] / size.objects
        marking = max(0.0, p.get("mark", 0.0) - self.listing_s)
        driver = sum(p.get(k, 0.0) for k in ("slices", "state"))
        fixed = self.run_s - sum(p.values())
        return {
            "prepare": (p.get("prepare", 0.0), SEED["uncommitted"] / size.uncommitted, False),
            "listing": (self.listing_s, objects, True),
            "marking": (marking, objects, True),
            "committed": (
                p.get("committed", 0.0),
                (SEED["objects"] - SEED["uncommitted"] - SEED["stale"]) / self.committed,
                True,
            ),
            "gate": (p.get("gate", 0.0), objects, True),
            "sweep": (p.get("sweep", 0.0), SEED["stale"] / max(1, self.deleted), True),
            "driver": (driver, objects, False),
            "fixed": (max(0.0, fixed), 1.0, False),
        }

    def projected(self) -> dict[str, float]:
        """Each part's projected seconds at the seed's size on its executors."""
        spread = self.cores / SEED["executors"]
        return {
            name: seconds * times * (spread if parallel else 1.0)
            for name, (seconds, times, parallel) in self.parts().items()
        }

    def per_object_us(self) -> dict[str, float]:
        """Microseconds per object each phase costs here, on all the cluster's cores: per
        uncommitted entry (prepare), listed object (listing, marking, gate), committed
        entry, deleted object (sweep)."""
        over = {
            "prepare": self.size.uncommitted,
            "listing": self.size.objects,
            "marking": self.size.objects,
            "committed": self.committed,
            "gate": self.size.objects,
            "sweep": max(1, self.deleted),
        }
        return {name: self.parts()[name][0] / n * 1e6 for name, n in over.items()}


def measure(spark: Any, backend: Backend, size: Size, cores: int) -> Measured:
    started = time.perf_counter()
    gen = generate(backend, size)
    print(f"  generate: {time.perf_counter() - started:.1f} s", flush=True)
    try:
        warm_s, _ = run_gc(spark, gen)
        print(f"  untimed dry run: {warm_s:.1f} s", flush=True)
        listing_s, listed = listing_seconds(spark, gen)
        if listed != size.objects:
            raise AssertionError(f"listed {listed} objects, not the {size.objects} written")
        run_s, summary = run_gc(spark, gen, dry_run=False)
        deleted = summary.volume("deleted").objects
        if deleted != len(gen.garbage):
            raise AssertionError(f"the run deleted {deleted}, not the {len(gen.garbage)} garbage")
        return Measured(run_s, dict(summary.phases), listing_s, size, deleted, cores)
    finally:
        gen.lake.close()


def report(measured: Measured, backend: Backend) -> None:
    projected = measured.projected()
    total = sum(projected.values())
    per_object = {k: round(v, 2) for k, v in measured.per_object_us().items()}
    parts = {k: round(v) for k, v in projected.items()}
    print(
        f"BENCH seed-gc ratio={total / 3600 / SEED_HOURS:.3f} projected_s={total:.0f} "
        f"seed_s={SEED_HOURS * 3600:.0f} run_s={measured.run_s:.1f} "
        f"listing_s={measured.listing_s:.1f} "
        f"per_object_us={json.dumps(per_object, separators=(',', ':'))} "
        f"projected_parts_s={json.dumps(parts, separators=(',', ':'))} "
        f"phases={json.dumps({k: round(v, 2) for k, v in measured.phases.items()})} "
        f"objects={measured.size.objects} uncommitted={measured.size.uncommitted} "
        f"deleted={measured.deleted} commits={measured.size.commits} "
        f"workers={measured.cores} executors={SEED['executors']} {backend.label}",
        flush=True,
    )


@dataclass(frozen=True)
class RetentionMeasured:
    """One committed-part run over a history: its retention phase, the commit classes'
    seconds on the driver, and what they are over."""

    run_s: float
    retention_s: float
    classes_s: float
    commits: int
    addresses: int
    range_files: int
    expired: int
    cores: int

    def projected(self) -> dict[str, float]:
        rest = max(0.0, self.retention_s - self.classes_s)
        return {
            "classes": self.classes_s * SEED["commits"] / self.commits,
            "ranges": rest * SEED["objects"] / self.addresses * self.cores / SEED["executors"],
            "fixed": max(0.0, self.run_s - self.retention_s),
        }

    def per_unit_us(self) -> dict[str, float]:
        rest = max(0.0, self.retention_s - self.classes_s)
        return {
            "per_commit": self.classes_s / self.commits * 1e6,
            "per_range": rest / max(1, self.range_files) * 1e6,
            "per_address": rest / self.addresses * 1e6,
        }


def measure_retention(
    spark: Any, server: Any, scratch: Path, objects: int, commits: int, cores: int
) -> tuple[RetentionMeasured, Backend]:
    """`bench_gc_retention`'s history in a database and bucket of its own on `server`; an
    untimed committed-part run, the commit classes timed alone, then the timed run."""
    from datetime import UTC, datetime

    from branchwater.engine.gc.runs.retention import retention_input
    from branchwater.engine.gc.runs.storage import Namespace

    with open_backend(scratch, server) as backend:
        started = time.perf_counter()
        lake, repo, _ = generate_history(backend, objects, commits, max(1, commits // 30))
        print(f"  history: {time.perf_counter() - started:.1f} s", flush=True)
        try:
            gen = Generated(backend, lake, repo, [], [], [])
            warm_s, _ = run_gc(spark, gen, only="committed")
            print(f"  untimed committed run: {warm_s:.1f} s", flush=True)
            started = time.perf_counter()
            plan = retention_input(lake.graveler, repo.record, datetime.now(UTC))
            classes_s = time.perf_counter() - started
            if plan is None:
                raise AssertionError("the history has no retention rules")
            ns = Namespace.of(repo.storage_namespace, backend.s3_options)
            range_files = sum(map(len, range_sets(ns, repo.committed_layout(), plan).values()))
            run_s, summary = run_gc(spark, gen, only="committed")
            held = objects + max(1, objects // 100)
            return (
                RetentionMeasured(
                    run_s,
                    summary.phases.get("retention", 0.0),
                    classes_s,
                    commits + 1,
                    held,
                    range_files,
                    summary.volume("expired").objects,
                    cores,
                ),
                backend,
            )
        finally:
            lake.close()


def report_retention(measured: RetentionMeasured, backend: Backend) -> None:
    projected = measured.projected()
    total = sum(projected.values())
    units = {k: round(v, 2) for k, v in measured.per_unit_us().items()}
    print(
        f"BENCH seed-retention ratio={total / 3600 / SEED_HOURS:.3f} projected_s={total:.0f} "
        f"seed_s={SEED_HOURS * 3600:.0f} run_s={measured.run_s:.1f} "
        f"retention_s={measured.retention_s:.2f} classes_s={measured.classes_s:.2f} "
        f"cost_us={json.dumps(units, separators=(',', ':'))} "
        f"projected_parts_s={json.dumps({k: round(v) for k, v in projected.items()})} "
        f"addresses={measured.addresses} commits={measured.commits} "
        f"range_files={measured.range_files} expired={measured.expired} "
        f"workers={measured.cores} executors={SEED['executors']} {backend.label}",
        flush=True,
    )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench_seed", description=__doc__)
    parser.add_argument("--objects", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=2, help="one-core cluster workers")
    parser.add_argument("--worker-memory", default="1g")
    parser.add_argument("--history-objects", type=int, default=20_000)
    parser.add_argument("--history-commits", type=int, default=100)
    args, _ = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-seed-") as tmp:
        scratch = Path(tmp)
        with (
            standalone_cluster(scratch / "cluster", args.workers, args.worker_memory) as cluster,
            open_backend(scratch / "lake") as backend,
        ):
            spark = cluster_session(cluster, "768m")
            try:
                measured = measure(spark, backend, seed_size(args.objects), cluster.cores)
                report(measured, backend)
                history, history_backend = measure_retention(
                    spark,
                    backend.server,
                    scratch / "history",
                    args.history_objects,
                    args.history_commits,
                    cluster.cores,
                )
            finally:
                spark.stop()
            report_retention(history, history_backend)


if __name__ == "__main__":
    main(sys.argv[1:])
