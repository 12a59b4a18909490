"""Zero-copy import (issue 38): `Branch.import_objects` of a prefix against listing the same
objects with the object layer's base library alone, on the selected back end (`backends`):
`import-local` on the embedded one (SQLite, a folder of local files), `import-s3` on the
stack (PostgreSQL, a prefix of SeaweedFS's S3).

`--objects` objects (100,000 by default: making the issue's 1M files or S3 objects takes
longer than the benchmark's budget; `--objects 1000000` runs it) of 64 bytes in folders of
1,000 under a prefix outside the namespace are imported into a fresh repository each round
(listing, ranges, one commit; the lake is opened and the repository created before the
clock starts). The objects are made once, before the first round and outside the clock:
files written one by one, or PUTs through obstore `PUTS_IN_FLIGHT` at once (at 1M on
SeaweedFS that is most of the run's time). The reference lists them with what an import
needs of each, its size and modification time: `os.scandir` walked with a `stat` per file
(local files), or obstore's `list` returning Arrow (S3), which gives them with the keys.
The best of `--rounds`, the two sides alternating.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from pathlib import Path

from tests.benchmarks.backends import PUTS_IN_FLIGHT, Backend, open_backend
from tests.benchmarks.declarations import Benchmark, Suite

BENCHMARKS = Suite(
    section="Object layer",
    benchmarks=(
        Benchmark(
            "import-local",
            measures="`Branch.import_objects` of a folder of local files (embedded)",
            reference="listing them (size and time) with `os.scandir` and `stat` alone",
            target=1.5,
        ),
        Benchmark(
            "import-s3",
            measures="`Branch.import_objects` of an S3 prefix (stack: SeaweedFS)",
            reference="listing them (size and time) with obstore's `list` (Arrow) alone",
            target=1.5,
        ),
    ),
    about="100,000 objects in folders of 1,000 by default (the issue's 1M: `--objects`).",
)
PER_FOLDER = 1_000
SOURCE = "existing"
"""The source prefix, below the object root: beside the namespaces, not in one."""
BODY = b"x" * 64
"""Each object's bytes: not empty, since an empty S3 object may be a folder marker."""


def keys(count: int) -> Iterator[str]:
    for i in range(count):
        yield f"{SOURCE}/day={i // PER_FOLDER:05d}/part-{i % PER_FOLDER:05d}.parquet"


def seed(backend: Backend, count: int) -> None:
    """The source objects: files, or PUTs `PUTS_IN_FLIGHT` at once through obstore."""
    if backend.server is None:
        for key in keys(count):
            path = backend.root / key
            if not path.parent.is_dir():
                path.parent.mkdir(parents=True)
            path.write_bytes(BODY)
        return
    import obstore

    store = backend.library()
    with ThreadPoolExecutor(PUTS_IN_FLIGHT) as pool:
        for _ in pool.map(lambda k: obstore.put(store, k, BODY), keys(count), chunksize=64):
            pass


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


def library_listing(backend: Backend) -> Callable[[], int]:
    """The source listed by the object library alone: `os.scandir` and `stat`, or obstore's
    `list` as Arrow (no Python object per key)."""
    if backend.server is None:
        return lambda: scandir_listing(str(backend.root / SOURCE))
    import obstore

    store = backend.library()
    return lambda: sum(
        page.num_rows for page in obstore.list(store, f"{SOURCE}/", return_arrow=True)
    )


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


def importer(backend: Backend, source: str, lakes: ExitStack) -> Side:
    """`import_objects` into a fresh repository; opening the lake and creating the
    repository is the round's setup, not the import."""

    def ready(round_: int) -> Callable[[], int]:
        lake = lakes.enter_context(backend.connect(range_cache_dir=""))
        repo = lake.create_repository(f"bench-{round_}", backend.namespace(f"ns-{round_}"))
        branch = repo.branch("main")

        def run() -> int:
            result = branch.import_objects(source, prefix="raw/")
            assert result.commit is not None
            return result.count

        return run

    return ready


def measure(backend: Backend, count: int, rounds: int) -> None:
    seed(backend, count)
    local = backend.server is None
    source = (backend.root / SOURCE).as_uri() if local else f"s3://{backend.bucket}/{SOURCE}/"
    listing = library_listing(backend)
    with ExitStack() as lakes:
        sides = {"import": importer(backend, source, lakes), "list": lambda _: listing}
        times = best(rounds, sides, count)
    ratio = times["import"] / times["list"]
    print(
        f"BENCH import-{'local' if local else 's3'} ratio={ratio:.2f} "
        f"import_s={times['import']:.3f} list_s={times['list']:.3f} objects={count} "
        f"rounds={rounds} {backend.label}",
        flush=True,
    )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench_import", description=__doc__)
    parser.add_argument("--objects", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args, _ = parser.parse_known_args(argv)
    with (
        tempfile.TemporaryDirectory(prefix="bench-import-") as tmp,
        open_backend(Path(tmp)) as backend,
    ):
        measure(backend, args.objects, args.rounds)


if __name__ == "__main__":
    main(sys.argv[1:])
