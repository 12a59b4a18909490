"""Operators that record checks on commits: the audit step of write-audit-publish."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from branchwater.plugin.operators.base import (
    BranchwaterOperator,
    Lineage,
    LineageDataset,
    mapping_field,
    rendered_flag,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

    from branchwater.engine import Repository


class BranchwaterRecordCheckOperator(BranchwaterOperator):
    """Record check `name` on the commit `commit` names (a merge preview's id from XCom, a
    branch's HEAD), passed or failed, with `details`; returns the check as a dict.

    Checks are immutable. A retry recording the same result again succeeds with the stored
    check; a different result (the data or the suite changed between tries) fails the task
    at once with `AlreadyExists`, naming when and by whom the first was recorded: record
    the new result on a new commit. A failed check is recorded like a passed one and the
    task succeeds: the merge it gates is what refuses.

    :param commit: the commit to record on: any ref (templated; e.g.
        "{{ ti.xcom_pull('preview') }}")
    :param name: the check's name, as protection rules require it (templated)
    :param passed: True or False, or their text from a template ("True", "false")
    :param details: a small JSON object (figures, a link to the full report), or its JSON
        text from a template (templated; at most 16 KiB)
    :param recorded_by: who the check names (templated; default the task instance,
        "airflow:<dag_id>/<run_id>/<task_id>")
    """

    template_fields: Sequence[str] = (
        "repository",
        "commit",
        "name",
        "passed",
        "details",
        "recorded_by",
    )

    def __init__(
        self,
        *,
        commit: str,
        name: str,
        passed: bool | str,
        details: dict[str, Any] | str | None = None,
        recorded_by: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.commit = commit
        self.name = name
        self.passed = passed
        self.details = details
        self.recorded_by = recorded_by

    def execute_on(self, repo: Repository, context: Context) -> dict[str, Any]:
        ti = context["ti"]
        by = self.recorded_by or f"airflow:{ti.dag_id}/{ti.run_id}/{ti.task_id}"
        check = repo.record_check(
            self.commit,
            self.name,
            rendered_flag("passed", self.passed),
            mapping_field(self.task_id, "details", self.details),
            by=by,
        )
        verdict = "passed" if check.passed else "failed"
        self.log.info("Check %s %s on %s", check.name, verdict, check.commit_id)
        self.lineage = Lineage(inputs=(LineageDataset(repo.name, check.commit_id),))
        return {
            "commit_id": check.commit_id,
            "name": check.name,
            "passed": check.passed,
            "details": check.details,
            "recorded_at": check.recorded_at.isoformat(),
            "recorded_by": check.recorded_by,
        }
