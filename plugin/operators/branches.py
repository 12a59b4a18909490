"""Operators that create and delete branches."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from branchwater.engine import AlreadyExists, DirtyBranch, NotFound
from branchwater.plugin.operators.base import (
    RUN_KEYS,
    BranchwaterOperator,
    Lineage,
    LineageDataset,
    declared_flag,
    keep_state,
    kept_state,
    made_by,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

    from branchwater.engine import Repository

TAKEN_KEY = "branch_taken"
"""Where a create-branch task keeps the branch it created, or took as it found it (the
task's state store): what is staged on it since is this DAG run's work, which its retries
and reruns carry on."""


class BranchwaterCreateBranchOperator(BranchwaterOperator):
    """Create `branch` at `source` (default: the repository's default branch).

    Returns the branch name, so mapped downstream tasks can take it as their input. A branch
    that exists already counts as created when an earlier try or run of this DAG run could
    have left it: one this task instance created or took before (its state store says so),
    one with a HEAD this DAG run committed, or, with nothing uncommitted on it, one at the
    commit `source` points to or at an older commit of `source` (nothing committed on it
    yet). At or behind `source` with uncommitted changes, it is another run's unfinished
    work (a load that failed before its commit), which this run's commit would take for
    its own: the task fails at once (`DirtyBranch`). Any other branch of that name fails
    it at once too (`AlreadyExists`).

    :param branch: the new branch's name (templated)
    :param source: the branch, tag or commit to start from (templated; default: the
        repository's default branch)
    """

    template_fields: Sequence[str] = ("repository", "branch", "source")

    def __init__(self, *, branch: str, source: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.branch = branch
        self.source = source

    def execute_on(self, repo: Repository, context: Context) -> str:
        source = self.source or repo.default_branch
        try:
            repo.create_branch(self.branch, source=source)
        except AlreadyExists:
            self._left_by_this_run(repo, source, context)
        keep_state(context, TAKEN_KEY, repository=repo.name, branch=self.branch)
        self.lineage = Lineage(
            inputs=(LineageDataset(repo.name, source),),
            outputs=(LineageDataset(repo.name, self.branch),),
        )
        return self.branch

    def _left_by_this_run(self, repo: Repository, source: str, context: Context) -> None:
        """Accept the existing branch if this DAG run may have left it; `DirtyBranch` or
        `AlreadyExists`."""
        if kept_state(context, TAKEN_KEY, repository=repo.name, branch=self.branch):
            self.log.info("Branch %s exists already: this task took it before", self.branch)
            return
        branch = repo.branch(self.branch)
        head = branch.head()
        wanted = repo.ref(source).commit_id
        if made_by(head, context, RUN_KEYS):
            self.log.info("Branch %s exists already, at this run's commit %s", self.branch, head.id)
        elif head.id == wanted or _contains(repo, wanted, head.id):
            if next(iter(branch.uncommitted()), None) is not None:
                raise DirtyBranch(
                    f"branch {self.branch!r} of {repo.name!r} exists on {source!r} "
                    f"({head.id[:12]}) with uncommitted changes this DAG run did not make "
                    "(another run's work that stopped before its commit): delete or reset "
                    "it, or name the branch per run (with {{ run_id }})"
                )
            self.log.info("Branch %s exists already, on %s (%s)", self.branch, source, head.id)
        else:
            raise AlreadyExists(
                f"branch {self.branch!r} of {repo.name!r} exists at {head.id[:12]}, which neither "
                f"{source!r} ({wanted[:12]}) holds nor this DAG run made: delete it or "
                "choose another name"
            )


def _contains(repo: Repository, commit_id: str, ancestor_id: str) -> bool:
    """True when `ancestor_id` is in `commit_id`'s history."""
    try:
        return repo.merge_base(commit_id, ancestor_id).id == ancestor_id
    except NotFound:  # unrelated histories
        return False


class BranchwaterDeleteBranchOperator(BranchwaterOperator):
    """Delete `branch` and what is staged on it.

    A missing branch fails the first try at once; on a retry it counts as deleted, since the
    failed try may have deleted it. `missing_ok=True` accepts a missing branch on every try.

    :param branch: the branch to delete (templated)
    :param missing_ok: succeed when the branch is not there (default False)
    """

    template_fields: Sequence[str] = ("repository", "branch")

    def __init__(self, *, branch: str, missing_ok: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.branch = branch
        self.missing_ok = declared_flag(self.task_id, "missing_ok", missing_ok)

    def execute_on(self, repo: Repository, context: Context) -> None:
        try:
            repo.delete_branch(self.branch)
        except NotFound:
            if not (self.missing_ok or context["ti"].try_number > 1):
                raise
            self.log.info("Branch %s of %s is gone already", self.branch, repo.name)
