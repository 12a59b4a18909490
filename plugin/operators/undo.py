"""Operators that undo and redo history: revert, cherry-pick, reset a branch to a ref."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from branchwater.engine import (
    CHERRY_PICK_KEY,
    PARENT_KEY,
    REVERT_KEY,
    InvalidArgument,
    NoChanges,
)
from branchwater.plugin.links import BranchwaterCommitLink
from branchwater.plugin.operators.base import (
    BranchwaterOperator,
    Lineage,
    LineageDataset,
    checked_where_declared,
    identity,
    resolved_later,
)
from branchwater.plugin.operators.commits import RecordingOperator

if TYPE_CHECKING:
    from airflow.sdk import Context

    from branchwater.engine import Commit, Repository

PICK_KEY = "pick_target"
"""Where a revert or cherry-pick keeps the commit its `commit` named on the first try (the
task's state store): `commit="main"` names the revert itself once it has run, and a retry
must look for the revert of the commit the first try meant, not revert the revert."""
RESET_KEY = "reset_target"
"""Where a reset keeps the commit its `to` named on the first try (the task's state store):
`to="main~1"` names another commit once the reset has run, and a retry must not go further."""


class _PickOperator(RecordingOperator):
    """Revert and cherry-pick: a commit this task instance made on `branch` earlier (a try
    that lost its worker after the engine call, a rerun of the DAG run) reverting or picking
    the same commit against the same parent is the result, found before anything is merged,
    since doing it again would not always be a no-op (a revert of a commit whose paths
    changed since conflicts). `commit` is resolved once, on the first try, and kept in the
    task's state store, so that a retry looks for the work on the commit the first try
    meant (`commit="main"` names the revert itself by then)."""

    kind: Literal["revert", "cherry-pick"]
    template_fields: Sequence[str] = (
        "repository",
        "branch",
        "commit",
        "message",
        "metadata",
        "committer",
    )
    operator_extra_links = (BranchwaterCommitLink(),)

    def __init__(
        self,
        *,
        branch: str,
        commit: str,
        parent: int | None = None,
        message: str | None = None,
        metadata: dict[str, str] | str | None = None,
        committer: str = "airflow",
        allow_dirty: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.branch = branch
        self.commit = commit
        self.parent = parent
        self.message = message
        self.metadata = metadata or {}
        self.committer = committer
        self.allow_dirty = allow_dirty

    def execute_on(self, repo: Repository, context: Context) -> str:
        target = self._target(repo, context)
        made = self._made_earlier(repo, target, context)
        if made is not None:
            self.log.info(
                "This task instance made this %s of %s already: %s", self.kind, target, made.id
            )
        else:
            made = self._pick(repo, target, context)
        self.record_commit(self.branch, made.id)
        self.lineage = Lineage(
            inputs=(LineageDataset(repo.name, self.commit),),
            outputs=(LineageDataset(repo.name, self.branch),),
        )
        return made.id

    def _target(self, repo: Repository, context: Context) -> str:
        """The id of the commit to revert or pick, `commit` resolved once (`resolved_once`)."""
        return self.resolved_once(
            repo, self.commit, context, PICK_KEY, repository=repo.name, branch=self.branch
        )

    def _made_earlier(self, repo: Repository, target: str, context: Context) -> Commit | None:
        """The newest commit of `branch`'s history that this task instance made reverting or
        picking `target` against the same `parent` (its metadata says which: the engine's
        `branchwater.revert` / `branchwater.cherry_pick` and `branchwater.parent`), among the
        newest `lookup_depth`. A commit it made for another commit (a rerun given another
        one to undo) is not this work."""
        key = REVERT_KEY if self.kind == "revert" else CHERRY_PICK_KEY
        where = {**identity(context), key: target}
        parent = None if self.parent is None else str(self.parent)
        for made in repo.log(self.branch, where=where, depth=self.lookup_depth):
            if made.metadata.get(PARENT_KEY) == parent:
                return made
        return None

    def _pick(self, repo: Repository, target: str, context: Context) -> Commit:
        operation = repo.revert if self.kind == "revert" else repo.cherry_pick
        try:
            result = operation(
                self.branch,
                target,
                self.parent,
                message=self.message,
                metadata=self.recorded_metadata(context),
                committer=self.committer,
                allow_dirty=self.allow_dirty,
            )
        except NoChanges as nothing:
            return self.without_commit(repo, self.branch, nothing)
        self.log.info(
            "%s onto %s (%d attempt(s)): %s",
            self.kind,
            self.branch,
            result.attempts,
            result.commit.id,
        )
        return result.commit


class BranchwaterRevertOperator(_PickOperator):
    """Commit on `branch` the undoing of `commit`'s changes (merged three-way onto HEAD, so
    later changes to other paths stay); returns the new commit's id.

    The commit records the reverted id (`branchwater.revert`) and this task instance. A
    retry or rerun finds the revert this task instance made earlier in `branch`'s history
    and returns it instead of reverting again. A conflict (HEAD changed those paths since)
    and a protected branch fail the task at once; nothing to undo is `on_no_changes`' case.

    :param branch: the branch to commit the revert on (templated)
    :param commit: the commit to revert: any ref (templated, e.g. from XCom)
    :param parent: for a merge commit, the parent (1 or 2) whose side is kept, as git's -m
    :param message: the commit message (templated; default "Revert <id>: <message>")
    :param metadata: metadata to record besides Airflow's own (templated)
    :param committer: who the commit names (templated; default "airflow")
    :param allow_dirty: keep `branch`'s uncommitted changes staged above the revert instead
        of failing (default False)
    """

    kind = "revert"


class BranchwaterCherryPickOperator(_PickOperator):
    """Commit on `branch` the changes `commit` made against its parent; returns the new
    commit's id. The same arguments, records (`branchwater.cherry_pick`) and retry rules as
    `BranchwaterRevertOperator`.

    :param branch: the branch to commit on (templated)
    :param commit: the commit to pick: any ref (templated)
    :param parent: for a merge commit, the parent (1 or 2) its changes are taken against
    :param message: the commit message (templated; default: the picked commit's, noted)
    :param metadata: metadata to record besides Airflow's own (templated)
    :param committer: who the commit names (templated; default "airflow")
    :param allow_dirty: keep `branch`'s uncommitted changes staged above the new commit
    """

    kind = "cherry-pick"


class BranchwaterResetOperator(BranchwaterOperator):
    """Point `branch` at the commit `to` names, dropping its uncommitted changes (`git reset
    --hard`); returns that commit's id.

    The commit is resolved once, on the first try, and kept in the task's state store: a
    retry after the reset ran resets to the same commit, not to what `to` names by then
    (`main~1` has moved one commit back). A protected branch (`no_reset`) fails at once.

    :param branch: the branch to reset (templated)
    :param to: the branch, tag, commit id or `ref~N` to reset to (templated, or an upstream
        task's XCom: `.output`, a `@task`'s result)
    """

    template_fields: Sequence[str] = ("repository", "branch", "to")
    operator_extra_links = (BranchwaterCommitLink(),)

    def __init__(self, *, branch: str, to: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not resolved_later(to):
            with checked_where_declared(self.task_id):
                ref_named("to", to)
        self.branch = branch
        self.to = to

    def execute_on(self, repo: Repository, context: Context) -> str:
        branch = repo.branch(self.branch)
        target = self.resolved_once(
            repo,
            ref_named("to", self.to),
            context,
            RESET_KEY,
            repository=repo.name,
            branch=self.branch,
        )
        branch.reset(to=target)
        self.log.info("Reset %s to %s (%s)", self.branch, self.to, target)
        self.record_commit(self.branch, target)
        self.lineage = Lineage(
            inputs=(LineageDataset(repo.name, self.to),),
            outputs=(LineageDataset(repo.name, self.branch),),
        )
        return target


def ref_named(name: str, value: object) -> str:
    """A ref argument as given or rendered: text naming a ref."""
    if not isinstance(value, str) or not value:
        raise InvalidArgument(f"{name} must name a ref, not {value!r}")
    return value
