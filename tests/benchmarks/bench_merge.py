"""Contended merges: metarange reuse on retry vs the naive redo-from-the-merge-base retry.

Eight processes merge eight feature branches into one destination at the same moment. Each
feature changes one entry in each of `--touched` ranges of an N-entry repository, no two
features the same range. Two scenarios, each run once with reuse and once naive, in rounds
that alternate the two so drift hits both alike:

- `merge` (the seed's case): the destination moved on after the features branched off, in
  the same ranges they touch (another entry of each). Every attempt must merge those ranges
  entry by entry; a naive retry does it again from the merge base, a reusing retry starts
  from the ranges its lost attempt already merged.
- `merge-fresh`: the destination has not moved, so both retries copy whole ranges by id.
  Reuse has nothing to save here; the line shows it costs nothing either.

Each mode has its own repository and namespace, so neither finds the other's ranges.
Reported: ranges built by the merges (`built`, every range a merge's writer produced, stored
or found already stored), range objects uploaded, attempts, and wall time (first merge start
to last merge end, summed over rounds).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from branchwater.engine.api import Lake, Repository
from branchwater.engine.graveler import merge as merge_ops
from branchwater.engine.graveler.model import Entry
from tests.benchmarks.bench_graveler import bulk_stage

FEATURES = 8
MODES = ("reuse", "naive")


@dataclass
class Tally:
    attempts: int = 0
    built: int = 0
    uploaded: int = 0
    wall_s: float = 0.0

    def add(self, other: Tally) -> None:
        self.attempts += other.attempts
        self.built += other.built
        self.uploaded += other.uploaded
        self.wall_s += other.wall_s


def create_repository(lake: Lake, db: Path, name: str, root: Path, entries: int) -> None:
    repo = lake.create_repository(name, storage_namespace=f"file://{root}/{name}")
    token = lake.graveler.read_branch(repo.record, "main").staging_token
    bulk_stage(db, token, entries)
    repo.branch("main").commit("base")


def prepare_round(repo: Repository, label: str, touched: int, diverged: bool) -> str:
    """Branch a destination and the features off `main`; the name of the destination."""
    committed = repo.lake.graveler.committed(repo.record)
    ranges = committed.ranges(repo.branch("main").head().metarange_id)
    if len(ranges) < FEATURES * touched:
        raise SystemExit(f"only {len(ranges)} ranges: use more --entries or fewer --touched")
    destination = f"dest-{label}"
    repo.create_branch(destination, source="main")
    moved: list[Entry] = []
    for i in range(FEATURES):
        feature = repo.create_branch(f"{label}-f{i}", source=destination)
        for k in range(touched):
            rows = committed.range_entries(ranges[i * touched + k].range_id)
            feature.upload(rows[len(rows) // 2].path, f"{label} feature {i} change {k}".encode())
            moved.append(rows[len(rows) // 3])
        feature.commit(f"feature {i}")
    if diverged:
        branch = repo.branch(destination)
        for row in moved:
            branch.upload(row.path, f"{label} destination moved".encode())
        branch.commit("the destination moves on")
    return destination


def warm_up() -> None:
    """Pay pyarrow's one-off lazy import before the clock starts (it loads pandas on its first
    conversion from Python objects, half a second on a busy machine): process start-up, not
    merge work."""
    pa.array(["warm-up"])


def _merge(kv_url: str, name: str, source: str, destination: str, reuse: bool, barrier):
    """One contender: (attempts, ranges built, ranges uploaded, start, end)."""
    with Lake.connect(kv_url) as lake:
        repo = lake.repository(name)
        committed = lake.graveler.committed(repo.record)
        counts = {"built": 0, "uploaded": 0}
        put_range = committed._put_range

        def counting_put_range(table):
            range_id, uploaded = put_range(table)
            counts["built"] += 1
            counts["uploaded"] += uploaded
            return range_id, uploaded

        committed._put_range = counting_put_range
        warm_up()
        barrier.wait(120)
        started = time.time()
        result = merge_ops.merge(lake.graveler, repo.record, source, destination, reuse=reuse)
        return result.attempts, counts["built"], counts["uploaded"], started, time.time()


def contend(kv_url: str, name: str, label: str, destination: str, reuse: bool) -> Tally:
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(FEATURES)
        with ctx.Pool(FEATURES) as pool:
            jobs = [
                pool.apply_async(
                    _merge, (kv_url, name, f"{label}-f{i}", destination, reuse, barrier)
                )
                for i in range(FEATURES)
            ]
            results = [job.get(1800) for job in jobs]
    return Tally(
        attempts=sum(r[0] for r in results),
        built=sum(r[1] for r in results),
        uploaded=sum(r[2] for r in results),
        wall_s=max(r[4] for r in results) - min(r[3] for r in results),
    )


def run_scenario(kv_url: str, scenario: str, rounds: int, touched: int) -> dict[str, Tally]:
    tallies = {mode: Tally() for mode in MODES}
    for round_ in range(rounds):
        order = MODES if round_ % 2 == 0 else MODES[::-1]
        for mode in order:
            label = f"{scenario}-{round_}"
            with Lake.connect(kv_url) as lake:
                destination = prepare_round(
                    lake.repository(mode), label, touched, diverged=scenario == "merge"
                )
            tallies[mode].add(contend(kv_url, mode, label, destination, reuse=mode == "reuse"))
    return tallies


def report(scenario: str, tallies: dict[str, Tally], entries: int, touched: int) -> None:
    reuse, naive = tallies["reuse"], tallies["naive"]
    built_ratio = f"{reuse.built / naive.built:.2f}" if naive.built else "n/a"
    print(
        f"BENCH {scenario} ratio={reuse.wall_s / naive.wall_s:.2f} wall_s={reuse.wall_s:.2f} "
        f"naive_wall_s={naive.wall_s:.2f} built_ratio={built_ratio} ranges_built={reuse.built} "
        f"naive_ranges_built={naive.built} uploaded={reuse.uploaded} "
        f"naive_uploaded={naive.uploaded} attempts={reuse.attempts} "
        f"naive_attempts={naive.attempts} entries={entries} touched={touched}",
        flush=True,
    )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench_merge")
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--touched", type=int, default=3, help="ranges each feature touches")
    parser.add_argument("--rounds", type=int, default=4)
    args, _ = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        db = root / "lake.db"
        kv_url = f"sqlite:///{db}?synchronous=normal"
        with Lake.connect(kv_url) as lake:
            for mode in MODES:
                create_repository(lake, db, mode, root, args.entries)
        for scenario in ("merge", "merge-fresh"):
            tallies = run_scenario(kv_url, scenario, args.rounds, args.touched)
            report(scenario, tallies, args.entries, args.touched)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
