"""A lake with something on every page of the Branchwater view, behind `branchwater_default`.

Its GC run is saved by the GC job's own writers (summary and report), without running Spark:
the view reads what the job writes, and the job's tests cover how it decides.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import pytest

from branchwater.engine import Commit, Repository
from tests.plugin.conftest import LakeConnection

BRANCH = "feature/orders"
"""A branch name with a slash, which the view's links must carry through."""


@dataclass(frozen=True)
class ViewLake:
    conn: LakeConnection
    repo: Repository
    first: Commit
    second: Commit
    feature: Commit
    gc_run_id: str


@pytest.fixture
def view_lake(lake_conn: LakeConnection) -> ViewLake:
    return fill_lake(lake_conn)


def fill_lake(lake_conn: LakeConnection) -> ViewLake:
    """A repository with history on two branches, a tag, a compacted branch with staged
    changes, and a saved GC run."""
    repo = lake_conn.create_repository("sales-")
    main = repo.branch("main")
    main.upload("orders/2026-11-01.csv", b"id,amount\n1,10\n")
    main.upload("orders/old.csv", b"id\n0\n")
    first = main.commit("Load November", metadata={"airflow.dag_id": "daily_orders"})
    main.upload("orders/2026-11-02.csv", b"id,amount\n2,20\n")
    main.upload("orders/2026-11-01.csv", b"id,amount\n1,11\n")
    main.delete("orders/old.csv")
    second = main.commit("Load the second")
    feature = repo.create_branch(BRANCH, source="main")
    feature.upload("orders/draft.csv", b"draft")
    feature_commit = feature.commit("Draft orders")
    feature.delete("orders/2026-11-02.csv")
    feature.upload("orders/staged.csv", b"staged")
    feature.compact()
    feature.delete("orders/draft.csv")
    repo.tag("v1", first.id)
    run_id = save_gc_run(repo, lake_conn.s3_options)
    return ViewLake(lake_conn, repo, first, second, feature_commit, run_id)


def save_gc_run(repo: Repository, s3_options: dict[str, str]) -> str:
    """A finished dry run's summary and report, as the GC job saves them."""
    from branchwater.engine.gc.runs import files, report
    from branchwater.engine.gc.runs.storage import Namespace

    run_id, _ = repo.prepare_uncommitted_for_gc()
    now = datetime.now(UTC).isoformat()
    summary = files.RunSummary(
        run_id=run_id,
        repository=repo.name,
        repository_id="test",
        storage_namespace=repo.storage_namespace,
        mode="clean",
        requested_mode="clean",
        dry_run=True,
        started_at=now,
        prepare_started_at=now,
        cutoff=now,
        min_age_seconds=0.0,
        default_min_age_seconds=6 * 3600.0,
        counts={"candidates": files.Volume(3, 3_072), "listed": files.Volume(9, 9_000)},
        gate_success=True,
    )
    ns = Namespace.of(repo.storage_namespace, s3_options)
    files.write_summary(ns, summary)
    ns.store.put(files.run_prefix(run_id) + files.REPORT, report.render(summary, None).encode())
    return run_id
