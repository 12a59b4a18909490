"""Committed layer: apply with range reuse vs a full rewrite, and write speed vs plain Parquet.

`committed-apply`: apply N changed entries to a large metarange (reused ranges are neither
read nor written) against the naive method: read every entry, merge the changes in, and
write the whole result into an empty namespace. Both start from a cold cache.

`committed-write`: `write_metarange` of the same entries against the floor, pyarrow turning
the same `Entry` rows into one table and writing one Parquet file to the same disk (on the
stack, to memory and one PUT to the same S3 server; see `backends`).
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import ParamSpec, TypeVar

import pyarrow as pa

from branchwater.engine.graveler.committed import CommittedStore, RangePolicy
from branchwater.engine.graveler.committed.format import RANGE_SCHEMA, RANGES_PREFIX
from branchwater.engine.graveler.model import Entry, metadata_json
from branchwater.engine.objects import ObjectInfo, ObjectStore
from tests.benchmarks.backends import Backend, open_backend
from tests.benchmarks.declarations import Benchmark, Suite

BENCHMARKS = Suite(
    section="Engine",
    benchmarks=(
        Benchmark(
            "committed-write",
            measures="`write_metarange` of 1M entries as ranges",
            reference="pyarrow writing the same entries as one Parquet file",
        ),
        Benchmark(
            "committed-apply",
            measures="100 scattered changes applied to a 1M-entry metarange, reused ranges "
            "neither read nor written",
            reference="reading every entry, merging the changes in and writing the whole metarange",
        ),
    ),
)

ChangeItem = tuple[str, Entry | None]
P = ParamSpec("P")
R = TypeVar("R")


def counting_range_puts(store: ObjectStore) -> list[int]:
    """Count the ranges `store` writes from now on, the figure range reuse is meant to keep
    small."""
    count = [0]
    put = store.put

    def counted(key: str, data: bytes) -> ObjectInfo:
        count[0] += key.startswith(RANGES_PREFIX)
        return put(key, data)

    store.put = counted  # type: ignore[method-assign]
    return count


def make_entries(count: int, seed: int) -> list[Entry]:
    """Lake-like rows: partitioned table paths, hex addresses and checksums, some metadata."""
    rng = random.Random(seed)
    t0 = datetime(2024, 1, 1, tzinfo=UTC)
    entries = []
    for i in range(count):
        table, part = divmod(i, 50_000)
        entries.append(
            Entry(
                f"tables/t{table:03d}/date=2024-{part * 12 // 50_000 + 1:02d}/part-{i:09d}.parquet",
                f"data/g{i // 100_000:04x}/{rng.getrandbits(128):032x}",
                rng.randrange(1, 1 << 30),
                f"{rng.getrandbits(128):032x}",
                t0 + timedelta(seconds=i),
                {"content-type": "application/parquet"} if i % 10 == 0 else {},
            )
        )
    return entries


def make_changes(entries: list[Entry], count: int, seed: int, spread: str) -> list[ChangeItem]:
    """`scattered`: uniformly random rows, the worst case for reuse (most ranges get one);
    `clustered`: consecutive rows, as when a job rewrites one partition. Each change is new
    content (a new checksum): a new address alone is the same object, which `apply` keeps."""
    rng = random.Random(seed)
    if spread == "clustered":
        first = rng.randrange(len(entries) - count + 1)
        picked = list(range(first, first + count))
    else:
        picked = sorted(rng.sample(range(len(entries)), count))
    return [
        (entries[i].path, entries[i]._replace(address=f"data/new/{i:012d}", checksum=f"{i:032x}"))
        for i in picked
    ]


def merged(base: Iterator[Entry], changes: list[ChangeItem]) -> Iterator[Entry]:
    """The naive apply: walk every base entry, replacing the changed ones."""
    by_path = dict(changes)
    for entry in base:
        new = by_path.get(entry.path, entry)
        if new is not None:
            yield new


def floor_write(entries: list[Entry], backend: Backend) -> None:
    """What pyarrow alone needs to put the same rows into one Parquet file."""
    paths, addresses, sizes, checksums, mtimes, metadata = zip(*entries, strict=True)
    values = (paths, addresses, sizes, checksums, mtimes, [metadata_json(m) for m in metadata])
    arrays = [pa.array(v, f.type) for v, f in zip(values, RANGE_SCHEMA, strict=True)]
    backend.write_parquet("floor.parquet", pa.Table.from_arrays(arrays, schema=RANGE_SCHEMA))


def timed(fn: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> tuple[R, float]:
    start = time.perf_counter()
    result = fn(*args, **kwargs)
    return result, time.perf_counter() - start


def bench_write(backend: Backend, entries: list[Entry], policy: RangePolicy) -> str:
    store = CommittedStore(backend.objects("write"), policy)
    metarange_id, write_s = timed(store.write_metarange, entries)
    _, floor_s = timed(floor_write, entries, backend)
    ranges = len(store.ranges(metarange_id))
    print(
        f"BENCH committed-write ratio={write_s / floor_s:.2f} "
        f"entries_per_s={len(entries) / write_s:,.0f} write_s={write_s:.2f} "
        f"floor_s={floor_s:.2f} entries={len(entries)} ranges={ranges} {backend.label}",
        flush=True,
    )
    return metarange_id


def bench_apply(
    backend: Backend, base_id: str, changes: list[ChangeItem], policy: RangePolicy, spread: str
) -> None:
    objects = backend.objects("write")
    range_puts = counting_range_puts(objects)
    result_id, apply_s = timed(CommittedStore(objects, policy).apply, base_id, changes)
    naive = CommittedStore(backend.objects("write"), policy)
    rewrite = CommittedStore(backend.objects("naive"), policy)
    naive_id, naive_s = timed(
        lambda: rewrite.write_metarange(merged(naive.iterate(base_id), changes))
    )
    if naive_id != result_id:
        raise AssertionError(f"apply gave {result_id}, a full rewrite {naive_id}")
    print(
        f"BENCH committed-apply ratio={apply_s / naive_s:.4f} apply_s={apply_s:.3f} "
        f"naive_s={naive_s:.2f} ranges_written={range_puts[0]} "
        f"ranges={len(naive.ranges(base_id))} changes={len(changes)} spread={spread} "
        f"{backend.label}",
        flush=True,
    )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench_committed", description=__doc__)
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--changes", type=int, default=100)
    parser.add_argument("--target-entries", type=int, default=RangePolicy().target_entries)
    parser.add_argument("--spread", choices=("scattered", "clustered"), default="scattered")
    parser.add_argument("--seed", type=int, default=7)
    args, _ = parser.parse_known_args(argv)
    policy = RangePolicy(target_entries=args.target_entries)
    entries = make_entries(args.entries, args.seed)
    changes = make_changes(entries, min(args.changes, len(entries)), args.seed, args.spread)
    with (
        tempfile.TemporaryDirectory(prefix="bw-bench-committed-") as tmp,
        open_backend(Path(tmp)) as backend,
    ):
        base_id = bench_write(backend, entries, policy)
        bench_apply(backend, base_id, changes, policy, args.spread)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
