"""Contended merges: metarange reuse on retry vs the naive redo-from-the-merge-base retry.

Eight processes merge eight feature branches, each touching a few ranges of an N-entry
repository, into `main` at the same moment, once with reuse and once naive, each in its own
repository and namespace (so neither finds the other's ranges). Reported: range objects
written, ranges read, attempts, and wall time.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import tempfile
import time
from pathlib import Path

from branchwater.engine.api import Lake
from branchwater.engine.graveler import merge as merge_ops
from tests.benchmarks.bench_graveler import bulk_stage, entry

FEATURES = 8


def setup(lake: Lake, db: Path, name: str, root: Path, entries: int, touched: int) -> None:
    repo = lake.create_repository(name, storage_namespace=f"file://{root}/{name}")
    token = lake.graveler.read_branch(repo.record, "main").staging_token
    bulk_stage(db, token, entries)
    repo.branch("main").commit("base")
    for i in range(FEATURES):
        feature = repo.create_branch(f"f{i}", source="main")
        for k in range(touched):
            victim = entry((i * touched + k) * entries // (FEATURES * touched) + 17)
            feature.upload(victim.path, f"feature {i} change {k}".encode())
        feature.commit(f"feature {i}")


def _merge(kv_url: str, name: str, index: int, reuse: bool, barrier) -> tuple[int, int, int, float]:
    with Lake.connect(kv_url) as lake:
        repo = lake.repository(name)
        committed = lake.graveler.committed(repo.record)
        objects = committed.objects
        counts = {"puts": 0, "reads": 0}
        put, get = objects.put, objects.get

        def counting_put(key, data):
            counts["puts"] += "/ranges/" in key
            return put(key, data)

        def counting_get(key):
            counts["reads"] += "/ranges/" in key
            return get(key)

        objects.put, objects.get = counting_put, counting_get
        barrier.wait(120)
        started = time.perf_counter()
        result = merge_ops.merge(lake.graveler, repo.record, f"f{index}", "main", reuse=reuse)
        return result.attempts, counts["puts"], counts["reads"], time.perf_counter() - started


def contend(kv_url: str, name: str, reuse: bool) -> tuple[int, int, int, float]:
    ctx = mp.get_context("spawn")
    with ctx.Manager() as manager:
        barrier = manager.Barrier(FEATURES)
        with ctx.Pool(FEATURES) as pool:
            jobs = [
                pool.apply_async(_merge, (kv_url, name, i, reuse, barrier)) for i in range(FEATURES)
            ]
            results = [job.get(1800) for job in jobs]
    attempts = sum(r[0] for r in results)
    return (
        attempts,
        sum(r[1] for r in results),
        sum(r[2] for r in results),
        max(r[3] for r in results),
    )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench_merge")
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--touched", type=int, default=2, help="ranges each feature touches")
    args, _ = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        db = root / "lake.db"
        kv_url = f"sqlite:///{db}?synchronous=normal"
        with Lake.connect(kv_url) as lake:
            for name in ("reuse", "naive"):
                setup(lake, db, name, root, args.entries, args.touched)
        reuse = contend(kv_url, "reuse", reuse=True)
        naive = contend(kv_url, "naive", reuse=False)
    print(
        f"BENCH merge ratio={reuse[3] / naive[3]:.2f} wall_s={reuse[3]:.2f} "
        f"naive_wall_s={naive[3]:.2f} "
        f"ranges_written={reuse[1]} naive_ranges_written={naive[1]} "
        f"written_ratio={reuse[1] / max(naive[1], 1):.2f} ranges_read={reuse[2]} "
        f"naive_ranges_read={naive[2]} attempts={reuse[0]} naive_attempts={naive[0]} "
        f"entries={args.entries}",
        flush=True,
    )


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
