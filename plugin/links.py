"""Extra links: the page of the commit a task made.

Airflow 3 computes a task's links on the worker when the task ends and keeps them in XCom,
so the link reads what the operator recorded while it ran, with no second lookup.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from airflow.sdk import BaseOperatorLink

if TYPE_CHECKING:
    from airflow.sdk import BaseOperator
    from airflow.sdk.types import TaskInstanceKey


class BranchwaterCommitLink(BaseOperatorLink):
    """The commit made by a commit or merge task, from the connection's link template: by
    default the commit's page in the Branchwater view of Airflow's UI (`plugin/ui/`)."""

    name = "Branchwater commit"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        url = getattr(operator, "commit_url", "")
        return url if isinstance(url, str) else ""


class BranchwaterGCReportLink(BaseOperatorLink):
    """The HTML report of the GC run a report task pointed at (a `file://` or `s3://` URI)."""

    name = "GC report"

    def get_link(self, operator: BaseOperator, *, ti_key: TaskInstanceKey) -> str:
        url = getattr(operator, "report_url", "")
        return url if isinstance(url, str) else ""
