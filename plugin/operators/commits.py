"""Operators that make commits: commit, merge, tag."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from branchwater.engine import AlreadyExists, MergeRaceLost, NoChanges
from branchwater.plugin.links import BranchwaterCommitLink
from branchwater.plugin.operators.base import (
    BranchwaterOperator,
    Lineage,
    LineageDataset,
    made_by_this_task,
    run_metadata,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

    from branchwater.engine import Commit, MergeResult, Repository

HINT_KEY = "merge_hint"
ATTEMPTS_KEY = "merge_attempts"
"""XCom key of how many tries the engine's merge took (1: it lost no race)."""
"""Where a merge that lost every race leaves its hint: the task's state store, which outlives
the try (XCom does not: Airflow clears a task's XCom when its next try starts), and XCom,
for people reading the failed try."""


class BranchwaterCommitOperator(BranchwaterOperator):
    """Commit what is staged on `branch`; returns the commit id.

    The commit's metadata records the DAG, run, task, map index, try and logical date. When
    nothing is staged because an earlier try of this task instance committed it, that
    commit is the result, so a retry after a lost worker succeeds.
    """

    template_fields: Sequence[str] = ("repository", "branch", "message", "metadata", "committer")
    operator_extra_links = (BranchwaterCommitLink(),)

    def __init__(
        self,
        *,
        branch: str,
        message: str,
        metadata: dict[str, str] | None = None,
        committer: str = "airflow",
        allow_empty: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.branch = branch
        self.message = message
        self.metadata = metadata or {}
        self.committer = committer
        self.allow_empty = allow_empty

    def execute_on(self, repo: Repository, context: Context) -> str:
        branch = repo.branch(self.branch)
        try:
            commit = branch.commit(
                self.message,
                {**self.metadata, **run_metadata(context)},
                committer=self.committer,
                allow_empty=self.allow_empty,
            )
        except NoChanges:
            commit = branch.head()
            if not made_by_this_task(commit, context):
                raise
            self.log.info("An earlier try committed this already: %s", commit.id)
        self.record_commit(self.branch, commit.id)
        self.lineage = Lineage(outputs=(LineageDataset(repo.name, self.branch),))
        return commit.id


class BranchwaterMergeOperator(BranchwaterOperator):
    """Merge `source_ref` into `destination_branch` (default: the repository's default
    branch); returns the resulting commit id.

    The engine retries lost races on the work it already did. When every attempt lost, the
    task fails keeping the engine's hint, and its next try resumes from that work instead of
    starting over, unless the source moved meanwhile. Conflicts fail the task without retries;
    `strategy` ("source-wins" or "dest-wins") resolves them instead. The number of tries the
    engine took is in XCom under `merge_attempts`.
    """

    template_fields: Sequence[str] = (
        "repository",
        "source_ref",
        "destination_branch",
        "strategy",
        "message",
        "metadata",
        "committer",
    )
    operator_extra_links = (BranchwaterCommitLink(),)

    def __init__(
        self,
        *,
        source_ref: str,
        destination_branch: str | None = None,
        strategy: str | None = None,
        message: str | None = None,
        metadata: dict[str, str] | None = None,
        committer: str = "airflow",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.source_ref = source_ref
        self.destination_branch = destination_branch
        self.strategy = strategy
        self.message = message
        self.metadata = metadata or {}
        self.committer = committer

    def execute_on(self, repo: Repository, context: Context) -> str:
        into = self.destination_branch or repo.default_branch
        source_id = repo.ref(self.source_ref).commit_id
        hint = self._saved_hint(context, source_id, into)
        try:
            result = self.merge(repo, into, hint, context)
            commit = result.commit
            self.log.info("Merged in %d attempt(s): %s", result.attempts, commit.id)
            context["ti"].xcom_push(key=ATTEMPTS_KEY, value=result.attempts)
        except MergeRaceLost as lost:
            self._save_hint(context, lost.hint, source_id, into)
            raise
        except NoChanges:
            commit = self._merged_earlier(repo, into, source_id, context)
        if hint:
            self._forget_hint(context)
        self.record_commit(into, commit.id)
        self.lineage = Lineage(
            inputs=(LineageDataset(repo.name, self.source_ref),),
            outputs=(LineageDataset(repo.name, into),),
        )
        return commit.id

    def merge(self, repo: Repository, into: str, hint: str | None, context: Context) -> MergeResult:
        """One merge through the engine, which retries lost races itself."""
        return repo.merge(
            self.source_ref,
            into,
            self.strategy,
            message=self.message,
            metadata={**self.metadata, **run_metadata(context)},
            committer=self.committer,
            hint=hint,
        )

    def _merged_earlier(
        self, repo: Repository, into: str, source_id: str, context: Context
    ) -> Commit:
        """The commit an earlier try of this task made, when the destination holds it."""
        head = repo.branch(into).head()
        if head.id != source_id and not made_by_this_task(head, context):
            raise NoChanges(f"{into!r} already contains {self.source_ref!r}")
        self.log.info("An earlier try merged this already: %s", head.id)
        return head

    def _saved_hint(self, context: Context, source_id: str, into: str) -> str | None:
        store = context.get("task_state_store")
        saved = store.get(HINT_KEY) if store is not None else None
        if not isinstance(saved, dict):
            return None
        if saved.get("source") != source_id or saved.get("into") != into:
            self.log.info("The source or destination changed since the last try: merging afresh")
            return None
        self.log.info("Resuming the merge of the last try from its hint")
        hint = saved.get("hint")
        return hint if isinstance(hint, str) else None

    def _save_hint(self, context: Context, hint: str, source_id: str, into: str) -> None:
        store = context.get("task_state_store")
        if store is not None:
            store.set(HINT_KEY, {"hint": hint, "source": source_id, "into": into})
        context["ti"].xcom_push(key=HINT_KEY, value=hint)

    def _forget_hint(self, context: Context) -> None:
        store = context.get("task_state_store")
        if store is not None:
            store.delete(HINT_KEY)


class BranchwaterTagOperator(BranchwaterOperator):
    """Tag the commit `ref` points to; returns its id. A retry finding the tag already at
    that commit succeeds."""

    template_fields: Sequence[str] = ("repository", "tag", "ref")

    def __init__(self, *, tag: str, ref: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tag = tag
        self.ref = ref

    def execute_on(self, repo: Repository, context: Context) -> str:
        commit_id = repo.ref(self.ref).commit_id
        try:
            repo.tag(self.tag, self.ref)
        except AlreadyExists:
            existing = repo.ref(self.tag).commit_id
            if existing != commit_id:
                raise AlreadyExists(
                    f"tag {self.tag!r} of {repo.name!r} points to {existing[:12]}, not to "
                    f"{self.ref!r} ({commit_id[:12]})"
                ) from None
        self.lineage = Lineage(outputs=(LineageDataset(repo.name, self.tag),))
        return commit_id
