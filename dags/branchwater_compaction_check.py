"""`branchwater_compaction_check`: compact the staging area of every branch where it is due.

Every hour, one task (`due`) reads the compaction figures of every branch of the configured
repositories (all the lake's repositories when the list is empty), at a bounded scan each,
and a mapped compactor (`compact`) runs on each branch where compaction is due. The
compactor compacts only if the branch is still due and no compaction started within the
guard window, so overlapping runs compact a branch once. A branch deleted after the check is
skipped. Reads of a compacted branch stop paying for its staged tombstones; HEAD and the
uncommitted changes are unchanged.

A run maps at most Airflow's `[core] max_map_length` branches, those with the most staged
tombstones first; the rest are still due at the next run, which takes them. Branches that
are not due cost no task instance.

Configured by params (`repositories`, `max_tombstones`, `max_sealed_tokens`) and the
`branchwater_default` connection, never by editing this file. Templates render as native
values: the thresholds are numbers in the rendered fields, where Airflow would mask a
string whose key names a token (`max_sealed_tokens`) as a secret.
"""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from typing import Any

from airflow.sdk import Param, dag, task

from branchwater.engine import MAX_SEALED_TOKENS, REPOSITORY_NAME_PATTERN, CompactionPolicy
from branchwater.plugin.hooks import BranchwaterHook, compaction_policy
from branchwater.plugin.operators import BranchwaterCompactOperator

log = logging.getLogger(__name__)

POLICY = {
    "max_tombstones": "{{ params.max_tombstones }}",
    "max_sealed_tokens": "{{ params.max_sealed_tokens }}",
    "scan_budget": f"{{{{ [params.max_tombstones, {CompactionPolicy.scan_budget}] | max }}}}",
}
"""The check counts at least as many tombstones as the threshold asks for."""


@task
def due(repositories: list[str], policy: dict[str, Any]) -> list[dict[str, str]]:
    """The branches where compaction is due, most staged tombstones first, at most
    `[core] max_map_length` of them."""
    from airflow.sdk.configuration import conf

    thresholds = compaction_policy(policy)
    hook = BranchwaterHook()
    try:
        found = [
            status
            for repo in hook.repositories(repositories)
            for status in repo.compaction_status(thresholds)
            if status.due
        ]
    finally:
        hook.close()
    found.sort(key=lambda status: (-status.staged_tombstones, -status.sealed_tokens))
    for status in found:
        log.info("Due on %s/%s: %s", status.repository, status.branch, "; ".join(status.reasons))
    limit = conf.getint("core", "max_map_length")
    if len(found) > limit:
        log.warning(
            "%d branches are due: compacting the %d with the most staged tombstones "
            "([core] max_map_length), the rest at the next run",
            len(found),
            limit,
        )
    return [{"repository": s.repository, "branch": s.branch} for s in found[:limit]]


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
    BranchwaterCompactOperator.partial(
        task_id="compact", policy=POLICY, if_needed=True, missing_ok=True
    ).expand_kwargs(due(repositories="{{ params.repositories }}", policy=POLICY))


branchwater_compaction_check()
