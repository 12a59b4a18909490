"""Sensors on a branch: a new commit, compaction due. Each works in poke, reschedule or
deferrable mode; deferred, the wait runs in the triggerer (`plugin.triggers`)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue, conf
from airflow.sdk.exceptions import AirflowFailException, AirflowSensorTimeout, AirflowSkipException

from branchwater.engine import check_ref_name, check_repository_name
from branchwater.plugin.hooks import DEFAULT_CONN_ID, BranchwaterHook, compaction_policy
from branchwater.plugin.operators.base import (
    branch_or_skip,
    checked_where_declared,
    declared_flag,
    failing_at_once,
    mapping_field,
    resolved_later,
)
from branchwater.plugin.triggers import (
    BRANCH_GONE,
    DEFAULT_POLL_INTERVAL,
    FINAL,
    BranchwaterBranchTrigger,
    BranchwaterCommitTrigger,
    BranchwaterCompactionTrigger,
    compaction_status_record,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

SINCE_KEY = "since_commit"


class WaitFailed(Exception):
    """A deferred sensor's wait ended by an error a retry may fix (the lake unreachable, a
    connection the triggerer cannot read). Not an `AirflowException`: Airflow's
    `BaseSensorOperator.resume_execution` skips any of those a resumed sensor raises under
    `soft_fail`, where a poking sensor skips only a timeout or a failure without retries and
    leaves such an error to the retries; this keeps the deferred sensor to that rule."""


class BranchwaterBranchSensor(BaseSensorOperator):
    """Base of the sensors on one branch: the hook's lifetime and the deferrable mode.

    With `deferrable=True` the sensor pokes once on the worker; if it is not done, the wait
    moves to the trigger `trigger()` builds, paced by `poke_interval`, and the trigger's
    event ends it. Subclasses implement `poke`, `trigger` and `event_value`. A missing
    repository or branch fails the task at once, as it does an operator, whether the poke or
    the trigger finds it missing; `missing_ok`, where a sensor has it, skips the task when
    the branch is gone, and `soft_fail` skips it on a timeout and on any failure without
    retries, poked or deferred, while an error a retry may fix fails it for its retries
    either way. Deferred, the trigger ends the wait at the timeout itself (counted from the
    task's start, as a poking sensor counts it), and backs off as the pokes would with
    `exponential_backoff` (and `max_wait`).

    A repository or branch name the engine's rules refuse (`main..x`, `a b`) is no name
    the lake can ever have: it is refused (`InvalidOperatorArgument`) where the DAG declares
    the sensor, or once rendered when templated, before the lake is read; the task fails
    without its retries, saying what is wrong with the name, rather than as a branch not
    found, which `missing_ok` would skip.

    :param repository: the repository's name (templated)
    :param branch: the branch to watch (templated)
    :param branchwater_conn_id: the `branchwater` connection of the lake (default
        `branchwater_default`)
    :param deferrable: wait in the triggerer (default: `[operators] default_deferrable`)
    :param poke_interval: seconds between two looks (default 30)
    """

    template_fields: Sequence[str] = ("repository", "branch")
    ui_color = "#cfe8f3"
    waits_for = "the branch"
    """What the sensor waits for, in failure messages."""
    missing_ok = False
    """Skip the task when the branch is gone (a sensor that takes `missing_ok` sets it)."""

    def __init__(
        self,
        *,
        repository: str,
        branch: str,
        branchwater_conn_id: str = DEFAULT_CONN_ID,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poke_interval: float = DEFAULT_POLL_INTERVAL,
        **kwargs: Any,
    ) -> None:
        super().__init__(poke_interval=poke_interval, **kwargs)
        self.repository = repository
        self.branch = branch
        self.branchwater_conn_id = branchwater_conn_id
        self.deferrable = deferrable
        self._deadline: datetime | None = None
        """When a deferred wait times out: the task's start plus `timeout`."""
        self.check_names(declared=True)

    def check_names(self, *, declared: bool = False) -> None:
        """Refuse a repository or branch name the engine's rules refuse: where the DAG declares
        the sensor (`declared`) the names it gives as they are, once rendered all of them."""
        with checked_where_declared(self.task_id):
            if not (declared and resolved_later(self.repository)):
                check_repository_name(self.repository)
            if not (declared and resolved_later(self.branch)):
                check_ref_name(self.branch)

    @cached_property
    def hook(self) -> BranchwaterHook:
        return BranchwaterHook(self.branchwater_conn_id)

    def execute(self, context: Context) -> Any:
        started = datetime.now(timezone.utc)
        try:
            with self.failing_at_once_or_skipping():
                self.check_names()
                if not self.deferrable:
                    return super().execute(context)
                found = self.first_poke(context)
            if found.is_done:
                return found.xcom_value
            self._deadline = started + timedelta(seconds=float(self.timeout))
            self.defer(
                trigger=self.trigger(),
                method_name="execute_complete",
                timeout=max(self._deadline - datetime.now(timezone.utc), timedelta(0)),
            )
        finally:
            self.hook.close()

    @contextmanager
    def failing_at_once_or_skipping(self) -> Iterator[None]:
        """`failing_at_once`, but under `soft_fail` (or `never_fail`) its failure skips the
        task, as `BaseSensorOperator` skips a failure its poke raises or its trigger ends
        with: a branch missing when the sensor starts ends it as one deleted while it is
        deferred does, and a rendered name refused as a poke would have refused it."""
        try:
            with failing_at_once():
                yield
        except AirflowFailException as exc:
            if self.soft_fail or self.never_fail:
                reason = "soft_fail" if self.soft_fail else "never_fail"
                raise AirflowSkipException(f"Skipping due to {reason}: {exc}") from exc
            raise

    def first_poke(self, context: Context) -> PokeReturnValue:
        """A deferrable sensor's poke before it defers, outside Airflow's poke loop: under
        `never_fail` an error it raises skips the task, as it does in that loop."""
        try:
            return self.poke(context)
        except AirflowSkipException:
            raise
        except Exception as exc:
            if self.never_fail:
                raise AirflowSkipException(f"Skipping due to never_fail: {exc}") from exc
            raise

    def poke(self, context: Context) -> PokeReturnValue:
        raise NotImplementedError

    def trigger(self) -> BranchwaterBranchTrigger:
        """The trigger that waits in the triggerer, after a poke that was not done."""
        raise NotImplementedError

    def event_value(self, event: dict[str, Any]) -> Any:
        """The sensor's XCom value from its trigger's success event."""
        raise NotImplementedError

    def trigger_arguments(self) -> dict[str, Any]:
        return {
            "repository": self.repository,
            "branch": self.branch,
            "branchwater_conn_id": self.branchwater_conn_id,
            "poll_interval": float(self.poke_interval),
            "deadline": self._deadline,
            "exponential_backoff": bool(self.exponential_backoff),
            "max_wait": self.max_wait.total_seconds() if self.max_wait else None,
        }

    def execute_complete(self, context: Context, event: dict[str, Any]) -> Any:
        """The end of a deferred wait. A timeout raises `AirflowSensorTimeout`, as a poking
        sensor's does: `BaseSensorOperator.resume_execution` skips it under `soft_fail`, and
        otherwise it fails the task without retries."""
        status = event.get("status")
        if status == "timeout":
            raise AirflowSensorTimeout(
                f"Sensor has timed out: no {self.waits_for} on {self.branch!r} within the "
                f"specified timeout of {self.timeout} seconds."
            )
        if status != "success":
            raise self.wait_failed(event)
        return self.event_value(event)

    def wait_failed(self, event: dict[str, Any]) -> Exception:
        """What a trigger's error event raises, by its kind, as poke mode fails: a skip for a
        branch gone under `missing_ok`, a failure without retries for an error a retry
        cannot fix (as `failing_at_once` makes it in poke mode; `soft_fail` skips it), else
        `WaitFailed`, which the retries retry, `soft_fail` or not (`never_fail` skips it)."""
        reason = event.get("message", event)
        kind = event.get("error")
        if kind == BRANCH_GONE and self.missing_ok:
            return AirflowSkipException(f"{reason}: nothing to do")
        message = f"waiting for {self.waits_for} on {self.branch!r} failed: {reason}"
        if kind in (BRANCH_GONE, FINAL):
            return AirflowFailException(message)
        if self.never_fail:
            return AirflowSkipException(f"Skipping due to never_fail is set to True: {message}")
        return WaitFailed(message)


class BranchwaterCommitSensor(BranchwaterBranchSensor):
    """Wait until `branch` has a commit other than `since_commit` (any ref; default: the
    HEAD when the sensor first poked). Returns the new HEAD's commit id.

    The starting HEAD is kept in the task's state store, so reschedule mode and retries wait
    for the same commit.

    :param since_commit: the commit to wait past (templated; default: the first HEAD seen)
    """

    template_fields: Sequence[str] = ("repository", "branch", "since_commit")
    waits_for = "a commit"

    def __init__(self, *, since_commit: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.since_commit = since_commit
        self._waiting_past = ""

    def poke(self, context: Context) -> PokeReturnValue:
        repo = self.hook.repository(self.repository)
        head = repo.branch(self.branch).commit_id
        since = self._waiting_past = self._since(context, head)
        self.log.info("HEAD of %s is %s; waiting for a commit after %s", self.branch, head, since)
        return PokeReturnValue(is_done=head != since, xcom_value=head)

    def _since(self, context: Context, head: str) -> str:
        """The commit to wait past: `since_commit` resolved, else the first HEAD seen."""
        if self.since_commit:
            return self.hook.repository(self.repository).ref(self.since_commit).commit_id
        store = context.get("task_state_store")
        saved = store.get(SINCE_KEY) if store is not None else None
        if isinstance(saved, str):
            return saved
        if store is not None:
            store.set(SINCE_KEY, head)
        return head

    def trigger(self) -> BranchwaterCommitTrigger:
        return BranchwaterCommitTrigger(since_commit=self._waiting_past, **self.trigger_arguments())

    def event_value(self, event: dict[str, Any]) -> str:
        self.log.info("New commit on %s: %s", self.branch, event["commit_id"])
        return str(event["commit_id"])


class BranchwaterCompactionSensor(BranchwaterBranchSensor):
    """Wait until staging compaction is due on `branch`; returns the branch's figures and
    verdict (`staged_tombstones`, `sealed_tokens`, `reasons`, `due`, ...) as a dict.

    `policy` holds `CompactionPolicy` thresholds (`max_tombstones`, `max_sealed_tokens`,
    `scan_budget`, `guard_seconds`; templated, the engine's default where absent). Each poke
    costs a bounded scan of the branch's staging area. A branch that is gone fails the task,
    unless `missing_ok=True`, which skips it (a branch deleted after a DAG listed it).

    :param policy: the thresholds, as `BranchwaterCompactOperator` takes them (templated; a
        mapping or its JSON text)
    :param missing_ok: skip the task when the branch is gone (default False: fail)
    """

    template_fields: Sequence[str] = ("repository", "branch", "policy")
    waits_for = "compaction due"

    def __init__(
        self,
        *,
        policy: dict[str, Any] | str | None = None,
        missing_ok: bool = False,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.policy = policy or {}
        self.missing_ok = declared_flag(self.task_id, "missing_ok", missing_ok)

    def poke(self, context: Context) -> PokeReturnValue:
        branch = branch_or_skip(self.hook.repository(self.repository), self.branch, self.missing_ok)
        status = branch.compaction_status(compaction_policy(self.thresholds()))
        record = compaction_status_record(status)
        verdict = "due: " + "; ".join(status.reasons) if status.due else "not due"
        self.log.info(
            "Compaction on %s is %s (%d staged tombstones, %d sealed tokens%s)",
            self.branch,
            verdict,
            status.staged_tombstones,
            status.sealed_tokens,
            ", a compaction started recently" if status.guarded else "",
        )
        return PokeReturnValue(is_done=status.due, xcom_value=record)

    def thresholds(self) -> dict[str, Any]:
        """`policy` as rendered (`mapping_field`)."""
        return mapping_field(self.task_id, "policy", self.policy)

    def trigger(self) -> BranchwaterCompactionTrigger:
        return BranchwaterCompactionTrigger(policy=self.thresholds(), **self.trigger_arguments())

    def event_value(self, event: dict[str, Any]) -> dict[str, Any]:
        compaction: dict[str, Any] = event["compaction"]
        self.log.info("Compaction is due on %s: %s", self.branch, "; ".join(compaction["reasons"]))
        return compaction
