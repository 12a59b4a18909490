"""Triggers: a deferred sensor's wait for a new commit, and new commits as asset events.

Both poll the branch's HEAD. The engine is synchronous, so each poll runs in a worker thread
and the wait between polls is an `asyncio.sleep`: the triggerer's event loop is never
blocked. The connection is read in that thread too, as the triggerer allows.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseEventTrigger, BaseTrigger, TriggerEvent

from branchwater.plugin.hooks import DEFAULT_CONN_ID, BranchwaterHook

DEFAULT_POLL_INTERVAL = 30.0


def head_commit_id(hook: BranchwaterHook, repository: str, branch: str) -> str:
    return hook.repository(repository).branch(branch).commit_id


async def wait_for_new_head(
    hook: BranchwaterHook, repository: str, branch: str, since: str, poll_interval: float
) -> str:
    """The branch's HEAD, once it is no longer `since`."""
    while True:
        head = await asyncio.to_thread(head_commit_id, hook, repository, branch)
        if head != since:
            return head
        await asyncio.sleep(poll_interval)


class BranchwaterCommitTrigger(BaseTrigger):
    """Fires once `branch` has a HEAD other than `since_commit`.

    The event's payload is `{"status": "success", "commit_id": ...}`, or `{"status":
    "error", "message": ...}` when the wait failed (unknown repository or branch, missing
    connection), so the deferred task, not the triggerer, reports the failure.
    """

    def __init__(
        self,
        *,
        repository: str,
        branch: str,
        since_commit: str,
        branchwater_conn_id: str = DEFAULT_CONN_ID,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
    ) -> None:
        super().__init__()
        self.repository = repository
        self.branch = branch
        self.since_commit = since_commit
        self.branchwater_conn_id = branchwater_conn_id
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "repository": self.repository,
                "branch": self.branch,
                "since_commit": self.since_commit,
                "branchwater_conn_id": self.branchwater_conn_id,
                "poll_interval": self.poll_interval,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = BranchwaterHook(self.branchwater_conn_id)
        try:
            head = await wait_for_new_head(
                hook, self.repository, self.branch, self.since_commit, self.poll_interval
            )
            yield TriggerEvent({"status": "success", "commit_id": head})
        except Exception as exc:  # reported by the task, with the reason
            yield TriggerEvent({"status": "error", "message": f"{type(exc).__name__}: {exc}"})
        finally:
            await asyncio.to_thread(hook.close)


class BranchwaterCommitEventTrigger(BaseEventTrigger):
    """An event for every new HEAD of `branch`, for an `AssetWatcher`.

    ```python
    trigger = BranchwaterCommitEventTrigger(repository="sales", branch="main")
    asset = Asset("sales_main", watchers=[AssetWatcher(name="sales_main", trigger=trigger)])
    ```

    A DAG scheduled on that asset runs when the branch gets a commit. The payload names the
    repository, branch, `commit_id` and `previous_commit_id`; commits landing between two
    polls make one event. The last HEAD reported is kept in the asset's state store once the
    triggerer moved past its event, so a restarted trigger reports what landed while it was
    down, and an event it was stopped right after is reported again (at least once). A
    trigger started afresh (or watching for several assets) starts from the current HEAD.
    """

    def __init__(
        self,
        *,
        repository: str,
        branch: str,
        branchwater_conn_id: str = DEFAULT_CONN_ID,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
    ) -> None:
        super().__init__()
        self.repository = repository
        self.branch = branch
        self.branchwater_conn_id = branchwater_conn_id
        self.poll_interval = poll_interval

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{type(self).__module__}.{type(self).__qualname__}",
            {
                "repository": self.repository,
                "branch": self.branch,
                "branchwater_conn_id": self.branchwater_conn_id,
                "poll_interval": self.poll_interval,
            },
        )

    @property
    def _state_key(self) -> str:
        return f"branchwater:{self.branchwater_conn_id}:{self.repository}:{self.branch}:head"

    async def _last_seen(self) -> str | None:
        store = getattr(self, "asset_state_store", None)
        if store is None:
            return None
        try:
            value = await store.aget(self._state_key)
        except ValueError:  # several assets share this trigger: no single place to keep it
            return None
        return value if isinstance(value, str) else None

    async def _remember(self, commit_id: str) -> None:
        store = getattr(self, "asset_state_store", None)
        if store is None:
            return
        try:
            await store.aset(self._state_key, commit_id)
        except ValueError:
            return

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = BranchwaterHook(self.branchwater_conn_id)
        try:
            last = await self._last_seen()
            if last is None:
                last = await asyncio.to_thread(head_commit_id, hook, self.repository, self.branch)
                await self._remember(last)
            while True:
                head = await wait_for_new_head(
                    hook, self.repository, self.branch, last, self.poll_interval
                )
                yield TriggerEvent(
                    {
                        "repository": self.repository,
                        "branch": self.branch,
                        "commit_id": head,
                        "previous_commit_id": last,
                    }
                )
                last = head
                await self._remember(head)
        finally:
            await asyncio.to_thread(hook.close)
