"""Operators that bring existing objects under a branch: zero-copy import."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from branchwater.engine import NoChanges
from branchwater.plugin.links import BranchwaterCommitLink
from branchwater.plugin.operators.base import Lineage, LineageDataset
from branchwater.plugin.operators.commits import RecordingOperator

if TYPE_CHECKING:
    from airflow.sdk import Context

    from branchwater.engine import Repository


class BranchwaterImportOperator(RecordingOperator):
    """Import every object under `source_uri` (`s3://bucket/prefix/` or `file:///dir/`,
    outside every repository's namespace) onto `branch` under `prefix`, without copying it,
    in one commit whose metadata records the DAG, run, task, map index, try and logical date.

    Returns `{"commit_id", "count", "bytes", "folder_markers"}` (the empty S3 objects
    ending in `/` that other tools write to show a folder, skipped and counted). The import
    converges: a retry (or a rerun) lists the source again and lands only what changed
    there; when nothing did, the commit this task instance made earlier is found in the
    branch's history and is the result (without one, `on_no_changes` decides). A source
    inside a namespace, or one that is missing or empty, fails the task without retries.

    :param branch: the branch to import onto (templated)
    :param source_uri: the prefix to import (templated)
    :param prefix: the path prefix the objects are imported under (templated; default: the
        root)
    :param message: the commit message (templated; default "Import <source> into <prefix>")
    :param metadata: metadata to record besides Airflow's own, a mapping or its JSON text
        (templated)
    :param committer: who the commit names (templated; default "airflow")
    """

    template_fields: Sequence[str] = (
        "repository",
        "branch",
        "source_uri",
        "prefix",
        "message",
        "metadata",
        "committer",
    )
    operator_extra_links = (BranchwaterCommitLink(),)

    def __init__(
        self,
        *,
        branch: str,
        source_uri: str,
        prefix: str = "",
        message: str | None = None,
        metadata: dict[str, str] | str | None = None,
        committer: str = "airflow",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.branch = branch
        self.source_uri = source_uri
        self.prefix = prefix
        self.message = message
        self.metadata = metadata or {}
        self.committer = committer

    def execute_on(self, repo: Repository, context: Context) -> dict[str, Any]:
        result = repo.branch(self.branch).import_objects(
            self.source_uri,
            prefix=self.prefix,
            commit_message=self.message,
            metadata=self.recorded_metadata(context),
            committer=self.committer,
            progress=lambda count: self.log.info("Listed %d object(s)", count),
        )
        commit = result.commit
        if commit is None:
            nothing = NoChanges(f"{self.branch!r} already holds every object of {self.source_uri}")
            commit = self.already_recorded(repo, self.branch, nothing, context)
        self.record_commit(self.branch, commit.id)
        self.lineage = Lineage(outputs=(LineageDataset(repo.name, self.branch),))
        if result.folder_markers:
            self.log.info("Skipped %d S3 folder marker(s)", result.folder_markers)
        return {
            "commit_id": commit.id,
            "count": result.count,
            "bytes": result.bytes,
            "folder_markers": result.folder_markers,
        }
