"""Sensors: wait for a new commit on a branch, in poke, reschedule or deferrable mode."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue, conf
from airflow.sdk.exceptions import AirflowException

from branchwater.plugin.hooks import DEFAULT_CONN_ID, BranchwaterHook
from branchwater.plugin.triggers import DEFAULT_POLL_INTERVAL, BranchwaterCommitTrigger

if TYPE_CHECKING:
    from airflow.sdk import Context

SINCE_KEY = "since_commit"


class BranchwaterCommitSensor(BaseSensorOperator):
    """Wait until `branch` has a commit other than `since_commit` (any ref; default: the
    HEAD when the sensor first poked). Returns the new HEAD's commit id.

    The starting HEAD is kept in the task's state store, so reschedule mode and retries wait
    for the same commit. With `deferrable=True` the wait runs in the triggerer and frees the
    worker slot; `poke_interval` paces the trigger's polls too.
    """

    template_fields: Sequence[str] = ("repository", "branch", "since_commit")
    ui_color = "#cfe8f3"

    def __init__(
        self,
        *,
        repository: str,
        branch: str,
        since_commit: str | None = None,
        branchwater_conn_id: str = DEFAULT_CONN_ID,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        poke_interval: float = DEFAULT_POLL_INTERVAL,
        **kwargs: Any,
    ) -> None:
        super().__init__(poke_interval=poke_interval, **kwargs)
        self.repository = repository
        self.branch = branch
        self.since_commit = since_commit
        self.branchwater_conn_id = branchwater_conn_id
        self.deferrable = deferrable
        self._waiting_past = ""

    @cached_property
    def hook(self) -> BranchwaterHook:
        return BranchwaterHook(self.branchwater_conn_id)

    def execute(self, context: Context) -> Any:
        try:
            if not self.deferrable:
                return super().execute(context)
            found = self.poke(context)
            if found.is_done:
                return found.xcom_value
            self.defer(
                trigger=BranchwaterCommitTrigger(
                    repository=self.repository,
                    branch=self.branch,
                    since_commit=self._waiting_past,
                    branchwater_conn_id=self.branchwater_conn_id,
                    poll_interval=float(self.poke_interval),
                ),
                method_name="execute_complete",
                timeout=timedelta(seconds=float(self.timeout)),
            )
        finally:
            self.hook.close()

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

    def execute_complete(self, context: Context, event: dict[str, Any]) -> str:
        if event.get("status") != "success":
            reason = event.get("message", event)
            raise AirflowException(f"waiting for a commit on {self.branch!r} failed: {reason}")
        self.log.info("New commit on %s: %s", self.branch, event["commit_id"])
        return str(event["commit_id"])
