"""Operators that create and delete branches."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from branchwater.engine import AlreadyExists, NotFound
from branchwater.plugin.operators.base import BranchwaterOperator, Lineage, LineageDataset

if TYPE_CHECKING:
    from airflow.sdk import Context

    from branchwater.engine import Repository


class BranchwaterCreateBranchOperator(BranchwaterOperator):
    """Create `branch` at `source` (default: the repository's default branch).

    Returns the branch name, so mapped downstream tasks can take it as their input. A branch
    that already exists at the commit `source` points to counts as created: a retry of a try
    that created it succeeds.
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
            existing = repo.branch(self.branch).commit_id
            wanted = repo.ref(source).commit_id
            if existing != wanted:
                raise AlreadyExists(
                    f"branch {self.branch!r} of {repo.name!r} exists at {existing[:12]}, not at "
                    f"{source!r} ({wanted[:12]}): delete it or choose another name"
                ) from None
            self.log.info("Branch %s exists already at %s (%s)", self.branch, source, wanted)
        self.lineage = Lineage(
            inputs=(LineageDataset(repo.name, source),),
            outputs=(LineageDataset(repo.name, self.branch),),
        )
        return self.branch


class BranchwaterDeleteBranchOperator(BranchwaterOperator):
    """Delete `branch` and what is staged on it.

    A missing branch fails the first try; on a retry it counts as deleted, since the failed
    try may have deleted it. `missing_ok=True` accepts a missing branch on every try.
    """

    template_fields: Sequence[str] = ("repository", "branch")

    def __init__(self, *, branch: str, missing_ok: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.branch = branch
        self.missing_ok = missing_ok

    def execute_on(self, repo: Repository, context: Context) -> None:
        try:
            repo.delete_branch(self.branch)
        except NotFound:
            if not (self.missing_ok or context["ti"].try_number > 1):
                raise
            self.log.info("Branch %s of %s is gone already", self.branch, repo.name)
