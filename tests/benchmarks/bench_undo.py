"""Undo and finding commits (issue 39): `revert` against committing the same changes by hand,
and `log-where` (a metadata search through a long history) against a plain walk of it.

- `revert`: a 1M-entry `main` gets a commit of `--changes` changed entries spread over its
  ranges. Each round branches twice off `main`: on one branch `Repository.revert` undoes
  that commit (a three-way merge of the parent's tree onto HEAD, the reverted commit as
  base); on the other the same entries, as they were before, are staged straight into the
  branch's token (outside the timer, as `bench_graveler` does) and committed. Rounds
  alternate which goes first, so drift hits both alike; times are summed.
- `log-where`: `--commits` commit records on `main` (written straight through the ref store:
  the walk reads records, not trees), three per DAG run, runs spread over ten DAGs. The
  candidate lists one run's commits with `log(where={dag_id, run_id})`, the reference walks
  the whole history with `log()`; the run lies half-way down, and the search walks to the
  end as the reference does, since a run's commits need not be adjacent. `first_share`: the
  commits read (counted at the ref store) before the first match of a run ten commits from
  the top, over all commits: a streamed log reads only those ahead of it. Each side's
  fastest round counts: a walk is short, and the slower rounds measure the machine's other
  work more than the walk.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from branchwater.engine.api import Lake, Repository
from branchwater.engine.graveler.committed import EMPTY_METARANGE_ID
from branchwater.engine.graveler.model import Commit, Entry, encode_entry
from tests.benchmarks.backends import Backend, open_backend
from tests.benchmarks.bench_graveler import bulk_stage, entry, new_lake, staging_token
from tests.benchmarks.declarations import Benchmark, Suite

BENCHMARKS = Suite(
    section="Engine",
    benchmarks=(
        Benchmark(
            "revert",
            measures="reverting one commit of 1k changed entries on a 1M-entry branch",
            reference="committing the same 1k changes by hand (staged, then committed)",
            target=1.2,
        ),
        Benchmark(
            "log-where",
            measures="finding one DAG run's commits among 30k by metadata "
            "(`log(where=…)`); `first_share`: commits read before a near run's first match, "
            "over all",
            reference="a plain walk of the whole history (`log()`)",
            target=1.1,
            limits={"first_share": 0.01},
        ),
    ),
)

DAGS = 10
COMMITS_PER_RUN = 3


def timed(action: Callable[[], object]) -> float:
    start = time.perf_counter()
    action()
    return time.perf_counter() - start


# revert ------------------------------------------------------------------------------------


def changed_indexes(entries: int, changes: int) -> list[int]:
    """Entries spread evenly over the keyspace, so the change touches many ranges."""
    step = max(1, entries // changes)
    return list(range(0, step * changes, step))


def changed(i: int) -> Entry:
    """Entry `i` with new content: another checksum, address and size."""
    original = entry(i)
    return original._replace(
        address=original.address.replace("data/s/", "data/t/"),
        checksum=f"{i + 1:032x}"[::-1],
        size=original.size + 1,
    )


def stage_entries(backend: Backend, token: str, rows: list[Entry]) -> None:
    """Stage `rows` into `token` straight through the driver (`bulk_stage`, for chosen rows)."""
    backend.stage_rows((token.encode(), e.path.encode(), encode_entry(e)) for e in rows)


def revert_round(
    lake: Lake, backend: Backend, bad: str, indexes: list[int], k: int
) -> tuple[float, float]:
    """One revert and one commit by hand of the same changes, on fresh branches."""
    repo = lake.repository("bench")
    repo.create_branch(f"revert-{k}", source="main")
    hand = repo.create_branch(f"hand-{k}", source="main")
    token = lake.graveler.read_branch(repo.record, hand.name).staging_token
    stage_entries(backend, token, [entry(i) for i in indexes])
    steps = [
        ("revert", lambda: repo.revert(f"revert-{k}", bad)),
        ("hand", lambda: hand.commit("undo by hand")),
    ]
    if k % 2:
        steps.reverse()
    times = {name: timed(step) for name, step in steps}
    ours = {e.path: e.identity() for e in repo.ref(f"revert-{k}").list()}
    theirs = {e.path: e.identity() for e in repo.ref(hand.name).list()}
    assert ours == theirs, "the revert and the commit by hand differ"
    return times["revert"], times["hand"]


def bench_revert(backend: Backend, entries: int, changes: int, rounds: int) -> None:
    with new_lake(backend) as lake:
        bulk_stage(backend, staging_token(lake), entries)
        main = lake.repository("bench").branch("main")
        main.commit("base")
        indexes = changed_indexes(entries, changes)
        stage_entries(backend, staging_token(lake), [changed(i) for i in indexes])
        bad = main.commit(f"{changes} changes").id
        revert_round(lake, backend, bad, indexes, -1)  # warm-up: both read the trees once
        revert_s = hand_s = 0.0
        for k in range(rounds):
            ours, theirs = revert_round(lake, backend, bad, indexes, k)
            revert_s += ours
            hand_s += theirs
    print(
        f"BENCH revert ratio={revert_s / hand_s:.2f} revert_s={revert_s:.3f} "
        f"hand_s={hand_s:.3f} entries={entries} changes={changes} rounds={rounds} "
        f"{backend.label}",
        flush=True,
    )


# log-where ---------------------------------------------------------------------------------


def run_metadata(i: int) -> dict[str, str]:
    """Commit `i` (oldest first) of run `i // COMMITS_PER_RUN`, in one of `DAGS` DAGs."""
    run = i // COMMITS_PER_RUN
    return {"airflow.dag_id": f"dag-{run % DAGS}", "airflow.run_id": f"run-{run:06d}"}


def write_history(lake: Lake, commits: int) -> Repository:
    """`commits` records on main, each on the last, all holding the empty tree."""
    repo = lake.repository("bench")
    refs = lake.graveler.refs
    head = repo.branch("main").head()
    for i in range(commits):
        head = refs.add_commit(repo.record, (head,), EMPTY_METARANGE_ID, f"c{i}", run_metadata(i))
    branch, predicate = refs.get_branch(repo.record, "main")
    refs.set_branch_if(repo.record, dataclasses.replace(branch, commit_id=head.id), predicate)
    return repo


def counting_reads(repo: Repository) -> list[int]:
    """Count the commit records the ref store reads from now on."""
    refs = repo.lake.graveler.refs
    original = refs.get_commit
    count = [0]

    def counted(record, commit_id):  # type: ignore[no-untyped-def]
        count[0] += 1
        return original(record, commit_id)

    refs.get_commit = counted  # type: ignore[method-assign]
    return count


def bench_log_where(backend: Backend, commits: int, rounds: int) -> None:
    with new_lake(backend) as lake:
        repo = write_history(lake, commits)
        wanted = run_metadata(commits // 2)
        found: list[Commit] = []
        where: list[float] = []
        walk: list[float] = []
        for k in range(rounds):
            steps = [
                ("where", lambda: found.extend(repo.log("main", where=wanted))),
                ("walk", lambda: sum(1 for _ in repo.log("main"))),
            ]
            if k % 2:
                steps.reverse()
            times = {name: timed(step) for name, step in steps}
            where.append(times["where"])
            walk.append(times["walk"])
        assert len(found) == COMMITS_PER_RUN * rounds, found
        where_s, walk_s = min(where), min(walk)
        near = run_metadata(commits - 10)
        reads = counting_reads(repo)
        start = time.perf_counter()
        first = next(repo.log("main", where=near))
        first_s = time.perf_counter() - start
        assert first.metadata == near
    print(
        f"BENCH log-where ratio={where_s / walk_s:.2f} where_s={where_s:.3f} "
        f"walk_s={walk_s:.3f} first_s={first_s:.4f} first_reads={reads[0]} "
        f"first_share={reads[0] / commits:.5f} commits={commits} rounds={rounds} "
        f"{backend.label}",
        flush=True,
    )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench_undo")
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--changes", type=int, default=1_000)
    parser.add_argument("--commits", type=int, default=30_000)
    parser.add_argument("--rounds", type=int, default=4)
    args, _ = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory() as tmp, open_backend(Path(tmp) / "revert") as backend:
        bench_revert(backend, args.entries, args.changes, args.rounds)
    with tempfile.TemporaryDirectory() as tmp, open_backend(Path(tmp) / "log") as backend:
        bench_log_where(backend, args.commits, args.rounds)


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])
