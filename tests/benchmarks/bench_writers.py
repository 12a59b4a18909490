"""Many writers at once (issue 41): staged writes from N writers against N raw upsert loops,
and N processes merging into one branch, on the selected back end (`backends`; the stack's
PostgreSQL is the case the issue asks about).

- `writers-<layout>-<n>`: n writers stage entries (`writes.stage_entry`, what every write
  path ends in: the first, cached, read of the branch, then the staged row and its read of
  the branch in one statement), each on a branch of its own (`branches`) or all on `main`
  (`branch`), committing their branch every `--every` of their writes (200: commit-heavy),
  against n writers each looping our driver's upsert (`INSERT … ON CONFLICT … DO UPDATE`) on
  a second cursor of a connection from the store's own pool, as `bench_kv` does: one
  connection per writer on both sides, the same table, keys and values of the same size. The
  sides alternate in windows of `--seconds` for `--rounds` rounds on the same processes, so
  the machine's load falls on both alike. A write counts if acknowledged by its window's
  deadline; writers go on uncounted for `GRACE_S`, so no window ends draining, and count
  their writes to the next commit across windows, so each window pays its share of commits.
  `ratio` is the floor's writes per second over ours (lower is better; the issue's "ours at
  least 0.7 of the floor" is `ratio ≤ 1.43`, `share` is ours / floor); beside it both rates,
  p50/p99 latencies, the commits made, `empty_commits` (nothing left to commit: another
  writer's commit took their writes), `retries` (a commit sealed the token under a write) and
  `gave_up` (writes that exhausted the retry policy, called again). Each shape has a
  repository of its own, every commit appending to its branch. Past `--max-processes`,
  writers are threads spread over that many processes (64 as 16 processes of 4 threads by
  default: a process per writer costs far more memory, and each writer holds one of
  PostgreSQL's default 100 connections).
- `writers-<layout>-16-every-<k>` (`--sparser`): the same at 16 writers committing every k
  of their writes; with `writers-<layout>-16` and `writers-staged-16`, throughput against
  the commit rate.
- `writers-staged-<n>` (`--staged`): the same with n writers on branches of their own that
  never commit: the staged writes alone.
- `writers-cpu-staged`, `writers-cpu-every-<k>`: one writer alone, staging on a new branch
  each round and committing every k of its writes (`CPU_EVERY`), against one floor loop:
  the CPU per acknowledged write of the processes serving it (`writer`: this process and
  its threads; `db`: PostgreSQL's processes, none for SQLite; `s3`: the S3 server's),
  read from `/proc`. With the cores the limit, the throughput rows' `share` cannot be better
  than the inverse of these ratios (rows of many writers pay more: contention, retries,
  waits); what commits add per write, by process, is a row's figures less the staged row's.
- `writers-merge-<n>`: `bench_merge`'s contended merge (the destination moved in the ranges
  the features touch) with n processes at once, running free: wall time, attempts and ranges
  built, against the naive retry that redoes the merge from the merge base. A contender that
  exhausts the retry policy (`gave_up`) calls again, as a caller would: with the
  `MergeRaceLost` hint, or the naive one from scratch; its attempts count the policy's.

Where the time goes (PostgreSQL, 2 cores): with many writers the CPU, shared by the writers
and the server, is the limit. A staged write is one statement like the floor's upsert, plus
a read of the branch record and two locks (`postgres._fair_statements`); the read goes to the
record's partition, since a prepared read through the partitioned table first locks every
partition, which would cost more than the rest of those additions. On the client a write
costs about what the floor's does (the same prepared statement on libpq, plus the entry's
checks and the validated write's bookkeeping).

Commits are what the floor never does: the writer's work (the commit's statements and the
apply, then the branch's open last range hashed, encoded and stored again with one
conditional PUT, and the metarange likewise), the database's (a dozen statements, the sealed
token's rows deleted) and the S3 server's (two PUTs), most of it a fixed part whatever the
size of that range. At a commit every 200 writes that fixed part still weighs on each write;
the sparser the commits, the more each entry's own share counts (its staged row read and
deleted, its place in the rewritten range). The `writers-cpu-*` rows measure it, by process,
with one writer alone: where such a row's ratio is above the 1.43 the target allows, the
many-writers row at that interval cannot reach 0.7 of the floor on a machine whose cores
serve the writers, the database and the S3 server alike, however the work is scheduled.

On one branch the commits meet (16 writers committing every 200 of their writes call commit
every 12 writes or so): a commit that finds another's seal under way waits for it, and the
waiters commit as one, so most calls find their writes recorded by another's commit
(`empty_commits`). Each seal makes the writes in flight whose cached read of the branch
predates it write again to the new token (`retries`): a seal waits for the writes in flight
to commit, then holds the next ones off (`postgres._fair_statements`); a commit's final swap
keeps the token and passes the writes. Each commit there also rewrites a range for every
writer whose paths grew: a writer's paths follow its own prefix, so its new entries fall
inside the range holding that prefix's end, written whole again (the new entries go in as a
block, `writer._merged`, not by a sort of the range). Left is the wait: a writer is blocked
in its commit call until a commit holding its writes lands, which takes far longer than a
write when that many writers share the cores (`commit_s` per commit made), while the floor's
writers never stop; where the server's WAL flushes bound the rate, fewer writers writing is
fewer writes. At 64 writers a write can find its token sealed at every one of its ten tries
(`gave_up`).

Merges into one branch land one at a time: each needs an attempt made on the HEAD the last
one left, and every attempt under way when another lands is lost. A reusing retry builds no
range that no other contender changed (`ranges_built` against the naive retry's one per
attempt) and reads none of those they changed (their key bounds show they cannot meet its
own), but with ranges of 4,000 entries building one is a small part of an attempt: a quiet
retry's metarange PUT, diff against the attempt and commit record remain, and n contenders
sharing two cores stretch an attempt to about n/2 times its CPU. Merges land about one per
such attempt, and at 32 contenders many exhaust the retry policy's ten attempts at least
once (`gave_up`) and call again with their hint. Where ranges are large (`bench_merge`'s 1M
entries), the reuse is most of the difference.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from branchwater.engine.api import Lake
from branchwater.engine.errors import MergeRaceLost, NoChanges, TooManyTries
from branchwater.engine.graveler import merge as merge_ops
from branchwater.engine.graveler import writes
from branchwater.engine.graveler.committed.format import RangePolicy
from branchwater.engine.graveler.model import Entry, encode_entry
from branchwater.engine.kv.sql import SQLStore
from tests.benchmarks import bench_merge
from tests.benchmarks.backends import Backend, open_backend
from tests.benchmarks.declarations import Benchmark, Suite

LAYOUTS = {"branches": "each on a branch of its own", "branch": "all on one branch"}
WRITERS = (1, 4, 16, 64)
EVERY = 200
"""Writes per commit per writer of the `writers-<layout>-<n>` rows: commit-heavy, so the rows
show what commits cost as writers are added."""
SPARSER = (1_000,)
"""Commit intervals also measured at `TARGETED` writers (`writers-<layout>-<n>-every-<k>`):
with the staged writes alone, the curve of throughput against commit rate."""
STAGED = (16,)
"""Writer counts also measured never committing (`writers-staged-<n>`, each on a branch of
its own): the staged writes alone."""
TARGETED = 16
CPU_EVERY = (0, EVERY, *SPARSER)
"""Commit intervals whose CPU per write is measured (`writers-cpu-*`; 0: never committing)."""
MERGERS = (8, 32)
TARGET_RATIO = round(1 / 0.7, 2)
"""The issue's target, ours ≥ 0.7 of the floor's throughput, as floor / ours, for every row
of `TARGETED` writers."""


def cpu_name(every: int) -> str:
    return f"writers-cpu-every-{every}" if every else "writers-cpu-staged"


def writers_name(layout: str, writers: int, every: int) -> str:
    """A writers row's name: the layout (`staged` for writers that never commit), the writer
    count, and the commit interval where it is not `EVERY`."""
    if not every:
        return f"writers-staged-{writers}"
    return f"writers-{layout}-{writers}" + (f"-every-{every}" if every != EVERY else "")


BENCHMARKS = Suite(
    section="Many writers",
    about=f"Writers stage new entries (a path each) and commit every {EVERY} of their writes "
    "unless the name says otherwise; the floor's writers upsert the same rows with the driver "
    "alone. The merges are `bench_merge`'s contended merge into 200k entries in ranges of "
    "about 4,000, one range touched per process.",
    benchmarks=(
        *(
            Benchmark(
                writers_name(layout, n, EVERY),
                measures=f"staged writes per second of {n} writer{'s' * (n > 1)} {where}",
                reference=f"{n} raw `INSERT … ON CONFLICT` loop{'s' * (n > 1)} of the "
                "driver on the same table (ratio = floor / ours)",
                target=TARGET_RATIO if n == TARGETED else None,
            )
            for layout, where in LAYOUTS.items()
            for n in WRITERS
        ),
        *(
            Benchmark(
                writers_name(layout, TARGETED, every),
                measures=f"staged writes per second of {TARGETED} writers {where}, each "
                f"committing every {every:,} of its writes",
                reference=f"{TARGETED} raw `INSERT … ON CONFLICT` loops of the driver on the "
                "same table (ratio = floor / ours)",
                target=TARGET_RATIO,
            )
            for layout, where in LAYOUTS.items()
            for every in SPARSER
        ),
        *(
            Benchmark(
                writers_name("branches", n, 0),
                measures=f"staged writes per second of {n} writers each on a branch of its "
                "own, never committing",
                reference=f"{n} raw `INSERT … ON CONFLICT` loops of the driver on the same "
                "table (ratio = floor / ours)",
                target=TARGET_RATIO,
            )
            for n in STAGED
        ),
        *(
            Benchmark(
                cpu_name(every),
                measures="CPU per acknowledged write of one writer alone staging "
                + (f"and committing every {every:,} of its writes" if every else "only")
                + ": its own (`writer`), the database's (`db`) and the S3 server's (`s3`)",
                reference="the same per write of one raw `INSERT … ON CONFLICT` loop of the "
                "driver on the same table",
            )
            for every in CPU_EVERY
        ),
        *(
            Benchmark(
                f"writers-merge-{n}",
                measures=f"{n} processes merging into one branch at once, retries reusing "
                "their lost attempt's ranges",
                reference="the naive retry from the merge base",
            )
            for n in MERGERS
        ),
    ),
)

MERGE_RANGES = RangePolicy(target_entries=4_000)
"""Ranges of about 4,000 entries, so 200k entries make the ~50 ranges 32 contenders each
touch one of."""


def merge_lake(backend: Backend, cache: str) -> Lake:
    """A lake writing ranges by `MERGE_RANGES` for every step of the merges: under the default
    policy the destination's own commit joins its small ranges, and contenders whose changes
    then share a range rebuild it on every retry, reuse or not."""
    return bench_merge.connect(backend, cache, range_policy=MERGE_RANGES)


OURS, FLOOR = "ours", "floor"
MTIME = datetime(2026, 11, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Plan:
    """One measurement's shape: `writers` writers as `processes` of `threads` threads each."""

    layout: str
    writers: int
    processes: int
    threads: int
    every: int
    seconds: float

    def branch(self, writer: int) -> str:
        return "main" if self.layout == "branch" else f"w{writer}"

    @property
    def name(self) -> str:
        return writers_name(self.layout, self.writers, self.every)


@dataclass
class Window:
    """What one writer did in one window."""

    writes: int = 0
    latencies: list[float] = field(default_factory=list)
    commits: int = 0
    empty_commits: int = 0
    commit_s: float = 0.0
    retries: int = 0
    gave_up: int = 0
    """Writes that exhausted the retry policy (`TooManyTries`: commits sealed the token
    under every attempt), each called again as a caller would; its latency counts to the
    acknowledgement."""
    pending: dict[int, int] = field(default_factory=dict)
    """Each writer's writes since its last commit when the window ended: its next window
    commits after `every` writes counted from there, not from its own start."""

    def add(self, other: Window) -> None:
        self.writes += other.writes
        self.latencies += other.latencies
        self.commits += other.commits
        self.empty_commits += other.empty_commits
        self.commit_s += other.commit_s
        self.retries += other.retries
        self.gave_up += other.gave_up
        self.pending.update(other.pending)


def entry(writer: int, i: int) -> Entry:
    """The `i`th entry of a writer: its paths follow the ones it wrote before, so each commit
    appends to its branch, as a lake's new partitions do."""
    path = f"w{writer:02d}/part-{i:09d}.parquet"
    return Entry(path, f"data/w/{writer:02d}{i:030x}", 1024, "0" * 32, MTIME)


# In each worker process: its lake, opened once for every window ---------------------------

_LAKE: Lake | None = None
WINDOW_PATHS = 1_000_000
"""Path numbers each window has to itself (a writer writes far fewer in one): window k's
writers number their paths from k times this, so every window writes new paths whichever
pool process runs which writer (a count kept per process repeated other processes' paths,
and the commits after them found nothing to commit)."""


def lake_of(backend: Backend) -> Lake:
    global _LAKE
    if _LAKE is None:
        _LAKE = backend.connect(range_cache_dir=backend.root / "range-cache")
    return _LAKE


GRACE_S = 1.0
"""How long writers go on after a window's deadline, uncounted: a write counts if it is
acknowledged by the deadline, and until then every writer is busy, none draining. A commit
under way at the deadline holds its writer's next writes past it, as it would in steady
state, and its cost is not left out of the window."""


def write_window(
    backend: Backend,
    plan: Plan,
    side: str,
    writer: int,
    window_no: int,
    deadline: float,
    pending: int,
) -> Window:
    """One writer's loop: the writes acknowledged by `deadline` count, and it goes on for
    `GRACE_S` more. `pending` is its writes since its last commit, from its last window."""
    lake = lake_of(backend)
    window = Window()
    i = window_no * WINDOW_PATHS
    stop = deadline + GRACE_S
    if side == OURS:
        g = lake.graveler
        repo = lake.repository(plan.name)
        record, name = repo.record, plan.branch(writer)
        stages = _Stages.of(g)
        while (began := time.perf_counter()) < stop:
            stages.here.count = 0
            gave_up = 0
            while True:
                try:
                    writes.stage_entry(g, record, name, entry(writer, i))
                    break
                except TooManyTries:
                    gave_up += 1
            acknowledged = time.perf_counter()
            i += 1
            pending += 1
            if acknowledged <= deadline:
                window.writes += 1
                window.latencies.append(acknowledged - began)
                window.retries += max(0, stages.here.count - 1)
                window.gave_up += gave_up
            if plan.every and pending >= plan.every:
                pending = 0
                began = time.perf_counter()
                counted = int(began <= deadline)
                try:
                    repo.branch(name).commit(f"writer {writer} at {i}")
                    window.commits += counted
                except NoChanges:
                    window.empty_commits += counted
                window.commit_s += counted * (time.perf_counter() - began)
        window.pending[writer] = pending
    else:
        store = lake.graveler.kv
        assert isinstance(store, SQLStore)
        sql = store._sql.set
        conn = store._take()
        cursor = conn.dbapi.cursor()
        partition = f"floor/{plan.name}/{writer}".encode()
        try:
            while (began := time.perf_counter()) < stop:
                e = entry(writer, i)
                cursor.execute(sql, (partition, e.path.encode(), encode_entry(e)))
                acknowledged = time.perf_counter()
                i += 1
                if acknowledged <= deadline:
                    window.writes += 1
                    window.latencies.append(acknowledged - began)
        finally:
            store._give(conn)
    return window


class _Stages:
    """Counts the graveler's staged rows per thread (`Graveler.stage`, the row and its read
    of the branch): a staged write makes one, each more is a retry after a commit sealed the
    token it wrote to."""

    _installed: dict[int, _Stages] = {}

    def __init__(self, g: Any) -> None:
        self.here = threading.local()
        stage = g.stage

        def counted(*args: Any) -> Any:
            self.here.count = getattr(self.here, "count", 0) + 1
            return stage(*args)

        g.stage = counted

    @classmethod
    def of(cls, g: Any) -> _Stages:
        if id(g) not in cls._installed:
            cls._installed[id(g)] = cls(g)
        return cls._installed[id(g)]


def run_window(
    backend: Backend,
    plan: Plan,
    side: str,
    window_no: int,
    slot: int,
    start: Any,
    pending: dict[int, int],
) -> Window:
    """One process's writers (threads) for one window, started with every other process's;
    `pending` is each writer's writes since its last commit."""
    lake_of(backend)
    start.wait(120)
    deadline = time.perf_counter() + plan.seconds
    results: list[Window] = [Window() for _ in range(plan.threads)]

    def one(t: int) -> None:
        writer = slot * plan.threads + t
        results[t] = write_window(
            backend, plan, side, writer, window_no, deadline, pending.get(writer, 0)
        )

    threads = [threading.Thread(target=one, args=(t,)) for t in range(plan.threads)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    total = Window()
    for result in results:
        total.add(result)
    return total


def setup_branches(backend: Backend, plan: Plan) -> None:
    """A repository of the plan's own, so what it measures does not depend on the plans run
    before it, and its writers' branches."""
    with backend.connect() as lake:
        repo = lake.create_repository(plan.name, storage_namespace=backend.namespace(plan.name))
        for writer in range(plan.writers):
            if plan.branch(writer) != repo.default_branch:
                repo.create_branch(plan.branch(writer), source="main")


def measure_writers(backend: Backend, plan: Plan, rounds: int) -> dict[str, Window]:
    setup_branches(backend, plan)
    totals = {OURS: Window(), FLOOR: Window()}
    pending: dict[int, int] = {}
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager, ctx.Pool(plan.processes) as pool:
        start = manager.Barrier(plan.processes)
        for round_ in range(rounds + 1):
            order = (OURS, FLOOR) if round_ % 2 == 0 else (FLOOR, OURS)
            for window_no, side in enumerate(order, 2 * round_):
                args = (backend, plan, side, window_no)
                jobs = [
                    pool.apply_async(run_window, (*args, slot, start, pending))
                    for slot in range(plan.processes)
                ]
                windows = [job.get(plan.seconds * 20 + 300) for job in jobs]
                for window in windows:
                    pending.update(window.pending)
                    if round_:
                        totals[side].add(window)
    return totals


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else 0.0


def report_writers(plan: Plan, totals: dict[str, Window], rounds: int, backend: Backend) -> None:
    ours, floor = totals[OURS], totals[FLOOR]
    measured_s = plan.seconds * rounds
    ours_rate, floor_rate = ours.writes / measured_s, floor.writes / measured_s
    shape = f"{plan.processes}x{plan.threads}"
    print(
        f"BENCH {plan.name} ratio={floor_rate / ours_rate:.2f} "
        f"share={ours_rate / floor_rate:.2f} writes_per_s={ours_rate:,.0f} "
        f"floor_writes_per_s={floor_rate:,.0f} "
        f"p50_ms={statistics.median(ours.latencies) * 1e3:.2f} "
        f"p99_ms={percentile(ours.latencies, 0.99) * 1e3:.2f} "
        f"floor_p50_ms={statistics.median(floor.latencies) * 1e3:.2f} "
        f"floor_p99_ms={percentile(floor.latencies, 0.99) * 1e3:.2f} "
        f"commits={ours.commits} commit_s={ours.commit_s / max(1, ours.commits):.2f} "
        f"empty_commits={ours.empty_commits} retries={ours.retries} gave_up={ours.gave_up} "
        f"processes={shape} every={plan.every} seconds={plan.seconds:g} {backend.label}",
        flush=True,
    )


PROCESS_GROUPS = {"postgres": "db", "weed": "s3"}
"""Process names (`/proc/<pid>/comm`) whose CPU a `writers-cpu-*` row charges to the
database and to the S3 server; this process's is the writer's."""
CPU_GROUPS = ("writer", "db", "s3")


def serving_processes() -> dict[str, str]:
    """The group of each process that serves the writer now (`/proc/<pid>`): itself, the
    database's processes and the S3 server's. Taken once the writer's connections are open,
    so the CPU of processes that start later (an autovacuum worker, another program) is
    not charged to either side."""
    own = str(os.getpid())
    found = {f"/proc/{own}": "writer"}
    for proc in os.scandir("/proc"):
        if proc.name.isdigit() and proc.name != own:
            try:
                comm = Path(proc.path, "comm").read_text().strip()
            except OSError:
                continue
            if comm in PROCESS_GROUPS:
                found[proc.path] = PROCESS_GROUPS[comm]
    return found


def cpu_by_group(processes: dict[str, str]) -> Counter[str]:
    """CPU seconds used so far by each group's processes (`serving_processes`); a process
    that ended counts nothing."""
    tick = os.sysconf("SC_CLK_TCK")
    used: Counter[str] = Counter()
    for path, group in processes.items():
        try:
            stat = Path(path, "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        used[group] += (int(stat[11]) + int(stat[12])) / tick
    return used


def cpu_of(run: Callable[[], None], processes: dict[str, str]) -> Counter[str]:
    """The CPU seconds by group while `run` runs, and until the writer's background work
    it started (the dropped staging's cleanup) is done."""
    before = cpu_by_group(processes)
    run()
    time.sleep(CPU_SETTLE_S)
    after = cpu_by_group(processes)
    return Counter({group: after[group] - before[group] for group in CPU_GROUPS})


CPU_SETTLE_S = 0.2
"""Left for a last commit's background cleanup before the CPU is read; the floor's side
waits as long, so the machine's idle load falls on both."""


def bench_cpu(backend: Backend, count: int, rounds: int) -> None:
    """One writer, alone on the machine, staging `count` writes in each round on a new branch
    for each of `CPU_EVERY` (committing every so many, so the branch grows as the throughput
    rows' do), alternating with the floor's upserts after a round that warms every side up;
    each `writers-cpu-*` line compares the CPU per acknowledged write of the processes
    serving the writer, split by process. What commits cost a write is its row's figures
    less the never committing row's."""
    name = "writers-cpu"
    with backend.connect(range_cache_dir=backend.root / "range-cache") as lake:
        repo = lake.create_repository(name, storage_namespace=backend.namespace(name))
        g, record = lake.graveler, repo.record
        store = g.kv
        assert isinstance(store, SQLStore)
        conn = store._take()
        cursor = conn.dbapi.cursor()

        def ours(every: int, round_: int) -> Callable[[], None]:
            branch = repo.create_branch(f"e{every}-{round_}", source="main")

            def run() -> None:
                for i in range(count):
                    writes.stage_entry(g, record, branch.name, entry(every, i))
                    if every and (i + 1) % every == 0:
                        branch.commit(f"at {i + 1}")

            return run

        def floor(round_: int) -> Callable[[], None]:
            partition = f"floor/{name}/{round_}".encode()

            def run() -> None:
                for i in range(count):
                    e = entry(0, i)
                    cursor.execute(store._sql.set, (partition, e.path.encode(), encode_entry(e)))

            return run

        sides: list[int | str] = [*CPU_EVERY, FLOOR]
        used = {side: Counter[str]() for side in sides}
        processes: dict[str, str] = {}
        try:
            for round_ in range(rounds + 1):
                order = sides if round_ % 2 == 0 else sides[::-1]
                for side in order:
                    run = floor(round_) if side == FLOOR else ours(int(side), round_)
                    spent = cpu_of(run, processes)
                    if round_:
                        used[side].update(spent)
                processes = processes or serving_processes()
        finally:
            store._give(conn)
    measured = count * rounds
    per_write = {side: sum(used[side].values()) / measured for side in sides}

    def split(side: int | str, prefix: str = "") -> str:
        return " ".join(
            f"{prefix}{group}_ms={used[side][group] / measured * 1e3:.3f}" for group in CPU_GROUPS
        )

    for every in CPU_EVERY:
        print(
            f"BENCH {cpu_name(every)} ratio={per_write[every] / per_write[FLOOR]:.2f} "
            f"cpu_ms={per_write[every] * 1e3:.3f} floor_cpu_ms={per_write[FLOOR] * 1e3:.3f} "
            f"{split(every)} {split(FLOOR, 'floor_')} writes={measured} every={every} "
            f"{backend.label}",
            flush=True,
        )


GIVE_UPS = 10
"""Times a contender may exhaust its retry policy before the benchmark fails."""


def _contender(
    backend: Backend, cache: str, name: str, source: str, destination: str, reuse: bool, start: Any
) -> tuple[int, int, int, float, float]:
    """One merge, called again as a caller would when it gives up (`MergeRaceLost`: again
    with its hint; the naive one from scratch): (attempts, ranges built, give-ups, start,
    end)."""
    with merge_lake(backend, cache) as lake:
        repo = lake.repository(name)
        storage = lake.graveler.committed(repo.record).storage
        built = [0]
        put_range = storage.put_range

        def counting_put_range(table: Any) -> tuple[str, bool]:
            built[0] += 1
            return put_range(table)

        storage.put_range = counting_put_range  # type: ignore[method-assign]
        bench_merge.warm_up()
        start.wait(120)
        started = time.time()
        attempts, gave_up, hint = 0, 0, None
        while True:
            try:
                if reuse:
                    merged = merge_ops.merge(
                        lake.graveler, repo.record, source, destination, hint=hint
                    )
                    attempts += merged.attempts
                else:
                    attempts += bench_merge.naive_merge(lake, repo, source, destination)
                return attempts, built[0], gave_up, started, time.time()
            except TooManyTries as exc:
                attempts += lake.graveler.retry.attempts
                gave_up += 1
                hint = exc.hint if isinstance(exc, MergeRaceLost) else None
                if gave_up >= GIVE_UPS:
                    raise RuntimeError(f"{source}: gave up {gave_up} times") from None


def contend(
    backend: Backend, cache: str, name: str, label: str, destination: str, reuse: bool, n: int
) -> tuple[bench_merge.Tally, int]:
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager, ctx.Pool(n) as pool:
        start = manager.Barrier(n)
        jobs = [
            pool.apply_async(
                _contender, (backend, cache, name, f"{label}-f{i}", destination, reuse, start)
            )
            for i in range(n)
        ]
        results = [job.get(1800) for job in jobs]
    tally = bench_merge.Tally(
        attempts=sum(r[0] for r in results),
        built=sum(r[1] for r in results),
        wall_s=max(r[4] for r in results) - min(r[3] for r in results),
    )
    return tally, sum(r[2] for r in results)


def bench_merges(backend: Backend, processes: int, entries: int, rounds: int) -> None:
    """`bench_merge`'s free-running contended merge with `processes` contenders."""
    cache = str(backend.root / "range-cache")
    tallies = {mode: bench_merge.Tally() for mode in bench_merge.MODES}
    gave_up = {mode: 0 for mode in bench_merge.MODES}
    with merge_lake(backend, cache) as lake:
        for mode in bench_merge.MODES:
            if mode not in {r.name for r in lake.repositories()}:
                bench_merge.create_repository(lake, backend, mode, entries)
    for round_ in range(rounds):
        order = bench_merge.MODES if round_ % 2 == 0 else bench_merge.MODES[::-1]
        for mode in order:
            label = f"m{processes}-{round_}"
            with merge_lake(backend, cache) as lake:
                destination = bench_merge.prepare_round(
                    lake.repository(mode), label, 1, True, features=processes
                )
            tally, gave = contend(
                backend, cache, mode, label, destination, mode == "reuse", processes
            )
            tallies[mode].add(tally)
            gave_up[mode] += gave
    reuse, naive = tallies["reuse"], tallies["naive"]
    print(
        f"BENCH writers-merge-{processes} ratio={reuse.wall_s / naive.wall_s:.2f} "
        f"wall_s={reuse.wall_s:.2f} naive_wall_s={naive.wall_s:.2f} "
        f"attempts={reuse.attempts} naive_attempts={naive.attempts} "
        f"ranges_built={reuse.built} naive_ranges_built={naive.built} "
        f"gave_up={gave_up['reuse']} naive_gave_up={gave_up['naive']} "
        f"rounds={rounds} entries={entries} {backend.label}",
        flush=True,
    )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench_writers", description=__doc__)
    parser.add_argument("--writers", default=",".join(map(str, WRITERS)))
    parser.add_argument("--layouts", default=",".join(LAYOUTS))
    parser.add_argument("--max-processes", type=int, default=16)
    parser.add_argument("--every", type=int, default=EVERY, help="writes per commit per writer")
    parser.add_argument(
        "--sparser",
        default=",".join(map(str, SPARSER)),
        help=f"commit intervals also measured at {TARGETED} writers",
    )
    parser.add_argument(
        "--staged",
        default=",".join(map(str, STAGED)),
        help="writer counts measured never committing",
    )
    parser.add_argument("--seconds", type=float, default=5.0, help="window length")
    parser.add_argument("--rounds", type=int, default=3, help="measured windows per side")
    parser.add_argument(
        "--cpu-writes", type=int, default=10_000, help="writes per side per round of the CPU rows"
    )
    parser.add_argument("--cpu-rounds", type=int, default=3, help="rounds of the CPU rows; 0: none")
    parser.add_argument("--mergers", default=",".join(map(str, MERGERS)))
    parser.add_argument("--merge-entries", type=int, default=200_000)
    parser.add_argument("--merge-rounds", type=int, default=2)
    args, _ = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory() as tmp, open_backend(Path(tmp)) as backend:
        layouts = list(filter(None, args.layouts.split(",")))
        shapes = [
            (layout, n, args.every)
            for layout in layouts
            for n in map(int, filter(None, args.writers.split(",")))
        ]
        shapes += [
            (layout, TARGETED, every)
            for layout in layouts
            for every in map(int, filter(None, args.sparser.split(",")))
        ]
        shapes += [("branches", n, 0) for n in map(int, filter(None, args.staged.split(",")))]
        for layout, n, every in shapes:
            processes = min(n, args.max_processes)
            plan = Plan(layout, n, processes, n // processes, every, args.seconds)
            totals = measure_writers(backend, plan, args.rounds)
            report_writers(plan, totals, args.rounds, backend)
        if args.cpu_rounds:
            bench_cpu(backend, args.cpu_writes, args.cpu_rounds)
        for n in map(int, filter(None, args.mergers.split(","))):
            bench_merges(backend, n, args.merge_entries, args.merge_rounds)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
