"""`branchwater_compaction_check`: compact the staging area of every branch where it is due.

Every hour, for every branch of the configured repositories (all the lake's repositories
when the list is empty), a mapped task group asks the compaction sensor once (poke mode, no
wait: a branch that is not due is skipped) and runs the compactor where it said yes. The
compactor compacts only if the branch is still due and no compaction started within the
guard window, so overlapping runs compact a branch once. A branch deleted after the listing
is skipped. Reads of a compacted branch stop paying for its staged tombstones; HEAD and the
uncommitted changes are unchanged.

Configured by params (`repositories`, `max_tombstones`, `max_sealed_tokens`) and the
`branchwater_default` connection, never by editing this file. Templates render as native
values: the thresholds are numbers in the rendered fields, where Airflow would mask a
string whose key names a token (`max_sealed_tokens`) as a secret.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from airflow.sdk import Param, dag, task, task_group

from branchwater.engine import MAX_SEALED_TOKENS, REPOSITORY_NAME_PATTERN, CompactionPolicy
from branchwater.plugin.hooks import BranchwaterHook
from branchwater.plugin.operators import BranchwaterCompactOperator
from branchwater.plugin.sensors import BranchwaterCompactionSensor

POLICY = {
    "max_tombstones": "{{ params.max_tombstones }}",
    "max_sealed_tokens": "{{ params.max_sealed_tokens }}",
    "scan_budget": f"{{{{ [params.max_tombstones, {CompactionPolicy.scan_budget}] | max }}}}",
}
"""The sensor counts at least as many tombstones as the threshold asks for."""


@task
def branches(params: dict[str, Any]) -> list[dict[str, str]]:
    """Every branch of the configured repositories, one task group each."""
    hook = BranchwaterHook()
    try:
        return [
            {"repository": repo.name, "branch": branch.name}
            for repo in hook.repositories(params["repositories"])
            for branch in repo.branches()
        ]
    finally:
        hook.close()


@task_group
def compaction(repository: str, branch: str) -> None:
    """One branch: the sensor decides, the compactor runs where it is due."""
    due = BranchwaterCompactionSensor(
        task_id="due",
        repository=repository,
        branch=branch,
        policy=POLICY,
        mode="poke",
        poke_interval=1,
        timeout=0,
        soft_fail=True,
        missing_ok=True,
    )
    compact = BranchwaterCompactOperator(
        task_id="compact",
        repository=repository,
        branch=branch,
        policy=POLICY,
        if_needed=True,
        missing_ok=True,
    )
    due >> compact


@dag(
    dag_id="branchwater_compaction_check",
    schedule="@hourly",
    start_date=datetime(2026, 1, 1, tzinfo=timezone.utc),
    catchup=False,
    max_active_runs=1,
    tags=["branchwater", "maintenance"],
    doc_md=__doc__,
    render_template_as_native_obj=True,
    params={
        "repositories": Param(
            [],
            type="array",
            items={"type": "string", "pattern": REPOSITORY_NAME_PATTERN},
            description="Repositories whose branches are checked; empty: every repository",
        ),
        "max_tombstones": Param(
            20_000,
            type="integer",
            minimum=1,
            description="Staged tombstones on a branch that make compaction due",
        ),
        "max_sealed_tokens": Param(
            8,
            type="integer",
            minimum=1,
            maximum=MAX_SEALED_TOKENS,
            description="Sealed staging tokens on a branch that make compaction due",
        ),
    },
)
def branchwater_compaction_check() -> None:
    compaction.expand_kwargs(branches())


branchwater_compaction_check()
