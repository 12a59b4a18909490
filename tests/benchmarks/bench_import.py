"""Zero-copy import (issue 38): `Branch.import_objects` of a prefix against listing the same
objects with the object layer's base library alone.

- `import-<backend>`: `--objects` objects (100,000 by default: making the issue's 1M files
  or S3 objects takes longer than the benchmark's budget; `--objects 1000000` runs it) in
  folders of 1,000 under a prefix outside the namespace, imported into a fresh repository
  on SQLite each round (listing, ranges, one commit; the lake is opened and the repository
  created before the clock starts). The reference lists them with what an import needs of
  each, its size and modification time: `os.scandir` walked with a `stat` per file (local
  files), obstore's `list`, the object layer's base (S3, which returns them with the keys).
  The best of `--rounds`, the two sides alternating.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from branchwater.engine import Lake
from tests.benchmarks.backends import STACK, Backend
from tests.benchmarks.declarations import Benchmark, Suite
from tests.fixtures.s3 import running_seaweedfs
from tests.helpers.servers import unique_name

BENCHMARKS = Suite(
    section="Object layer",
    benchmarks=tuple(
        Benchmark(
            f"import-{backend}",
            measures=f"`Branch.import_objects` of a prefix of objects on {where}",
            reference=f"listing them (size and time) with {base} alone",
            target=1.5,
        )
        for backend, where, base in (
            ("local", "local files", "`os.scandir` and `stat`"),
            ("s3", "S3 (SeaweedFS)", "obstore's `list`"),
        )
    ),
    about="100,000 objects in folders of 1,000 by default (the issue's 1M: `--objects`).",
)
PER_FOLDER = 1_000


def keys(count: int) -> Iterator[str]:
    for i in range(count):
        yield f"day={i // PER_FOLDER:05d}/part-{i % PER_FOLDER:05d}.parquet"


def scandir_listing(root: str) -> int:
    """Objects under `root`, each `stat`-ed: what a local import reads of every file."""
    found = 0
    stack = [root]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                else:
                    entry.stat()
                    found += 1
    return found


Side = Callable[[int], Callable[[], int]]
"""A side of the comparison: given the round, readies what it needs (untimed: a fresh lake
and repository) and returns the timed part, which returns how many objects it saw."""


def best(rounds: int, sides: dict[str, Side], count: int) -> dict[str, float]:
    """The best time of each side over `rounds`, sides alternating; each must see `count`."""
    times: dict[str, list[float]] = {name: [] for name in sides}
    for round_ in range(rounds):
        order = list(sides) if round_ % 2 == 0 else list(reversed(sides))
        for name in order:
            timed = sides[name](round_)
            started = time.perf_counter()
            seen = timed()
            times[name].append(time.perf_counter() - started)
            assert seen == count, (name, seen, count)
    return {name: min(values) for name, values in times.items()}


def importer(tmp: Path, source: str, options: dict[str, str], lakes: ExitStack) -> Side:
    """`import_objects` into a fresh repository on SQLite; opening the lake and creating the
    repository is the round's setup, not the import."""

    def ready(round_: int) -> Callable[[], int]:
        kv = f"sqlite:///{tmp}/lake-{round_}.db"
        lake = lakes.enter_context(Lake.connect(kv, s3_options=options, range_cache_dir=""))
        namespace = (tmp / f"ns-{round_}").as_uri()
        branch = lake.create_repository("bench", namespace).branch("main")

        def run() -> int:
            result = branch.import_objects(source, prefix="raw/")
            assert result.commit is not None
            return result.count

        return run

    return ready


def listed(listing: Callable[[], int]) -> Side:
    return lambda _: listing


def report(backend: str, times: dict[str, float], count: int, rounds: int) -> None:
    ratio = times["import"] / times["list"]
    print(
        f"BENCH import-{backend} ratio={ratio:.2f} import_s={times['import']:.3f} "
        f"list_s={times['list']:.3f} objects={count} rounds={rounds}",
        flush=True,
    )


def bench_local(tmp: Path, count: int, rounds: int) -> None:
    source = tmp / "existing"
    for key in keys(count):
        path = source / key
        if not path.parent.is_dir():
            path.parent.mkdir(parents=True)
        path.write_bytes(b"x" * 64)
    with ExitStack() as lakes:
        sides = {
            "import": importer(tmp, source.as_uri(), {}, lakes),
            "list": listed(lambda: scandir_listing(str(source))),
        }
        report("local", best(rounds, sides, count), count, rounds)


def bench_s3(tmp: Path, count: int, rounds: int) -> None:
    import boto3
    import obstore

    with running_seaweedfs() as server:
        client: Any = boto3.session.Session().client("s3", **server.options)
        bucket = unique_name("bench-import-")
        client.create_bucket(Bucket=bucket)
        with ThreadPoolExecutor(8) as pool:
            list(
                pool.map(
                    lambda k: client.put_object(Bucket=bucket, Key=k, Body=b"x" * 64),
                    (f"existing/{key}" for key in keys(count)),
                )
            )

        store = Backend(STACK, tmp, "", server, bucket).library()

        def listing() -> int:
            return sum(len(page) for page in obstore.list(store, prefix="existing/"))

        with ExitStack() as lakes:
            sides = {
                "import": importer(tmp, f"s3://{bucket}/existing/", server.options, lakes),
                "list": listed(listing),
            }
            report("s3", best(rounds, sides, count), count, rounds)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench_import", description=__doc__)
    parser.add_argument("--objects", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backends", default="local,s3", help="comma-separated")
    args, _ = parser.parse_known_args(argv)
    backends = args.backends.split(",")
    if "local" in backends:
        with tempfile.TemporaryDirectory() as tmp:
            bench_local(Path(tmp), args.objects, args.rounds)
    if "s3" in backends:
        with tempfile.TemporaryDirectory() as tmp:
            bench_s3(Path(tmp), args.objects, args.rounds)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
