"""GC retention's committed part (issue 40) on a generated history, local files, local Spark.

The history: a table of `objects / 4` files loaded first, then `commits` commits spread
over 365 days, each rewriting `chunk` files (the rest of `objects` over the commits: 25 at
the issue's scale), `branches` branches made from commits across the year, 1% of the objects
staged; rules: 30 days by default and on main. Its shape (`--shape`):

- `partitioned` (the default): a daily ETL. The table is partitioned by date (`t/date=
  YYYY-MM-DD/part-NNNNN`, a partition per day of the year, paths sorted by partition), and a
  commit on day d rewrites files of d's partition, and one commit in four also of a partition
  of the week before (late data): so a commit makes new versions of the one or two ranges
  holding those partitions and shares every other range with its parent, and a partition is
  no longer rewritten once its week is over (the issue's daily ETL rewriting a partition).
- `random`: each commit rewrites random files of the whole table, so it makes a new version
  of most ranges it touches (at the issue's scale ~24 of 250 ranges a commit, ~700,000 range
  versions over the year: a long generation before any reading). Kept to compare with.

Commits are written straight through the committed layer (no object files: the committed
part lists nothing), branches as KV rows in one bulk load. Default 100,000 objects, 500
commits, a branch per 30 commits (issue/10); the issue's 1M objects, 30k commits and 1k
branches are `--objects 1000000 --commits 30000`; the line says its scale and shape.

- `gc-retention`: the committed part (the commit classes from the KV, then in Spark: the
  active and expired-only metaranges' ranges, their addresses, the anti-joins and the
  attribution) against its floor: reading the address column of the same range files (the
  active side's and the expired-only side's distinct ranges, as the run finds them) with the
  fastest reader at hand, then the `left_anti` join of the expired-only addresses with the
  active and the uncommitted ones in the same Spark session. Target ≤ 2. The address sets
  exist only inside the range files; no anti-join avoids reading them: a range's Parquet
  statistics do not bound the addresses another range holds, and an address may sit at any
  path (a copy), so no key span prunes. The reader is pyarrow on the driver (whole-object
  GETs, `ParquetFile`'s read of the one column, one thread per core): Spark's own Parquet
  reader is slower on that many small files. The floor's join starts from the sets it read,
  cached in the session beforehand, so the handing over of the read arrays to Spark is not
  counted: the floor is a lower bound of "read, then join". Both sides run in turn, best of
  three, after two untimed warm-up runs of each (the JVM warmed, the same session). The line
  also gives `antijoin_s`, the join alone, and `antijoin_ratio`, the committed part against it.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import multiprocessing
import os
import random
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from branchwater.engine.api import Lake
from branchwater.engine.gc.addresses import slice_name
from branchwater.engine.gc.retention.rules import GCRules, set_rules
from branchwater.engine.gc.runs.retention import RetentionInput, retention_input
from branchwater.engine.gc.runs.storage import Namespace
from branchwater.engine.graveler.committed import EMPTY_METARANGE_ID
from branchwater.engine.graveler.model import BranchRecord, Entry, RepositoryRecord
from branchwater.engine.graveler.refs import BRANCHES
from branchwater.engine.graveler.staging import new_staging_token
from tests.benchmarks.backends import Backend, KVRow, open_backend
from tests.benchmarks.bench_gc import (
    BEST_OF,
    MTIME,
    RANGES,
    best_alternating,
    spark_session,
    stage,
)
from tests.benchmarks.declarations import Benchmark, Suite

BENCHMARKS = Suite(
    section="Garbage collection: retention",
    about="A year of commits rewriting a table's files in chunks, branches made from commits "
    "across the year, 1% staged, 30 days' retention; each side the best of three, "
    "alternating, after warm-up runs. The line says its scale.",
    benchmarks=(
        Benchmark(
            "gc-retention",
            measures="the committed part of a run: commit classes from the KV, then the "
            "active and expired-only ranges' addresses, anti-joined and attributed in Spark",
            reference="reading the address column of the same range files (active and "
            "expired-only ranges) with pyarrow, then the `left_anti` join of the expired-only, "
            "active and uncommitted address sets in the same Spark session; `antijoin_ratio` "
            "is against the join alone",
            target=2,
        ),
    ),
)
RULES = GCRules.from_json(
    {"default_retention_days": 30, "branches": [{"branch_id": "main", "retention_days": 30}]}
)
WARM_UP = 2
PARTITIONED, RANDOM = "partitioned", "random"
DAYS = 366
"""The partitions of the `partitioned` table: a day each, the history's year and its last day."""
WEEK = 7
LATE_FIX = 4


def entry(path: str, address: str) -> tuple[str, Entry]:
    """A change to `path`: new content (its checksum is the object's id), so a commit keeps
    it (identity is content: an equal checksum would be no change)."""
    return path, Entry(path, address, 1, address.rsplit("/", 1)[1], MTIME)


def generate(
    backend: Backend, objects: int, commits: int, branches: int, shape: str = PARTITIONED
) -> tuple[Lake, Any, str]:
    """The history; returns the lake, the repository and the staged addresses' Parquet."""
    rng = random.Random(17)
    root = backend.root
    lake = backend.connect(range_policy=RANGES)
    repo = lake.create_repository("bench", storage_namespace=backend.namespace("ns"))
    g, record = lake.graveler, repo.record
    now = datetime.now(UTC)
    start = now - timedelta(days=365)
    slices = [slice_name(start + timedelta(days=d)) for d in range(0, 366, 7)]

    def address(day: float) -> str:
        folder = slices[min(len(slices) - 1, int(day // 7))]
        return f"data/{folder}/{uuid.UUID(int=rng.getrandbits(128)).hex}"

    table = Table.of(shape, max(1, objects // 4), start)
    chunk = max(1, (objects - len(table.paths)) // commits)
    days = [365 * (number + 1) / (commits + 1) for number in range(commits)]
    changes = [[(path, address(0)) for path in table.paths]]
    changes += [[(p, address(day)) for p in table.rewritten(rng, day, chunk)] for day in days]
    metaranges = written_metaranges(backend, changes)
    head = g.refs.get_commit(record, g.refs.get_branch(record, "main")[0].commit_id)
    head = g.refs.add_commit(record, [head], metaranges[0], "load", creation_date=start)
    history = [head.id]
    for number, (day, metarange) in enumerate(zip(days, metaranges[1:], strict=True)):
        when = start + timedelta(days=day)
        head = g.refs.add_commit(record, [head], metarange, f"etl {number}", creation_date=when)
        history.append(head.id)
    branch, predicate = g.refs.get_branch(record, "main")
    g.refs.set_branch_if(record, dataclasses.replace(branch, commit_id=head.id), predicate)
    sources = [history[rng.randrange(len(history))] for _ in range(1, branches)]
    backend.stage_rows(branch_rows(record, sources))
    staged = [address(365) for _ in range(max(1, objects // 100))]
    tokens = [b.staging_token for b in g.refs.branches(record)]
    stage(backend, tokens, staged, "s")
    staged_file = str(root / "staged.parquet")
    pq.write_table(pa.table({"address": pa.array(staged, pa.string())}), staged_file)
    set_rules(g.kv, record, RULES)
    return lake, repo, staged_file


Changes = list[tuple[str, str]]
"""A commit's rewritten (path, address) pairs, sorted by path."""


def written_metaranges(backend: Backend, changes: list[Changes]) -> list[str]:
    """The metarange of each commit of the chain `changes` (the first on an empty tree),
    written through the committed layer by one process per core, each a consecutive
    segment of the commits: a segment starts from its first parent's table written whole
    (the same entries, so the same ranges where the range policy cuts them alike), then
    applies its commits' changes one after another, as the chain would."""
    segments = min(os.cpu_count() or 1, len(changes))
    bounds = [len(changes) * k // segments for k in range(segments + 1)]
    tasks = []
    state: dict[str, str] = {}
    for first, end in itertools.pairwise(bounds):
        tasks.append((sorted(state.items()), changes[first:end]))
        for part in changes[first:end]:
            state.update(part)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(len(tasks), mp_context=context) as pool:
        written = pool.map(partial(_segment_metaranges, backend), *zip(*tasks, strict=True))
        return [metarange for segment in written for metarange in segment]


def _segment_metaranges(backend: Backend, base: Changes, commits: list[Changes]) -> list[str]:
    with backend.connect(range_policy=RANGES) as lake:
        g = lake.graveler
        committed = g.committed(g.refs.get_repository("bench"))
        metarange = committed.apply(EMPTY_METARANGE_ID, [entry(p, a) for p, a in base])
        found = []
        for changes in commits:
            metarange = committed.apply(metarange, [entry(p, a) for p, a in changes])
            found.append(metarange)
        return found


def branch_rows(record: RepositoryRecord, sources: list[str]) -> Iterator[KVRow]:
    """`branch-0001`... at `sources`, as KV rows loaded at once (a bulk load, as the staged
    entries are): a branch made from an existing commit is only its record; no protection
    rule exists to stamp it."""
    for number, commit_id in enumerate(sources, 1):
        name = f"branch-{number:04d}"
        fresh = BranchRecord(name, commit_id, new_staging_token(record, name))
        yield record.partition, BRANCHES + name.encode(), fresh.encode()


@dataclass(frozen=True)
class Table:
    """The table the history's commits rewrite: its paths, sorted, and the shape of a
    commit's rewrite (the module's docstring)."""

    shape: str
    paths: list[str]
    partitions: list[range]
    """`partitioned`: the indexes into `paths` of each day's partition, day 0 first."""

    @classmethod
    def of(cls, shape: str, files: int, start: datetime) -> Table:
        if shape == RANDOM:
            return cls(shape, [f"t/{i:08d}" for i in range(files)], [])
        per_day = max(1, files // DAYS)
        paths = [
            f"t/date={(start + timedelta(days=d)).date().isoformat()}/part-{i:05d}"
            for d in range(DAYS)
            for i in range(per_day)
        ]
        return cls(shape, paths, [range(d * per_day, (d + 1) * per_day) for d in range(DAYS)])

    def rewritten(self, rng: random.Random, day: float, chunk: int) -> list[str]:
        """The sorted paths a commit on `day` rewrites: `chunk` random files of the table, or
        of its day's partition (and one commit in `LATE_FIX` of a partition of the week
        before: late data)."""
        if self.shape == RANDOM:
            picked = rng.sample(range(len(self.paths)), min(chunk, len(self.paths)))
        else:
            today = min(int(day), DAYS - 1)
            days = {today}
            if rng.randrange(LATE_FIX) == 0:
                days.add(max(0, today - 1 - rng.randrange(WEEK - 1)))
            files = [i for d in sorted(days) for i in self.partitions[d]]
            picked = rng.sample(files, min(chunk, len(files)))
        return [self.paths[i] for i in sorted(picked)]


def range_sets(ns: Namespace, layout: Any, plan: RetentionInput) -> dict[str, list[str]]:
    """The range keys of the active commits and of only expired ones, read on the driver."""

    def ranges(metaranges: set[str]) -> set[str]:
        keys = [layout.metarange_key(m) for m in sorted(metaranges)]
        column = layout.metarange_range_column
        return {r for t in ns.read_parquet_files(keys, [column]) for r in t.column(0).to_pylist()}

    active = ranges(plan.active_metaranges())
    expired = ranges(plan.expired_metaranges()) - active
    return {
        side: [layout.range_key(r) for r in sorted(s)]
        for side, s in (("active", active), ("expired", expired))
    }


def read_addresses(ns: Namespace, layout: Any, keys: list[str], threads: int) -> pa.Array:
    """The distinct addresses of range files, read with pyarrow: a whole-object GET and
    `ParquetFile`'s read of the address column, `threads` files at once."""
    column = layout.range_address_column

    def read(key: str) -> pa.Array:
        data = ns.store.get(key)
        return pq.ParquetFile(pa.BufferReader(data)).read([column]).column(0).combine_chunks()

    with ThreadPoolExecutor(threads) as pool:
        read_columns = list(pool.map(read, keys))
    return pc.unique(pa.chunked_array(read_columns, pa.string()))


def main(argv: list[str]) -> None:

    parser = argparse.ArgumentParser(prog="bench_gc_retention")
    parser.add_argument("--objects", type=int, default=100_000)
    parser.add_argument("--commits", type=int, default=500)
    parser.add_argument(
        "--branches", type=int, default=None, help="default: one per 30 commits, as the issue's"
    )
    parser.add_argument("--quick", action="store_true", help="20,000 objects, 100 commits")
    parser.add_argument(
        "--shape",
        choices=(PARTITIONED, RANDOM),
        default=PARTITIONED,
        help="what a commit rewrites: files of a date partition (default) or random files",
    )
    args, _ = parser.parse_known_args(argv)
    objects, commits = (20_000, 100) if args.quick else (args.objects, args.commits)
    branches = args.branches if args.branches is not None else max(1, commits // 30)
    with (
        tempfile.TemporaryDirectory(prefix="bench-gc-retention-") as tmp,
        open_backend(Path(tmp)) as backend,
    ):
        measure(backend, objects, commits, branches, args.shape)


def measure(backend: Backend, objects: int, commits: int, branches: int, shape: str) -> None:
    from branchwater.spark_jobs.gc.retention import expired_candidates

    root = backend.root
    start = time.perf_counter()
    lake, repo, staged_file = generate(backend, objects, commits, branches, shape)
    print(f"  generate: {time.perf_counter() - start:.1f} s", flush=True)
    spark = spark_session()
    ns = Namespace.of(repo.storage_namespace, backend.s3_options)
    layout = repo.committed_layout()
    readers = max(1, spark.sparkContext.defaultParallelism)
    now = datetime.now(UTC)

    def plan() -> RetentionInput:
        found = retention_input(lake.graveler, repo.record, now)
        assert found is not None
        return found

    def candidate() -> tuple[float, Any]:
        begin = time.perf_counter()
        uncommitted = spark.read.parquet(staged_file)
        found = expired_candidates(spark, ns, layout, plan(), uncommitted, readers)
        count = found.rows.count()
        return time.perf_counter() - begin, count

    fixed = plan()
    ranges = range_sets(ns, layout, fixed)

    def read_floor() -> tuple[float, dict[str, pa.Array]]:
        begin = time.perf_counter()
        read = {side: read_addresses(ns, layout, keys, readers) for side, keys in ranges.items()}
        return time.perf_counter() - begin, read

    addresses = read_floor()[1]
    sets = {
        "active": addresses["active"],
        "expired": addresses["expired"],
        "uncommitted": pq.read_table(staged_file).column("address"),
    }
    frames = {}
    for name, column in sets.items():
        path = str(root / f"floor-{name}.parquet")
        pq.write_table(pa.table({"address": column}), path)
        frames[name] = spark.read.parquet(path).cache()
        frames[name].count()

    def antijoin() -> tuple[float, int]:
        begin = time.perf_counter()
        count = (
            frames["expired"]
            .join(frames["active"], "address", "left_anti")
            .join(frames["uncommitted"], "address", "left_anti")
            .count()
        )
        return time.perf_counter() - begin, count

    def floor() -> tuple[float, tuple[int, float]]:
        """The read of both sides' range files, then the join (of the sets cached from an
        earlier read: the same addresses, checked)."""
        read_s, read = read_floor()
        assert all(len(read[side]) == len(sets[side]) for side in read)
        join_s, count = antijoin()
        return read_s + join_s, (count, join_s)

    for _ in range(WARM_UP):
        candidate()
        floor()
    (candidate_s, found), (floor_s, (expected, _)) = best_alternating(candidate, floor)
    assert found == expected, (found, expected)
    antijoin_s = min(antijoin()[0] for _ in range(BEST_OF))
    print(
        f"BENCH gc-retention ratio={candidate_s / floor_s:.2f} committed_s={candidate_s:.2f} "
        f"floor_s={floor_s:.2f} antijoin_s={antijoin_s:.2f} "
        f"antijoin_ratio={candidate_s / antijoin_s:.2f} "
        f"range_files={sum(map(len, ranges.values()))} objects={objects} commits={commits + 1} "
        f"branches={branches} expired_commits={len(fixed.retention.expired)} "
        f"candidates={found} shape={shape} scale=issue/{1_000_000 // max(1, objects)} "
        f"{backend.label}",
        flush=True,
    )
    spark.stop()
    lake.close()


if __name__ == "__main__":
    main(sys.argv[1:])
