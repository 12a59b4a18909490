"""Staging compaction: fold a branch's staging area into a compacted metarange, no commit."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from branchwater.plugin.hooks import compaction_policy
from branchwater.plugin.operators.base import (
    BranchwaterOperator,
    branch_or_skip,
    declared_flag,
    mapping_field,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

    from branchwater.engine import Repository


class BranchwaterCompactOperator(BranchwaterOperator):
    """Compact `branch`'s staging area: reads stop paying for its tombstones, HEAD and the
    uncommitted changes stay as they were.

    Returns what the compaction did as a dict: `outcome` ("compacted", "nothing-staged",
    "not-due", "guarded", "superseded"), `compacted`, `message`, `sealed_tokens`,
    `entries_applied`, `tombstones_removed`, `ranges_written`, `ranges_reused`, `seconds`.
    Nothing staged is a successful no-op, as is a compaction a concurrent commit overtook
    (nothing is lost). With `if_needed=True` it compacts only when due under `policy` (the
    thresholds `BranchwaterCompactionSensor` takes) and no compaction started within the
    guard window, so two DAG runs overlapping compact once. A branch that is gone fails the
    task, unless `missing_ok=True`, which skips it.

    :param branch: the branch to compact (templated)
    :param if_needed: compact only when due under `policy` (default False: always)
    :param policy: thresholds `max_tombstones`, `max_sealed_tokens`, `scan_budget`,
        `guard_seconds`, a mapping or its JSON text (templated; the engine's default for
        each one left out, empty or rendered "None")
    :param missing_ok: skip the task when the branch is gone (default False: fail)
    """

    template_fields: Sequence[str] = ("repository", "branch", "policy")

    def __init__(
        self,
        *,
        branch: str,
        if_needed: bool = False,
        policy: dict[str, Any] | str | None = None,
        missing_ok: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.branch = branch
        self.if_needed = if_needed
        self.policy = policy or {}
        self.missing_ok = declared_flag(self.task_id, "missing_ok", missing_ok)

    def execute_on(self, repo: Repository, context: Context) -> dict[str, Any]:
        branch = branch_or_skip(repo, self.branch, self.missing_ok)
        policy = compaction_policy(mapping_field(self.task_id, "policy", self.policy))
        result = branch.compact(if_needed=self.if_needed, policy=policy)
        if result.compacted:
            self.log.info(
                "Compacted %s: %d entries and %d tombstones from %d sealed token(s), "
                "%d ranges written, %d reused, in %.2f s",
                self.branch,
                result.entries_applied,
                result.tombstones_removed,
                result.sealed_tokens,
                result.ranges_written,
                result.ranges_reused,
                result.seconds,
            )
        else:
            self.log.info("Not compacted (%s): %s", result.outcome, result.message)
        return {**dataclasses.asdict(result), "compacted": result.compacted}
