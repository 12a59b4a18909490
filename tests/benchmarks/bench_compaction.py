"""Staging-compaction benchmarks, issue 11, on the selected back end (`backends`).

- `compaction-tombstones`: a branch with T staged tombstones over its committed tree plus L
  live entries: the first listing page (and `stat` of a missing path) after compaction vs
  before, in one run. Target: first page after/before <= 0.01.
- `uncommitted`: `uncommitted()` over S staged changes (a third each added, changed,
  removed) on a tree of C entries, vs the floor in the same run (scanning the staged rows +
  iterating the committed tree), and vs the point-lookup way it used to work (a committed
  lookup per staged path). All three stream (nothing holds every change). Targets: ratio
  <= 2, and >= 10x faster than point lookups.
- `compaction-vs-commit`: compaction of E staged entries vs a commit of the same entries in
  a twin repository, each starting from an empty range cache (their ranges are the same, so
  the second would otherwise find them cached). Target: ratio <= 1.1 (the same work
  without the commit record).
- `commit-compacted`: on a tree of C entries, S changed entries staged and compacted, then
  S more staged and committed, vs a commit of the same 2S changes on an uncompacted twin
  (the same metarange). The compacted commit applies half the rows but reads HEAD's ranges
  too, to judge identity against HEAD. Reported, no target.

`--quick` runs every scenario at a smoke-test size.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path

from branchwater.engine.api import Branch, Lake
from branchwater.engine.errors import NotFound
from branchwater.engine.graveler.iterators import combine
from branchwater.engine.graveler.model import Entry, encode_entry
from branchwater.engine.graveler.reads import committed_lookup
from tests.benchmarks.backends import Backend, open_backend
from tests.benchmarks.bench_graveler import MTIME, bulk_stage, entry
from tests.benchmarks.declarations import Benchmark, Suite

BENCHMARKS = Suite(
    section="Engine",
    benchmarks=(
        Benchmark(
            "compaction-tombstones",
            measures="the first 1,000 entries of a branch with 1M staged tombstones over its "
            "tree, after compaction",
            reference="the same listing before compaction",
            target=0.01,
        ),
        Benchmark(
            "uncommitted",
            measures="`uncommitted()` over 200k staged changes on 1M committed entries",
            reference="scanning the staged rows and iterating the committed tree "
            "(`speedup_vs_point_lookup`: against a committed lookup per staged path)",
            target=2,
        ),
        Benchmark(
            "compaction-vs-commit",
            measures="compaction of 1M staged entries",
            reference="a commit of the same entries in a twin repository",
            target=1.1,
        ),
        Benchmark(
            "commit-compacted",
            measures="on 1M committed entries, 100k changes staged and compacted, 100k more "
            "staged, then the commit",
            reference="a commit of the same changes on an uncompacted twin",
        ),
    ),
)

PAGE = 1000


def bulk_rows(backend: Backend, token: str, rows: Iterable[tuple[str, bytes]]) -> None:
    """Staged (path, value) rows straight through the driver: the benchmark is not the
    staging."""
    backend.stage_rows((token.encode(), path.encode(), value) for path, value in rows)
    backend.checkpoint()


def new_lake(backend: Backend, *names: str) -> Lake:
    lake = backend.connect(range_cache_dir=backend.root / "cache")
    for name in names:
        lake.create_repository(name, storage_namespace=backend.namespace(name))
    return lake


def token_of(lake: Lake, repo: str, branch: str = "main") -> str:
    record = lake.repository(repo).record
    return lake.graveler.read_branch(record, branch).staging_token


def timed(action) -> tuple[float, object]:
    start = time.perf_counter()
    result = action()
    return time.perf_counter() - start, result


def live_entry(i: int) -> Entry:
    return Entry(f"zz/live-{i:06d}", f"data/live/{i:032x}", 100 + i, f"{i:032x}", MTIME)


def first_page(branch: Branch) -> list[Entry]:
    return list(islice(branch.list(), PAGE))


def bench_tombstones(tombstones: int, live: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, open_backend(Path(tmp)) as backend:
        lake = new_lake(backend, "bench")
        bulk_stage(backend, token_of(lake, "bench"), tombstones)
        bulk_rows(
            backend,
            token_of(lake, "bench"),
            ((e.path, encode_entry(e)) for e in map(live_entry, range(live))),
        )
        main = lake.repository("bench").branch("main")
        main.commit("tree")
        lake.wait_for_cleanup()
        tombstone_rows = ((entry(i).path, b"") for i in range(tombstones))
        bulk_rows(backend, token_of(lake, "bench"), tombstone_rows)
        missing = "tables/t00/part-missing.parquet"

        before_s, page = timed(lambda: first_page(main))
        assert len(page) == min(PAGE, live) and page[0].path.startswith("zz/")
        stat_before_s, _ = timed(lambda: _missing(main, missing))
        compact_s, result = timed(main.compact)
        lake.wait_for_cleanup()
        after_s, page_after = timed(lambda: first_page(main))
        stat_after_s, _ = timed(lambda: _missing(main, missing))
        assert page_after == page
        lake.close()
    print(
        f"BENCH compaction-tombstones ratio={after_s / before_s:.4f} "
        f"first_page_before_ms={before_s * 1e3:.1f} first_page_after_ms={after_s * 1e3:.1f} "
        f"stat_missing_before_ms={stat_before_s * 1e3:.2f} "
        f"stat_missing_after_ms={stat_after_s * 1e3:.2f} compact_s={compact_s:.2f} "
        f"tombstones_removed={result.tombstones_removed} tombstones={tombstones} live={live} "
        f"{backend.label}",
        flush=True,
    )


def _missing(branch: Branch, path: str) -> None:
    try:
        branch.stat(path)
    except NotFound:
        return
    raise AssertionError(f"{path} should be missing")


def staged_changes_rows(committed: int, changes: int) -> Iterator[tuple[str, bytes]]:
    """A third changed, a third removed (both spread over the tree), a third added."""
    stride = max(1, committed // changes)
    for k in range(changes):
        kind = k % 3
        if kind == 2:
            yield entry(committed + k).path, encode_entry(entry(committed + k))
            continue
        old = entry((k * stride) % committed)
        value = b"" if kind == 1 else encode_entry(old._replace(checksum="changed"))
        yield old.path, value


def naive_uncommitted(lake: Lake, branch: Branch) -> int:
    """The way `uncommitted()` used to work: a committed lookup per staged path."""
    g, record = lake.graveler, branch.repository.record
    state = g.read_branch(record, branch.name)
    head = g.refs.get_commit(record, state.commit_id).metarange_id
    count = 0
    staged = combine(
        [g.staging.scan(token) for token in (state.staging_token, *state.sealed_tokens)]
    )
    for path, value in staged:
        base = committed_lookup(g, record, head, path)
        if value is None:
            count += base is not None
        elif base is None or base.identity() != value.identity():
            count += 1
    return count


def bench_uncommitted(committed: int, changes: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, open_backend(Path(tmp)) as backend:
        lake = new_lake(backend, "bench")
        bulk_stage(backend, token_of(lake, "bench"), committed)
        main = lake.repository("bench").branch("main")
        head = main.commit("tree").metarange_id
        lake.wait_for_cleanup()
        rows = list(staged_changes_rows(committed, changes))
        bulk_rows(backend, token_of(lake, "bench"), rows)
        token = token_of(lake, "bench")
        store = lake.graveler.committed(main.repository.record)

        ours_s, found = timed(lambda: Counter(change.type for change in main.uncommitted()))

        def floor() -> int:
            scanned = sum(1 for _ in lake.graveler.kv.scan(token.encode(), batch_size=1000))
            return scanned + sum(1 for _ in store.iterate(head))

        floor_s, _ = timed(floor)
        naive_s, naive_count = timed(lambda: naive_uncommitted(lake, main))
        assert found.total() == naive_count == len(rows), (found, naive_count, len(rows))
        assert set(found) == {"added", "changed", "removed"}
        lake.close()
    print(
        f"BENCH uncommitted ratio={ours_s / floor_s:.2f} uncommitted_s={ours_s:.2f} "
        f"floor_s={floor_s:.2f} point_lookup_s={naive_s:.2f} "
        f"speedup_vs_point_lookup={naive_s / ours_s:.1f} changes={found.total()} "
        f"committed={committed} {backend.label}",
        flush=True,
    )


def bench_compaction_vs_commit(entries: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, open_backend(Path(tmp)) as backend:
        lake = new_lake(backend, "compacted", "committed")
        for name in ("compacted", "committed"):
            bulk_stage(backend, token_of(lake, name), entries)
        compacted = lake.repository("compacted").branch("main")
        committed = lake.repository("committed").branch("main")
        for name in ("compacted", "committed"):  # both start from a warm page cache
            sum(1 for _ in lake.graveler.kv.scan(token_of(lake, name).encode()))
        compact_s, result = timed(compacted.compact)
        lake.wait_for_cleanup()
        backend.checkpoint()  # the commit must not pay for the compacted rows' drop in the WAL
        shutil.rmtree(backend.root / "cache")  # nor skip caching the ranges the compaction cached
        commit_s, commit = timed(lambda: committed.commit("same entries"))
        assert result.metarange_id == commit.metarange_id
        lake.close()
    print(
        f"BENCH compaction-vs-commit ratio={compact_s / commit_s:.2f} compact_s={compact_s:.2f} "
        f"commit_s={commit_s:.2f} ranges_written={result.ranges_written} entries={entries} "
        f"{backend.label}",
        flush=True,
    )


def changed_rows(indexes: range, version: int) -> Iterator[tuple[str, bytes]]:
    """Entries of the benchmark tree at `indexes` with new content at new addresses."""
    for i in indexes:
        old = entry(i)
        new = old._replace(address=f"{old.address}-{version}", checksum=f"{old.checksum}-{version}")
        yield new.path, encode_entry(new)


def bench_commit_compacted(committed: int, changes: int) -> None:
    stride = max(1, committed // changes)
    with tempfile.TemporaryDirectory() as tmp, open_backend(Path(tmp)) as backend:
        lake = new_lake(backend, "compacted", "plain")
        branches = {name: lake.repository(name).branch("main") for name in ("compacted", "plain")}
        for name, branch in branches.items():
            bulk_stage(backend, token_of(lake, name), committed)
            branch.commit("tree")
            bulk_rows(backend, token_of(lake, name), changed_rows(range(0, committed, stride), 1))
        branches["compacted"].compact()
        for name in branches:
            later = range(stride // 2, committed, stride)
            bulk_rows(backend, token_of(lake, name), changed_rows(later, 2))
        compacted_s, compacted = timed(lambda: branches["compacted"].commit("changes"))
        plain_s, plain = timed(lambda: branches["plain"].commit("changes"))
        assert compacted.metarange_id == plain.metarange_id
        lake.close()
    print(
        f"BENCH commit-compacted ratio={compacted_s / plain_s:.2f} "
        f"compacted_commit_s={compacted_s:.2f} plain_commit_s={plain_s:.2f} "
        f"committed={committed} changes={2 * changes} {backend.label}",
        flush=True,
    )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench_compaction")
    parser.add_argument("--tombstones", type=int, default=1_000_000)
    parser.add_argument("--live", type=int, default=1000)
    parser.add_argument("--committed", type=int, default=1_000_000)
    parser.add_argument("--changes", type=int, default=200_000)
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--quick", action="store_true", help="smoke-test sizes")
    parser.add_argument(
        "--compaction-scenarios",
        default="tombstones,uncommitted,vs-commit,commit-compacted",
        help="comma-separated subset to run",
    )
    args, _ = parser.parse_known_args(argv)
    if args.quick:
        args.tombstones, args.committed, args.changes, args.entries = 20_000, 20_000, 4_000, 20_000
    chosen = args.compaction_scenarios.split(",")
    if "tombstones" in chosen:
        bench_tombstones(args.tombstones, args.live)
    if "uncommitted" in chosen:
        bench_uncommitted(args.committed, args.changes)
    if "vs-commit" in chosen:
        bench_compaction_vs_commit(args.entries)
    if "commit-compacted" in chosen:
        bench_commit_compacted(args.committed, args.changes // 2)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
