"""Operators that make commits: commit, merge, tag."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk.exceptions import AirflowFailException

from branchwater.engine import (
    AlreadyExists,
    AlreadyRecorded,
    ChangesDropped,
    InvalidArgument,
    MergeRaceLost,
    NoChanges,
    NotFound,
    check_flag,
)
from branchwater.plugin.links import BranchwaterCommitLink
from branchwater.plugin.operators.base import (
    LOOKUP_DEPTH,
    BranchwaterOperator,
    Lineage,
    LineageDataset,
    checked_where_declared,
    identity,
    keep_state,
    kept_state,
    made_earlier,
    mapping_field,
    run_metadata,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

    from branchwater.engine import Commit, MergeResult, Repository

HINT_KEY = "merge_hint"
"""Where a merge that lost every race leaves its hint: the task's state store, which outlives
the try (XCom does not: Airflow clears a task's XCom when its next try starts), and XCom,
for people reading the failed try."""
ATTEMPTS_KEY = "merge_attempts"
"""XCom key of how many tries the engine's merge took (1: it lost no race; 0: the
destination contained the source already, and this try merged nothing)."""
PUBLISH_ATTEMPTS = 5
"""How many previews a `preview_then_publish` merge publishes before it fails with the last
lost publish's hint (a destination moving that often is better waited out by a task retry)."""
FAST_FORWARD_KEY = "merge_fast_forward"
"""Where a `fast_forward` merge keeps the commit it moved its destination to (the task's
state store): a fast-forward records no commit for a retry to find."""
FAST_FORWARD_KEYS = ("dag_id", "run_id", "map_index")
"""The metadata naming the commits of one DAG run's map index: what a fast-forward merge
looks for in its source's history, the commit task of its run having made it."""
ON_NO_CHANGES = ("skip", "fail")
"""What a commit or merge that has nothing to record, and that this task did not make
earlier, does: succeed without a commit, or fail at once."""
TAG_KEY = "tag_target"
"""Where a tag task keeps the commit its `ref` named on the first try (the task's state
store): a retry after the tag landed finds it there though `ref`, a branch, moved since."""


class RecordingOperator(BranchwaterOperator):
    """A task that writes a commit, and so finds the one it made before when it has
    nothing new to record: a retry, or a rerun of its DAG run (cleared, backfilled) after
    later runs moved the branches on.

    :param on_no_changes: what to do when there is nothing to record and no earlier commit
        of this task instance is found: "skip" (default) succeeds without a commit, returning
        the commit that already holds the content; "fail" fails at once with `NoChanges`
    :param lookup_depth: how many of the newest commits of the branch (commit) or destination
        (merge) are searched for this task instance's earlier commit (default 1,000)
    """

    metadata: dict[str, str] | str
    """The subclass's `metadata` parameter: what its commit records besides Airflow's keys."""

    def __init__(
        self, *, on_no_changes: str = "skip", lookup_depth: int = LOOKUP_DEPTH, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        with checked_where_declared(self.task_id):
            if on_no_changes not in ON_NO_CHANGES:
                raise InvalidArgument(
                    f"on_no_changes must be one of {', '.join(ON_NO_CHANGES)}, "
                    f"not {on_no_changes!r}"
                )
            if (
                isinstance(lookup_depth, bool)
                or not isinstance(lookup_depth, int)
                or lookup_depth < 1
            ):
                raise InvalidArgument(
                    f"lookup_depth must be a positive number of commits, not {lookup_depth!r}"
                )
        self.on_no_changes = on_no_changes
        self.lookup_depth = lookup_depth

    def recorded_metadata(self, context: Context) -> dict[str, Any]:
        """`metadata` as rendered (`mapping_field`), with Airflow's keys naming this try."""
        return {**mapping_field(self.task_id, "metadata", self.metadata), **run_metadata(context)}

    def already_recorded(
        self, repo: Repository, ref: str, nothing: NoChanges, context: Context
    ) -> Commit:
        """The commit standing for this task's work when there is nothing new to record: the
        one this task instance made earlier in `ref`'s history, else (`on_no_changes="skip"`)
        `ref`'s HEAD, which holds the content already; `nothing` is raised otherwise."""
        earlier = made_earlier(repo, ref, context, self.lookup_depth)
        if earlier is not None:
            self.log.info("This task instance made this already, in %s: %s", ref, earlier.id)
            return earlier
        return self.without_commit(repo, ref, nothing)

    def without_commit(self, repo: Repository, ref: str, nothing: NoChanges) -> Commit:
        """`ref`'s HEAD, which holds the content already (`on_no_changes="skip"`), when this
        task instance made no commit for it; `nothing` is raised otherwise."""
        if self.on_no_changes == "fail":
            raise nothing
        head = repo.ref(ref).head()
        self.log.warning(
            "%s, and no commit of this task instance is among the last %d of %s: the content "
            "is there by other means (HEAD %s); no commit made",
            nothing,
            self.lookup_depth,
            ref,
            head.id,
        )
        return head


class BranchwaterCommitOperator(RecordingOperator):
    """Commit what is staged on `branch`; returns the commit id.

    The commit's metadata records the DAG, run, task, map index, try and logical date. When
    nothing is staged, a commit this task instance made earlier (a try that lost its worker,
    a run cleared and rerun after later runs) is found in the branch's history and is the
    result; without one, `on_no_changes` decides. When a concurrent commit on the branch
    recorded this task's writes (commits racing on one branch land as a group), that commit
    is the result. When the branch was reset (or deleted and re-created) while the commit was
    under way, the writes may be gone: the task fails without retries (`ChangesDropped`), as
    retrying the commit alone cannot bring them back.

    :param branch: the branch to commit (templated)
    :param message: the commit message (templated)
    :param metadata: metadata to record besides Airflow's own, a mapping or its JSON text
        (templated)
    :param committer: who the commit names (templated; default "airflow")
    :param allow_empty: commit even with nothing staged (default False)
    """

    template_fields: Sequence[str] = ("repository", "branch", "message", "metadata", "committer")
    operator_extra_links = (BranchwaterCommitLink(),)

    def __init__(
        self,
        *,
        branch: str,
        message: str,
        metadata: dict[str, str] | str | None = None,
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
                self.recorded_metadata(context),
                committer=self.committer,
                allow_empty=self.allow_empty,
            )
        except AlreadyRecorded as recorded:
            self.log.info("A concurrent commit recorded these writes: %s", recorded.commit_id)
            commit = repo.commit(recorded.commit_id)
        except ChangesDropped as dropped:
            raise AirflowFailException(f"ChangesDropped: {dropped}") from dropped
        except NoChanges as nothing:
            commit = self.already_recorded(repo, self.branch, nothing, context)
        self.record_commit(self.branch, commit.id)
        self.lineage = Lineage(outputs=(LineageDataset(repo.name, self.branch),))
        return commit.id


class BranchwaterMergeOperator(RecordingOperator):
    """Merge `source_ref` into `destination_branch` (default: the repository's default
    branch); returns the resulting commit id.

    A merge commit is written even where the destination could be fast-forwarded, so the
    destination's history records this task (its metadata holds the DAG, run, task, map index,
    try and logical date) with its `message` and `metadata`; `fast_forward=True` moves the
    destination to the source's commit instead, recording nothing. The engine retries lost
    races on the work it already did. When every attempt lost, the task fails keeping the
    engine's hint, and its next try resumes from that work instead of starting over, unless
    the source moved meanwhile. Conflicts fail the task without retries; `strategy` resolves
    them instead. The number of tries the engine took is in XCom under `merge_attempts`. When
    the destination already contains the source, the merge this task instance made earlier
    is found in the destination's history and is the result; without one, `on_no_changes`
    decides; `merge_attempts` is 0 then, as this try merged nothing.

    :param source_ref: the branch, tag or commit to merge (templated)
    :param destination_branch: the branch to merge into (templated; default: the
        repository's default branch)
    :param strategy: "source-wins" or "dest-wins" to resolve conflicts (templated; default:
        conflicts fail the task)
    :param message: the merge commit's message (templated; default "Merge <source> into
        <destination>" with commit ids)
    :param metadata: metadata to record besides Airflow's own, a mapping or its JSON text
        (templated)
    :param committer: who the merge commit names (templated; default "airflow")
    :param fast_forward: fast-forward the destination when it has not moved since the source
        branched, writing no merge commit (default False)
    :param preview_then_publish: build the merge as a preview and publish it (default
        False): the destination moves only if it has not moved since the preview, else the
        merge is previewed again from the lost publish's hint, up to `PUBLISH_ATTEMPTS`
        times, then the task fails keeping that hint, as a merge that lost every race does;
        with required checks on the destination, the preview's or the source's must pass
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
        metadata: dict[str, str] | str | None = None,
        committer: str = "airflow",
        fast_forward: bool = False,
        preview_then_publish: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        with checked_where_declared(self.task_id):
            check_flag("preview_then_publish", preview_then_publish)
            check_flag("fast_forward", fast_forward)
            if preview_then_publish and fast_forward:
                raise InvalidArgument(
                    "a preview is always a merge commit; preview_then_publish takes no fast_forward"
                )
        self.preview_then_publish = preview_then_publish
        self.source_ref = source_ref
        self.destination_branch = destination_branch
        self.strategy = strategy
        self.message = message
        self.metadata = metadata or {}
        self.committer = committer
        self.fast_forward = fast_forward

    def execute_on(self, repo: Repository, context: Context) -> str:
        into = self.destination_branch or repo.default_branch
        source_id = repo.ref(self.source_ref).commit_id
        hint = self._saved_hint(context, source_id, into)
        try:
            result = self.merge(repo, into, hint, context)
        except MergeRaceLost as lost:
            self._save_hint(context, lost.hint, source_id, into)
            raise
        except NoChanges as nothing:
            if self.fast_forward:
                commit = self.fast_forwarded_earlier(repo, into, nothing, context)
            else:
                commit = self.already_recorded(repo, into, nothing, context)
            attempts = 0
        else:
            commit, attempts = result.commit, result.attempts
            how = "fast-forward" if result.fast_forward else f"{attempts} attempt(s)"
            self.log.info("Merged (%s): %s", how, commit.id)
            if result.fast_forward:
                keep_state(
                    context, FAST_FORWARD_KEY, source=self.source_ref, into=into, commit=commit.id
                )
        context["ti"].xcom_push(key=ATTEMPTS_KEY, value=attempts)
        if hint:
            self._forget_hint(context)
        self.record_commit(into, commit.id)
        self.lineage = Lineage(
            inputs=(LineageDataset(repo.name, self.source_ref),),
            outputs=(LineageDataset(repo.name, into),),
        )
        return commit.id

    def fast_forwarded_earlier(
        self, repo: Repository, into: str, nothing: NoChanges, context: Context
    ) -> Commit:
        """What a `fast_forward` merge whose source `into` contains already stands for. A
        fast-forward records no commit, so neither `into`'s HEAD (later work may have landed
        since) nor the source's commit (a branch re-created from `into` by a rerun is at
        another run's commit) is it. In order: the merge commit this task instance made
        earlier, when `into` could not be fast-forwarded; the commit an earlier try
        fast-forwarded `into` to (the task's state store); the newest commit of the source's
        history that this DAG run made (same map index: a commit task's), which `into`
        contains. Without any, this task's work cannot be told from other work on `into`:
        `on_no_changes` decides, and the log says so."""
        earlier = made_earlier(repo, into, context, self.lookup_depth)
        if earlier is not None:
            self.log.info("This task instance merged this already, in %s: %s", into, earlier.id)
            return earlier
        kept = kept_state(context, FAST_FORWARD_KEY, source=self.source_ref, into=into)
        saved = kept.get("commit") if kept is not None else None
        if isinstance(saved, str) and self._contains(repo, into, saved):
            self.log.info("An earlier try fast-forwarded %s to %s", into, saved)
            return repo.commit(saved)
        ours = next(
            repo.log(
                self.source_ref,
                where=identity(context, FAST_FORWARD_KEYS),
                limit=1,
                depth=self.lookup_depth,
            ),
            None,
        )
        if ours is not None and self._contains(repo, into, ours.id):
            self.log.info(
                "%s contains %s, which this DAG run made on %s: it is this fast-forward's commit",
                into,
                ours.id,
                self.source_ref,
            )
            return ours
        self.log.warning(
            "Cannot tell which commit this task fast-forwarded %s to, if it did: no merge of "
            "this task instance among the last %d commits of %s, no fast-forward recorded by "
            "an earlier try, and no commit of this DAG run among the last %d of %s",
            into,
            self.lookup_depth,
            into,
            self.lookup_depth,
            self.source_ref,
        )
        return self.without_commit(repo, into, nothing)

    @staticmethod
    def _contains(repo: Repository, branch: str, commit_id: str) -> bool:
        """True when `commit_id` is in `branch`'s history."""
        try:
            return repo.merge_base(commit_id, branch).id == commit_id
        except NotFound:
            return False

    def merge(self, repo: Repository, into: str, hint: str | None, context: Context) -> MergeResult:
        """One merge through the engine, which retries lost races itself; with
        `preview_then_publish`, previews published, each lost publish's hint passed on."""
        if not self.preview_then_publish:
            return self._merge(repo, into, hint, context, preview=False)
        attempt = 1
        while True:
            preview = self._merge(repo, into, hint, context, preview=True)
            try:
                published = repo.publish(preview.commit.id, into)
            except MergeRaceLost as lost:
                if attempt >= PUBLISH_ATTEMPTS:
                    raise
                self.log.info("%s moved since the preview: previewing again", into)
                attempt, hint = attempt + 1, lost.hint
                continue
            self.log.info("Published the preview %s", published.commit.id)
            return dataclasses.replace(published, attempts=attempt)

    def _merge(
        self, repo: Repository, into: str, hint: str | None, context: Context, *, preview: bool
    ) -> MergeResult:
        return repo.merge(
            self.source_ref,
            into,
            self.strategy,
            message=self.message,
            metadata=self.recorded_metadata(context),
            committer=self.committer,
            hint=hint,
            fast_forward=self.fast_forward,
            preview=preview,
        )

    def _saved_hint(self, context: Context, source_id: str, into: str) -> str | None:
        saved = kept_state(context, HINT_KEY)
        if saved is None:
            return None
        if saved.get("source") != source_id or saved.get("into") != into:
            self.log.info("The source or destination changed since the last try: merging afresh")
            return None
        self.log.info("Resuming the merge of the last try from its hint")
        hint = saved.get("hint")
        return hint if isinstance(hint, str) else None

    def _save_hint(self, context: Context, hint: str, source_id: str, into: str) -> None:
        keep_state(context, HINT_KEY, hint=hint, source=source_id, into=into)
        context["ti"].xcom_push(key=HINT_KEY, value=hint)

    def _forget_hint(self, context: Context) -> None:
        store = context.get("task_state_store")
        if store is not None:
            store.delete(HINT_KEY)


class BranchwaterTagOperator(BranchwaterOperator):
    """Tag the commit `ref` points to; returns its id. `ref` is resolved once, on the first
    try, and kept in the task's state store: a retry finding the tag already at that commit
    succeeds, though `ref` (a branch) has moved on since; a tag at another commit fails at
    once.

    :param tag: the tag's name (templated)
    :param ref: the branch, tag or commit to tag (templated)
    """

    template_fields: Sequence[str] = ("repository", "tag", "ref")

    def __init__(self, *, tag: str, ref: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.tag = tag
        self.ref = ref

    def execute_on(self, repo: Repository, context: Context) -> str:
        commit_id = self.resolved_once(
            repo, self.ref, context, TAG_KEY, repository=repo.name, tag=self.tag
        )
        try:
            repo.tag(self.tag, commit_id)
        except AlreadyExists:
            existing = repo.ref(self.tag).commit_id
            if existing != commit_id:
                raise AlreadyExists(
                    f"tag {self.tag!r} of {repo.name!r} points to {existing[:12]}, not to "
                    f"{self.ref!r} ({commit_id[:12]})"
                ) from None
        self.lineage = Lineage(outputs=(LineageDataset(repo.name, self.tag),))
        return commit_id
