"""Ranges on S3 against ranges on local files, with the machine's range cache cold and warm
(issue 41, item 4): runs on the stack only (`--backend stack`: PostgreSQL, SeaweedFS's S3);
on the embedded back end it prints a note and measures nothing.

Two repositories on the same PostgreSQL database hold the same `--entries` (default 1M)
committed entries, one with its namespace on S3, one on local files. Each side times the
same operations: the commit of the staged entries, then, in a new lake whose range cache is
empty (`cold`) and again in another new lake on the cache the first filled (`warm`): a
listing of every entry of `main`, `uncommitted()` of a branch with 10,000 staged rows
(half of them over committed paths) and a three-way merge of a branch with 100 changes into
a branch with one of its own. The ratio is S3's time over local files' time for the same
operations in the same state.

A cold listing must fetch each range once: `refetched` counts range GETs beyond the first of
each range during the cold listing on S3 (every operation of a cold round is counted in
`range_gets`).
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from branchwater.engine.api import Lake, Repository
from branchwater.engine.graveler.committed.format import RANGES_PREFIX
from tests.benchmarks.backends import EMBEDDED, Backend, open_backend, selected
from tests.benchmarks.bench_graveler import bulk_stage
from tests.benchmarks.declarations import Benchmark, Suite

BENCHMARKS = Suite(
    section="Engine",
    about="On the stack only: two repositories of 1M committed entries on one PostgreSQL "
    "database, one with its ranges on SeaweedFS's S3 and one on local files; each new lake "
    "starts with empty in-process caches.",
    benchmarks=(
        Benchmark(
            "range-cache-cold",
            measures="listing all of `main`, `uncommitted()` of 10k staged rows and a merge "
            "of 100 changes with ranges on S3, machine range cache empty",
            reference="the same operations with ranges on local files, cache empty",
            limits={"refetched": 0},
        ),
        Benchmark(
            "range-cache-warm",
            measures="the same operations with ranges on S3, machine range cache filled",
            reference="the same operations with ranges on local files, cache filled",
        ),
        Benchmark(
            "range-cache-commit",
            measures="a commit of 1M staged entries with its ranges written to S3",
            reference="the same commit with its ranges written to local files",
        ),
    ),
)

STAGED = 10_000
CHANGES = 100


class CountingGets:
    """An object store whose `get`s and `open`s of ranges are counted by key."""

    def __init__(self, inner: Any) -> None:
        self.inner, self.range_gets = inner, Counter[str]()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def get(self, key: str, *args: Any, **kwargs: Any) -> Any:
        self._count(key)
        return self.inner.get(key, *args, **kwargs)

    def open(self, key: str, *args: Any, **kwargs: Any) -> Any:
        self._count(key)
        return self.inner.open(key, *args, **kwargs)

    def _count(self, key: str) -> None:
        if RANGES_PREFIX in key:
            self.range_gets[key] += 1


@dataclass(frozen=True)
class Side:
    """One repository of the comparison: its name, namespace and range cache directory."""

    name: str
    namespace: str
    cache: Path

    def lake(self, backend: Backend) -> tuple[Lake, CountingGets]:
        """A new lake on this side's cache, its namespace's store counting range reads."""
        lake = backend.connect(range_cache_dir=self.cache)
        counting = CountingGets(lake.graveler.objects(self.namespace))
        lake.graveler._objects[self.namespace] = counting  # type: ignore[assignment]
        return lake, counting


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def prepare(backend: Backend, side: Side, entries: int) -> float:
    """Commit `entries` on `main` (timed), then the branches the rounds use: `feature` with
    `CHANGES` changes, `staged` with `STAGED` staged rows, a merge target per round."""
    lake = backend.connect(range_cache_dir=side.cache)
    repo = lake.create_repository(side.name, storage_namespace=side.namespace)
    main = repo.branch("main")
    bulk_stage(backend, _token(lake, repo, "main"), entries)
    seconds = timed(lambda: main.commit("base"))
    feature = repo.create_branch("feature", "main")
    for i in range(CHANGES):
        feature.upload(f"tables/t{i % 97:02d}/part-{i * (entries // CHANGES):08d}.parquet", b"x")
    feature.commit("changes")
    for state in ("cold", "warm"):
        target = repo.create_branch(f"target-{state}", "main")
        target.upload(f"own/{state}.csv", state.encode())
        target.commit("own")
    repo.create_branch("staged", "main")
    bulk_stage(backend, _token(lake, repo, "staged"), STAGED, offset=entries - STAGED // 2)
    lake.close()
    return seconds


def _token(lake: Lake, repo: Repository, branch: str) -> str:
    return lake.graveler.read_branch(repo.record, branch).staging_token


def round_on(backend: Backend, side: Side, state: str) -> tuple[dict[str, float], Counter[str]]:
    """The timed operations in a new lake; the range GETs of its listing and of all."""
    lake, counting = side.lake(backend)
    repo = lake.repository(side.name)
    seconds = {
        "list": timed(lambda: sum(1 for _ in repo.branch("main").list())),
        "uncommitted": timed(lambda: sum(1 for _ in repo.branch("staged").uncommitted())),
    }
    listed = Counter(counting.range_gets)
    seconds["merge"] = timed(lambda: repo.merge("feature", f"target-{state}", message="m"))
    lake.close()
    return seconds, listed


def measure(backend: Backend, entries: int) -> None:
    sides = [
        Side("on-s3", backend.namespace("s3"), backend.root / "cache-s3"),
        Side("on-local", f"file://{backend.root / 'local'}", backend.root / "cache-local"),
    ]
    commits = [prepare(backend, side, entries) for side in sides]
    rounds: dict[str, list[dict[str, float]]] = {}
    listed: Counter[str] = Counter()
    for state in ("cold", "warm"):
        for side in sides:
            if state == "cold":
                shutil.rmtree(side.cache, ignore_errors=True)
            seconds, gets = round_on(backend, side, state)
            rounds.setdefault(state, []).append(seconds)
            if state == "cold" and side is sides[0]:
                listed = gets
    for state, (s3, local) in rounds.items():
        figures = " ".join(
            f"{op}_s={s3[op]:.2f} local_{op}_s={local[op]:.2f}"
            for op in ("list", "uncommitted", "merge")
        )
        extra = ""
        if state == "cold":
            refetched = sum(listed.values()) - len(listed)
            extra = f" range_gets={sum(listed.values())} refetched={refetched}"
        print(
            f"BENCH range-cache-{state} ratio={sum(s3.values()) / sum(local.values()):.2f} "
            f"{figures}{extra} entries={entries} {backend.label}",
            flush=True,
        )
    print(
        f"BENCH range-cache-commit ratio={commits[0] / commits[1]:.2f} s3_s={commits[0]:.2f} "
        f"local_s={commits[1]:.2f} entries={entries} {backend.label}",
        flush=True,
    )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench_range_cache")
    parser.add_argument("--entries", type=int, default=1_000_000)
    args, _ = parser.parse_known_args(argv)
    if selected() == EMBEDDED:
        print("  bench_range_cache compares S3 with local files: run it with --backend stack")
        return
    with (
        tempfile.TemporaryDirectory(prefix="bench-range-cache-") as tmp,
        open_backend(Path(tmp)) as backend,
    ):
        measure(backend, args.entries)


if __name__ == "__main__":
    main(sys.argv[1:])
