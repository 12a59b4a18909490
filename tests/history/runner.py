"""One history from a seed: a fresh repository with retention rules, the workers' run, a
final GC run with every worker stopped, and the final state read back for the checker.

Only the Spark job marks GC candidates, so GC during a history runs without Spark as the
engine tests do: the engine's `prepare_uncommitted_for_gc`, then the GC rule's sweep
(`tests.gc_model.sweep`, the rule the Spark job is tested against in `tests/spark_jobs`),
each worker now and then with a minimum age; and retention runs (`tests.gc_model.
retention_run`: the Spark job's driver, its anti-joins replaced by the model's address
sets). Once the workers stop, a retention run at the history's end and a run with no
minimum age collect everything unreferenced: by that rule in the fast variant, by the Spark
job itself in the slow one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from branchwater.engine import CommitExpired, GCRunLocked, Lake
from branchwater.engine.api import Repository
from branchwater.engine.gc.retention.expired import expired_at
from branchwater.engine.graveler import history as history_ops
from branchwater.engine.graveler import reads
from tests.gc_model import assert_references_intact, retention_run, sweep
from tests.helpers.servers import unique_name
from tests.history import operations
from tests.history.checker import CommitState, FinalState, check
from tests.history.operations import (
    IMPORT_FILES,
    LEASE,
    MAIN,
    PATHS,
    RULES,
    SHARED,
    Task,
    private,
    read_log,
)
from tests.history.workers import Workers

SEED_ENV = "BRANCHWATER_HISTORY_SEED"
COUNT_ENV = "BRANCHWATER_HISTORY_SEEDS"


@dataclass(frozen=True)
class Backend:
    """Where histories run: a lake's KV URL, its S3 options, and a namespace per repository."""

    name: str
    kv_url: str
    namespace: Callable[[str], str]
    s3_options: dict[str, str] | None = None


@dataclass(frozen=True)
class Settings:
    workers: int = 6
    operations: int = 12
    """Per worker."""
    fault: str = "raise"
    fault_rate: float = 0.15
    gc_min_age: float = 2.0
    timeout: float = 120.0


@dataclass
class Outcome:
    seed: int
    records: list[dict[str, Any]]
    state: FinalState
    restarts: int
    violations: list[str] = field(default_factory=list)


Collect = Callable[[Repository], int]
"""The final GC run, with every worker stopped: returns how many objects it deleted."""


def rule_sweep(repo: Repository) -> int:
    """The engine's prepare, then the GC rule's sweep, with no minimum age."""
    return len(sweep(repo, repo.prepare_uncommitted_for_gc(), timedelta(0)))


def run_history(
    lake: Lake,
    workers: Workers,
    backend: Backend,
    seed: int,
    settings: Settings,
    logs: Path,
    collect: Collect = rule_sweep,
) -> Outcome:
    name = unique_name(f"h{seed}-")
    repo = lake.create_repository(name, storage_namespace=backend.namespace(name))
    initial = set_up(repo, seed, settings.workers)
    start = time.time()
    logs = logs / backend.name
    logs.mkdir(exist_ok=True)
    source = import_source(logs / f"source-{name}", seed)
    tasks = [
        Task(
            backend.kv_url,
            backend.s3_options,
            name,
            seed,
            worker,
            settings.operations,
            operations.log_path(logs, seed, worker),
            settings.fault,
            settings.fault_rate,
            settings.gc_min_age,
            start,
            source,
        )
        for worker in range(settings.workers)
    ]
    for task in tasks:
        if os.path.exists(task.log_path):
            os.remove(task.log_path)
    restarts = workers.run(tasks, settings.timeout)
    records = [record for task in tasks for record in read_log(task.log_path)]
    end = tasks[0].end()
    state = final_state(repo, initial, lambda r: final_gc(r, end, backend, collect))
    outcome = Outcome(seed, records, state, restarts)
    outcome.violations = check(records, state)
    return outcome


def set_up(repo: Repository, seed: int, workers: int) -> str:
    """`main` with half the paths committed, `shared` and each worker's branch from it, and
    the retention rules."""
    repo.set_gc_rules(RULES)
    main = repo.branch(MAIN)
    for path in PATHS[::2]:
        main.upload(path, f"initial {seed} {path}".encode())
    initial = main.commit("initial").id
    for branch in [SHARED, *(private(w) for w in range(workers))]:
        repo.create_branch(branch, source=MAIN)
    return initial


def import_source(folder: Path, seed: int) -> str:
    """The folder every import of the history reads: `IMPORT_FILES`, never changed."""
    for name in IMPORT_FILES:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(f"imported {seed} {name}".encode())
    return folder.as_uri()


def tree(repo: Repository, commit_id: str) -> dict[str, str]:
    """The commit's tree, read past `CommitExpired` (the entries stay; only the objects
    only expired commits held are gone)."""
    g = repo.lake.graveler
    return {entry.path: entry.checksum for entry in reads.list_commit(g, repo.record, commit_id)}


def view(repo: Repository, branch: str) -> dict[str, str]:
    """What the branch shows, uncommitted changes included."""
    return {entry.path: entry.checksum for entry in repo.branch(branch).list()}


def final_gc(repo: Repository, end: datetime, backend: Backend, collect: Collect) -> int:
    """A retention run at the history's end (once the lease of a worker killed holding it
    lapses), then `collect`; returns how many objects both deleted."""
    deadline = time.monotonic() + 2 * LEASE.total_seconds()
    while True:
        try:
            run = retention_run(repo, end, "final", LEASE, backend.s3_options)
            break
        except GCRunLocked:
            assert time.monotonic() < deadline, "a worker's GC lease never lapsed"
            time.sleep(0.2)
    return len(run.deleted) + collect(repo)


def final_state(repo: Repository, initial: str, collect: Collect) -> FinalState:
    """Everything the checker compares with the model: every commit (tree, parents,
    metadata, the engine's merge bases of a merge's parents), the refs, each branch's view,
    and after a final GC run the views again, what no longer reads, which commits retention
    recorded expired and which a read refuses (`CommitExpired`)."""
    g = repo.lake.graveler
    commits = {}
    bases = {}
    for commit in g.refs.list_commits(repo.record):
        commits[commit.id] = CommitState(
            list(commit.parents), dict(commit.metadata), tree(repo, commit.id)
        )
        if len(commit.parents) == 2:
            found = history_ops.find_merge_bases(
                g.refs, repo.record, [commit.parents[0]], [commit.parents[1]]
            )
            bases[commit.id] = [c.id for c in found]
    branches = {b.name: b.commit_id for b in repo.branches()}
    views = {name: view(repo, name) for name in branches}
    deleted = collect(repo)
    broken: list[str] = []
    try:
        assert_references_intact(repo)
    except (AssertionError, CommitExpired) as exc:
        broken.append(f"{type(exc).__name__}: {exc}")
    kv = g.kv
    recorded = {c for c in commits if expired_at(kv, repo.record, c) is not None}
    refused = set()
    for commit_id in commits:
        try:
            repo.ref(commit_id)
        except CommitExpired:
            refused.add(commit_id)
    return FinalState(
        initial=initial,
        commits=commits,
        bases=bases,
        branches=branches,
        views=views,
        views_after_gc={name: view(repo, name) for name in branches},
        tags={t.name: t.commit_id for t in repo.tags()},
        broken=broken,
        gc_deleted=deleted,
        expired=recorded,
        refused=refused,
    )


def reproduce(seed: int, backend: str, test: str) -> str:
    return (
        f"{SEED_ENV}={seed} .venv/bin/python -m pytest -p no:cacheprovider "
        f"'tests/history/test_histories.py::{test}' -k {backend}"
    )
