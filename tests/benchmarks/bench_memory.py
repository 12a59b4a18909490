"""Peak memory of the engine's bulk operations (issue 41), each run in a fresh process of its
own on the selected back end (`backends`): its peak resident set (`VmHWM`) against its
resident set just before the operation (interpreter, imports, an open lake), and the growth
per entry, which says whether anything holds the whole lake where a stream would do.

- `memory-commit`: a commit of N staged entries (default 1M), the committer's process,
  measured at a quarter of N too: `at_1m_mb` is the peak that gives at 1M entries (the
  issue's target's size; at N = 4M, the quarter's own peak).
- `memory-merge`: a merge into an N-entry `main` of a branch that deleted every tenth
  entry (so every range), `main` having moved too, so every range is merged entry by entry.
- `memory-prepare`: `prepare_uncommitted_for_gc` over N staged entries on 100 branches.
- `memory-gc`: the driver of an uncommitted-GC run (`bench_gc`'s generated namespace at
  `--gc-objects`, default 1M; the issue's target is for 4M) in local Spark: the Python
  driver's peak (`peak_mb`) and, as a figure, the JVM's (`jvm_peak_mb`, its high-water
  mark before it stops), which in local mode holds the executors too and is bounded by
  `spark.driver.memory`, not by the lake. Most of the driver's growth is a fixed cost (the
  first Spark job's Arrow and pandas side, the gate's suites), so the run is measured at a
  quarter of the size too: `marginal_b` is the growth per object between the two,
  `at_4m_mb` the peak that slope gives at 4M objects (the target's size).

`ratio` is peak / before; `per_entry_b` is (peak - before) / N.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from branchwater.engine.graveler.model import encode_entry
from tests.benchmarks.backends import Backend, open_backend
from tests.benchmarks.bench_graveler import bulk_stage, entry
from tests.benchmarks.declarations import Benchmark, Suite

BENCHMARKS = Suite(
    section="Memory",
    about="Each operation runs in a process of its own; its peak resident set is compared "
    "with the same process's just before the operation.",
    benchmarks=(
        Benchmark(
            "memory-commit",
            measures="peak RSS of the process committing 1M staged entries (`at_1m_mb`; "
            "`peak_mb` at the run's size)",
            reference="its RSS before the commit (`per_entry_b`: growth per entry)",
            limits={"at_1m_mb": 500},
        ),
        Benchmark(
            "memory-merge",
            measures="peak RSS of a merge of 100k deletes spread over a 1M-entry branch "
            "that moved too",
            reference="its RSS before the merge",
        ),
        Benchmark(
            "memory-prepare",
            measures="peak RSS of `prepare_uncommitted_for_gc` over 1M staged entries on "
            "100 branches",
            reference="its RSS before the run",
        ),
        Benchmark(
            "memory-gc",
            measures="peak RSS of an uncommitted-GC run's Python driver, local Spark "
            "(`jvm_peak_mb`: the JVM, executors included)",
            reference="its RSS with the Spark session started, before the run (`at_4m_mb`: "
            "the peak at 4M objects)",
            limits={"at_4m_mb": 1024},
        ),
    ),
)

MB = 2**20
BRANCHES = 100
TARGET_SIZES = {"commit": 1_000_000, "gc": 4_000_000}
"""The sizes the issue's targets are for: each such operation is measured at a quarter of
the run's size too, and the peak at its target's size read off the two."""
REPO = "bench"
Operation = Callable[[], dict[str, Any]]
"""The measured operation; returns extra figures for the line."""


@dataclass(frozen=True)
class Peak:
    before: int
    peak: int
    figures: dict[str, Any] = field(default_factory=dict)


def resident() -> int:
    """This process's resident set now, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def high_water(pid: int) -> int:
    """A live process's peak resident set (`VmHWM`), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def _measure(open_operation: Callable[..., Operation], *args: Any) -> Peak:
    """In the child: open the operation (connect), then run it between the two readings.
    The peak is `VmHWM`, not `ru_maxrss`: Linux carries the latter across the spawn's exec,
    so a child would report at least its parent's size when it was started."""
    operation = open_operation(*args)
    before = resident()
    figures = operation()
    return Peak(before, high_water(os.getpid()), figures)


def in_child(open_operation: Callable[..., Operation], *args: Any) -> Peak:
    """`_measure` in a fresh spawned process, so nothing of this one's memory counts."""
    with mp.get_context("spawn").Pool(1) as pool:
        return pool.apply(_measure, (open_operation, *args))


def report(name: str, peak: Peak, entries: int, backend: Backend) -> None:
    extra = " ".join(f"{k}={v}" for k, v in peak.figures.items())
    print(
        f"BENCH {name} ratio={peak.peak / peak.before:.2f} peak_mb={peak.peak / MB:.0f} "
        f"before_mb={peak.before / MB:.0f} "
        f"per_entry_b={(peak.peak - peak.before) / entries:.0f} entries={entries} "
        f"{extra} {backend.label}".replace("  ", " "),
        flush=True,
    )


# The operations, opened in the child ----------------------------------------------------


def open_commit(backend: Backend, repo: str) -> Operation:
    lake = backend.connect(range_cache_dir=backend.root / "range-cache")
    branch = lake.repository(repo).branch("main")

    def commit() -> dict[str, Any]:
        branch.commit("memory")
        return {}

    return commit


def open_merge(backend: Backend, repo: str) -> Operation:
    lake = backend.connect(range_cache_dir=backend.root / "range-cache")
    repository = lake.repository(repo)

    def merge() -> dict[str, Any]:
        repository.merge("feature", into="main", message="memory")
        return {}

    return merge


def open_prepare(backend: Backend, repo: str) -> Operation:
    lake = backend.connect(range_cache_dir=backend.root / "range-cache")
    repository = lake.repository(repo)

    def prepare() -> dict[str, Any]:
        repository.prepare_uncommitted_for_gc()
        return {}

    return prepare


def open_gc(backend: Backend, repo: str) -> Operation:
    from branchwater.engine.gc.runs.config import JobConfig
    from branchwater.spark_jobs.gc.job import GCJob
    from tests.benchmarks.bench_gc import spark_session

    spark = spark_session()
    config = JobConfig(
        backend.kv_url,
        repo,
        min_age=timedelta(0),
        max_share=1.0,
        dry_run=True,
        s3_options=backend.s3_options,
    )
    jvm = spark.sparkContext._gateway.proc.pid  # type: ignore[attr-defined]

    def run() -> dict[str, Any]:
        GCJob(spark, config).run()
        return {"jvm_peak_mb": round(high_water(jvm) / MB)}

    return run


# Set-up, in this process ------------------------------------------------------------------


def setup_commit(backend: Backend, entries: int) -> str:
    with backend.connect() as lake:
        repo = lake.create_repository("commit", storage_namespace=backend.namespace("commit"))
        bulk_stage(backend, lake.graveler.read_branch(repo.record, "main").staging_token, entries)
    return "commit"


def setup_merge(backend: Backend, entries: int) -> str:
    """`main` of `entries` entries; `feature` rewrote every tenth entry, `main` one more."""
    with backend.connect(range_cache_dir=backend.root / "range-cache") as lake:
        repo = lake.create_repository("merge", storage_namespace=backend.namespace("merge"))
        g = lake.graveler
        bulk_stage(backend, g.read_branch(repo.record, "main").staging_token, entries)
        repo.branch("main").commit("base")
        feature = repo.create_branch("feature", source="main")
        token = g.read_branch(repo.record, "feature").staging_token
        backend.stage_rows(
            (token.encode(), e.path.encode(), b"")
            for e in (entry(i) for i in range(0, entries, 10))
        )
        backend.checkpoint()
        feature.commit("a tenth deleted")
        repo.branch("main").upload(entry(5).path, b"main moved")
        repo.branch("main").commit("main moves on")
    return "merge"


def setup_prepare(backend: Backend, entries: int) -> str:
    with backend.connect() as lake:
        repo = lake.create_repository("prepare", storage_namespace=backend.namespace("prepare"))
        for b in range(1, BRANCHES):
            repo.create_branch(f"branch-{b:03d}")
        tokens = [b.staging_token for b in lake.graveler.refs.branches(repo.record)]
        backend.stage_rows(
            (tokens[i % len(tokens)].encode(), e.path.encode(), encode_entry(e))
            for i, e in ((i, entry(i)) for i in range(entries))
        )
        backend.checkpoint()
    return "prepare"


def setup_gc(backend: Backend, objects: int) -> str:
    from tests.benchmarks.bench_gc import Size, generate

    size = Size(1_000_000, 200, 100, 1000, 100_000, 50_000).scaled(objects / 1_000_000)
    generate(backend, size).lake.close()
    return "bench"


OPERATIONS: dict[str, tuple[Callable[[Backend, int], str], Callable[..., Operation]]] = {
    "commit": (setup_commit, open_commit),
    "merge": (setup_merge, open_merge),
    "prepare": (setup_prepare, open_prepare),
    "gc": (setup_gc, open_gc),
}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench_memory", description=__doc__)
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--gc-objects", type=int, default=1_000_000)
    parser.add_argument("--operations", default=",".join(OPERATIONS), help="comma-separated")
    args, _ = parser.parse_known_args(argv)
    for name in filter(None, args.operations.split(",")):
        setup, open_operation = OPERATIONS[name]
        size = args.gc_objects if name == "gc" else args.entries
        with tempfile.TemporaryDirectory() as tmp, open_backend(Path(tmp)) as backend:
            repo = setup(backend, size)
            peak = in_child(open_operation, backend, repo)
        if name in TARGET_SIZES:
            peak = with_slope(peak, size, TARGET_SIZES[name], setup, open_operation)
        report(f"memory-{name}", peak, size, backend)


def with_slope(
    peak: Peak, size: int, at: int, setup: Callable[[Backend, int], str], open_operation: Any
) -> Peak:
    """`peak` with the growth per entry between a run at a quarter of `size` and it, and
    the peak that slope gives at `at` entries (`at_<n>m_mb`)."""
    quarter = size // 4
    with tempfile.TemporaryDirectory() as tmp, open_backend(Path(tmp)) as backend:
        small = in_child(open_operation, backend, setup(backend, quarter))
    slope = (peak.peak - small.peak) / (size - quarter)
    figures = {
        **peak.figures,
        "quarter_peak_mb": round(small.peak / MB),
        "marginal_b": round(slope),
        f"at_{at // 1_000_000}m_mb": round((peak.peak + slope * (at - size)) / MB),
    }
    return Peak(peak.before, peak.peak, figures)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
