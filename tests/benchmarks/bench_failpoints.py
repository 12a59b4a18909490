"""Failpoints unarmed (issue 43): what a point costs a hot operation when nothing arms it.

- `failpoints-unarmed`: `--writes` staged writes (`stage_entry`, which passes the points
  `write.before_stage` and `write.before_validate` once per write) into `main` of a lake,
  with `failpoints.hit` as shipped against the same loop with `hit` replaced by a function
  that does nothing. Each round writes fresh paths on both sides and alternates which goes
  first; each side's fastest round counts, so the machine's other work weighs on neither. On
  the selected back end (`backends`): SQLite, or PostgreSQL on the stack.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from branchwater.engine import failpoints
from branchwater.engine.api import Lake
from branchwater.engine.graveler.writes import stage_entry
from tests.benchmarks.backends import Backend, open_backend
from tests.benchmarks.bench_graveler import entry, new_lake
from tests.benchmarks.declarations import Benchmark, Suite

BENCHMARKS = Suite(
    section="Engine",
    benchmarks=(
        Benchmark(
            "failpoints-unarmed",
            measures="staged writes (`stage_entry`) passing an unarmed failpoint each",
            reference="the same writes with `failpoints.hit` replaced by a no-op",
            target=1.1,
        ),
    ),
)


def _nothing(name: str) -> None:
    del name


def write_loop(lake: Lake, first: int, writes: int) -> float:
    """Seconds to stage `writes` entries, numbered from `first`, into `main`."""
    g, record = lake.graveler, lake.repository("bench").record
    entries = [entry(i) for i in range(first, first + writes)]
    start = time.perf_counter()
    for e in entries:
        stage_entry(g, record, "main", e)
    return time.perf_counter() - start


def timed_side(lake: Lake, first: int, writes: int, noop: bool) -> float:
    shipped = failpoints.hit
    if noop:
        failpoints.hit = _nothing
    try:
        return write_loop(lake, first, writes)
    finally:
        failpoints.hit = shipped


def bench_unarmed(backend: Backend, writes: int, rounds: int) -> None:
    with new_lake(backend) as lake:
        write_loop(lake, 0, writes // 10)
        best = {True: float("inf"), False: float("inf")}
        for k in range(rounds):
            order = (False, True) if k % 2 else (True, False)
            for side, noop in enumerate(order):
                first = (2 * k + side + 1) * writes
                best[noop] = min(best[noop], timed_side(lake, first, writes, noop))
    shipped_s, noop_s = best[False], best[True]
    print(
        f"BENCH failpoints-unarmed ratio={shipped_s / noop_s:.3f} shipped_s={shipped_s:.3f} "
        f"noop_s={noop_s:.3f} writes={writes} rounds={rounds} {backend.label}",
        flush=True,
    )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench_failpoints")
    parser.add_argument("--writes", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=9)
    args, _ = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory() as tmp, open_backend(Path(tmp) / "unarmed") as backend:
        bench_unarmed(backend, args.writes, args.rounds)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
