"""Contended merges: metarange reuse on retry vs the naive redo-from-the-merge-base retry.

Eight processes merge eight feature branches into one destination at the same moment. Each
feature changes one entry in each of `--touched` ranges of an N-entry repository, no two
features the same range. Each scenario runs once with reuse and once naive, in rounds that
alternate the two so drift hits both alike:

- `merge` (the case of lakeFS's design for contended merges): the destination moved on after
  the features branched off, in the same ranges they touch (another entry of each), so every
  attempt must merge those ranges entry by entry. A naive retry does that again from the
  merge base; a reusing retry starts from the ranges its lost attempt already merged.
  Attempts race in lockstep (see `Gate`): every contender still merging reaches the
  destination together, one wins, and every other one retries, as that design describes.
- `merge-free`: the same, but the processes run free. On two cores eight first attempts
  share the CPU and finish far apart, so most merges lose only once or twice and the cold
  first attempts, which reuse cannot shorten, make up most of the wall time.
- `merge-fresh`: the destination has not moved, so both retries copy whole ranges by id.
  Reuse has nothing to save here; the line shows it costs nothing either.
- `merge-cold`: `merge` with the machine's range cache off, so every contender decodes and
  verifies each range it reads from the object store itself, as a merge on a machine that
  has not seen the repository before does.

All but `merge-cold` run with a range cache of their own (a fresh directory): the setup's
and earlier rounds' ranges are in it, as on a machine that committed them.

Each mode has its own repository and namespace, so neither finds the other's ranges. A first
round of each mode runs unmeasured: merges right after the 1M-entry setup run slower than
later ones, whichever mode goes first.
On the stack (`backends`) the processes share a PostgreSQL database and ranges on S3.
Reported: ranges built by the merges (`built`: every range a merge's writer produced, stored
or found already stored), range objects uploaded, attempts, and wall time (first merge start
to last merge end, summed over rounds).
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing as mp
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from branchwater.engine.api import Lake, Repository
from branchwater.engine.errors import TooManyTries, too_many_tries
from branchwater.engine.graveler import merge as merge_ops
from branchwater.engine.graveler.committed.format import decode_entries
from branchwater.engine.graveler.graveler import RetryPolicy
from branchwater.engine.graveler.model import Entry
from tests.benchmarks.backends import Backend, open_backend
from tests.benchmarks.bench_graveler import bulk_stage
from tests.benchmarks.declarations import Benchmark, Suite

BENCHMARKS = Suite(
    section="Engine",
    benchmarks=(
        Benchmark(
            "merge",
            measures="8 merges into 1M entries racing in lockstep, each touching 3 ranges the "
            "destination also changed, retries reusing their lost attempt's ranges",
            reference="the naive retry that redoes the merge from the merge base "
            "(`built_ratio`: ranges built, against the naive retry's)",
            target=0.7,
            limits={"built_ratio": 0.5},
        ),
        Benchmark(
            "merge-free",
            measures="`merge` with the processes running unsynchronised",
            reference="the naive retry",
        ),
        Benchmark(
            "merge-fresh",
            measures="`merge` with the destination unchanged since branching",
            reference="the naive retry",
        ),
        Benchmark(
            "merge-cold",
            measures="`merge` with the range cache off",
            reference="the naive retry",
        ),
    ),
)

FEATURES = 8
MODES = ("reuse", "naive")
SCENARIOS = {
    "merge": (True, True, True),
    "merge-free": (True, False, True),
    "merge-fresh": (False, True, True),
    "merge-cold": (True, True, False),
}
"""Scenario name: (the destination moved on after branching, attempts race in lockstep,
ranges are shared through the machine's range cache)."""


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


def connect(backend: Backend, cache: str | None, **options) -> Lake:
    """A lake with the given range cache directory, or none."""
    if cache is None:
        return backend.connect(range_cache_bytes=0, **options)
    return backend.connect(range_cache_dir=cache, **options)


def create_repository(lake: Lake, backend: Backend, name: str, entries: int) -> None:
    repo = lake.create_repository(name, storage_namespace=backend.namespace(name))
    token = lake.graveler.read_branch(repo.record, "main").staging_token
    bulk_stage(backend, token, entries)
    repo.branch("main").commit("base")


def prepare_round(
    repo: Repository, label: str, touched: int, diverged: bool, features: int = FEATURES
) -> str:
    """Branch a destination and `features` features off `main`; the destination's name."""
    committed = repo.lake.graveler.committed(repo.record)
    ranges = committed.ranges(repo.branch("main").head().metarange_id)
    if len(ranges) < features * touched:
        raise SystemExit(f"only {len(ranges)} ranges: use more --entries or fewer --touched")
    destination = f"dest-{label}"
    repo.create_branch(destination, source="main")
    moved: list[Entry] = []
    for i in range(features):
        feature = repo.create_branch(f"{label}-f{i}", source=destination)
        for k in range(touched):
            rows = decode_entries(committed.storage.range_table(ranges[i * touched + k].range_id))
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
    conversion from Python objects): process start-up, not merge work."""
    pa.array(["warm-up"])


class Gate:
    """Lockstep races: every contender still merging reaches the destination together.

    Each attempt waits here before its final `set_if` until all contenders still merging
    have an attempt ready; then they race, one wins and leaves, and the rest retry. This is
    that design's contention (every lost race restarts every loser) without the scheduling
    noise of eight processes on two cores finishing their first attempts far apart. The gate
    orders the race, so the contenders do not also back off between attempts: the jittered
    sleeps (up to 0.5 s by the eighth loss) would be most of the wall time, the same in both
    modes, and hide the merge work being compared. Shared
    memory and one OS condition, handed to the pool's processes at start: a manager's
    proxies would add milliseconds of IPC to every round.
    """

    def __init__(self, ctx, contenders: int) -> None:
        self.cond = ctx.Condition()
        self.round = ctx.RawValue("i", 0)
        self.arrived = ctx.RawValue("i", 0)
        self.active = ctx.RawValue("i", contenders)

    def arrive(self) -> None:
        with self.cond:
            mine = self.round.value
            self.arrived.value += 1
            self._open_if_complete()
            while self.round.value == mine:
                self.cond.wait(60)

    def leave(self) -> None:
        with self.cond:
            self.active.value -= 1
            self._open_if_complete()

    def _open_if_complete(self) -> None:
        if self.active.value and self.arrived.value >= self.active.value:
            self.arrived.value = 0
            self.round.value += 1
            self.cond.notify_all()


_GATE: Gate | None = None


def _install(gate: Gate | None) -> None:
    global _GATE
    _GATE = gate


def _merge(
    backend: Backend,
    cache: str | None,
    name: str,
    source: str,
    destination: str,
    reuse: bool,
    start,
):
    """One contender: (attempts, ranges built, ranges uploaded, start, end)."""
    gate = _GATE
    retry = RetryPolicy(base_delay=0) if gate else RetryPolicy()
    with connect(backend, cache, retry=retry) as lake:
        repo = lake.repository(name)
        committed = lake.graveler.committed(repo.record)
        counts = {"built": 0, "uploaded": 0}
        put_range = committed.storage.put_range

        def counting_put_range(table):
            range_id, uploaded = put_range(table)
            counts["built"] += 1
            counts["uploaded"] += uploaded
            return range_id, uploaded

        committed.storage.put_range = counting_put_range
        if gate is not None:
            try_update = lake.graveler.try_update_branch

            def in_lockstep(*args):
                gate.arrive()
                return try_update(*args)

            lake.graveler.try_update_branch = in_lockstep
        warm_up()
        start.wait(120)
        started = time.time()
        try:
            if reuse:
                attempts = merge_ops.merge(lake.graveler, repo.record, source, destination).attempts
            else:
                attempts = naive_merge(lake, repo, source, destination)
        finally:
            if gate is not None:
                gate.leave()
        return attempts, counts["built"], counts["uploaded"], started, time.time()


def naive_merge(lake: Lake, repo: Repository, source: str, destination: str) -> int:
    """The baseline, as lakeFS retries: every lost attempt is redone from the merge base.

    Each attempt is a merge allowed one attempt and given no hint, so nothing of a lost one
    carries over; the lake's own policy spaces the attempts. Returns how many it took.
    """
    policy = lake.graveler.retry
    lake.graveler.retry = dataclasses.replace(policy, attempts=1)
    try:
        for attempt in policy:
            try:
                merge_ops.merge(lake.graveler, repo.record, source, destination)
            except TooManyTries:
                continue
            return attempt
    finally:
        lake.graveler.retry = policy
    raise too_many_tries(f"naive merge of {source!r} into {destination!r}", policy.attempts)


def contend(
    backend: Backend,
    cache: str | None,
    name: str,
    label: str,
    destination: str,
    reuse: bool,
    lockstep: bool,
    features: int = FEATURES,
) -> Tally:
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        start = manager.Barrier(features)
        gate = Gate(ctx, features) if lockstep else None
        with ctx.Pool(features, initializer=_install, initargs=(gate,)) as pool:
            jobs = [
                pool.apply_async(
                    _merge, (backend, cache, name, f"{label}-f{i}", destination, reuse, start)
                )
                for i in range(features)
            ]
            results = [job.get(1800) for job in jobs]
    return Tally(
        attempts=sum(r[0] for r in results),
        built=sum(r[1] for r in results),
        uploaded=sum(r[2] for r in results),
        wall_s=max(r[4] for r in results) - min(r[3] for r in results),
    )


def run_scenario(
    backend: Backend,
    cache: str | None,
    scenario: str,
    rounds: int,
    touched: int,
    diverged: bool,
    lockstep: bool,
) -> dict[str, Tally]:
    tallies = {mode: Tally() for mode in MODES}
    for round_ in range(rounds):
        order = MODES if round_ % 2 == 0 else MODES[::-1]
        for mode in order:
            label = f"{scenario}-{round_}"
            with connect(backend, cache) as lake:
                destination = prepare_round(lake.repository(mode), label, touched, diverged)
            reuse = mode == "reuse"
            tally = contend(backend, cache, mode, label, destination, reuse, lockstep)
            tallies[mode].add(tally)
    return tallies


def report(
    scenario: str, tallies: dict[str, Tally], entries: int, touched: int, backend: Backend
) -> None:
    reuse, naive = tallies["reuse"], tallies["naive"]
    built_ratio = f"{reuse.built / naive.built:.2f}" if naive.built else "n/a"
    print(
        f"BENCH {scenario} ratio={reuse.wall_s / naive.wall_s:.2f} wall_s={reuse.wall_s:.2f} "
        f"naive_wall_s={naive.wall_s:.2f} built_ratio={built_ratio} ranges_built={reuse.built} "
        f"naive_ranges_built={naive.built} uploaded={reuse.uploaded} "
        f"naive_uploaded={naive.uploaded} attempts={reuse.attempts} "
        f"naive_attempts={naive.attempts} entries={entries} touched={touched} "
        f"{backend.label}",
        flush=True,
    )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench_merge")
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--touched", type=int, default=3, help="ranges each feature touches")
    parser.add_argument("--rounds", type=int, default=4)
    args, _ = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory() as tmp, open_backend(Path(tmp)) as backend:
        cache = str(backend.root / "range-cache")
        with connect(backend, cache) as lake:
            for mode in MODES:
                create_repository(lake, backend, mode, args.entries)
        run_scenario(backend, cache, "warm-up", 1, args.touched, diverged=True, lockstep=False)
        for scenario, (diverged, lockstep, cached) in SCENARIOS.items():
            tallies = run_scenario(
                backend,
                cache if cached else None,
                scenario,
                args.rounds,
                args.touched,
                diverged,
                lockstep,
            )
            report(scenario, tallies, args.entries, args.touched, backend)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
