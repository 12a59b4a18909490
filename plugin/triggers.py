"""Triggers: a deferred sensor's wait on a branch (a new commit, compaction due), and new
commits as asset events.

All of them poll the branch. The engine is synchronous, so each poll runs in a worker thread
and the wait between polls is an `asyncio.sleep`: the triggerer's event loop is never
blocked. The connection is read in that thread too, as the triggerer allows.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import datetime, timedelta, timezone
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

from airflow.triggers.base import BaseEventTrigger, BaseTrigger, TriggerEvent

from branchwater.engine import (
    InvalidName,
    LakeNotFound,
    NotFound,
    Unavailable,
    check_ref_name,
    check_repository_name,
)
from branchwater.plugin.hooks import DEFAULT_CONN_ID, BranchwaterHook, compaction_policy
from branchwater.plugin.operators.base import FINAL_ERRORS

if TYPE_CHECKING:
    from branchwater.engine import Branch, CompactionStatus

DEFAULT_POLL_INTERVAL = 30.0
MAX_MISSING_BACKOFF = 300.0
"""The longest wait (seconds) of the event trigger between polls of a branch that is gone, or
of a lake that is not there or cannot be reached."""
T = TypeVar("T")

BRANCH_GONE = "branch_gone"
FINAL = "final"
RETRYABLE = "retryable"
"""The kinds of a failed wait, in its event's `error`: the branch is gone (from a repository
that is there), another error a retry cannot fix (`FINAL_ERRORS`), or one it may."""


class BranchGone(NotFound):
    """The branch a trigger waits on is not there, though its repository is."""


def watched_branch(hook: BranchwaterHook, repository: str, branch: str) -> Branch:
    """The branch; `BranchGone` when its repository is there and it is not."""
    repo = hook.repository(repository)
    try:
        return repo.branch(branch)
    except NotFound as exc:
        raise BranchGone(str(exc)) from exc


LAKE = "lake"
BRANCH = "branch"
"""What the event trigger waits for when it cannot read its branch: the lake (not there, or
not reachable), or the branch (or its repository)."""


def waited_for(exc: Exception) -> str | None:
    """What the event trigger waits to come back when reading its branch raised `exc`
    (`LAKE` or `BRANCH`), or None for an error that waiting does not fix."""
    if isinstance(exc, LakeNotFound | Unavailable):
        return LAKE
    if isinstance(exc, NotFound):
        return BRANCH
    return None


def error_kind(exc: Exception) -> str:
    if isinstance(exc, BranchGone):
        return BRANCH_GONE
    return FINAL if isinstance(exc, FINAL_ERRORS) else RETRYABLE


def head_commit_id(hook: BranchwaterHook, repository: str, branch: str) -> str:
    return watched_branch(hook, repository, branch).commit_id


def compaction_status_record(status: CompactionStatus) -> dict[str, Any]:
    """A branch's compaction figures and verdict as plain JSON values, for XCom and events."""
    return {**dataclasses.asdict(status), "reasons": list(status.reasons), "due": status.due}


def compaction_if_due(
    hook: BranchwaterHook, repository: str, branch: str, policy: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """The branch's compaction status when compaction is due on it, else None."""
    status = watched_branch(hook, repository, branch).compaction_status(compaction_policy(policy))
    return compaction_status_record(status) if status.due else None


async def poll(
    check: Callable[[], T | None],
    interval: Callable[[int], float],
    deadline: datetime | None = None,
) -> T | None:
    """`check()`'s first answer other than None, asked in a thread, `interval(n)` seconds
    after its n-th answer; None once `deadline` has passed without one (it is asked once more
    at the deadline)."""
    asked = 0
    while True:
        found = await asyncio.to_thread(check)
        if found is not None:
            return found
        asked += 1
        wait = interval(asked)
        if deadline is not None:
            left = (deadline - datetime.now(timezone.utc)).total_seconds()
            if left <= 0:
                return None
            wait = min(wait, left)
        await asyncio.sleep(wait)


MAX_BACKOFF_DOUBLINGS = 64
"""Past this many doublings a backoff wait is years long already; Airflow's own computation
overflows a float past about a thousand (a long wait capped by `max_wait`)."""


def backoff_wait(interval: float, count: int, seed: str, max_wait: float | None = None) -> float:
    """The wait after the `count`-th look with exponential backoff, as Airflow's
    `BaseSensorOperator._get_next_poke_interval` computes a poking sensor's (`seed` standing
    for its `dag_id#task_id#started_at`): doubling from half of `interval`, whole seconds,
    at least one, plus a jitter of up to as much again drawn from `seed` and `count` (so
    sensors started together do not look together), at most `max_wait` when given."""
    least = max(int(interval * 2 ** min(count - 2, MAX_BACKOFF_DOUBLINGS)), 1)
    drawn = int(hashlib.sha1(f"{seed}#{count}".encode(), usedforsecurity=False).hexdigest(), 16)
    wait = min(least + drawn % least, timedelta.max.total_seconds() - 1)
    return min(max_wait, wait) if max_wait else wait


def classpath(trigger: object) -> str:
    return f"{type(trigger).__module__}.{type(trigger).__qualname__}"


class BranchPolling:
    """What every Branchwater trigger polls (a branch, through a connection, every
    `poll_interval` seconds), and how it is serialized; mixed into a trigger class."""

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

    def arguments(self) -> dict[str, Any]:
        """What `serialize` records: the keyword arguments that rebuild this trigger."""
        return {
            "repository": self.repository,
            "branch": self.branch,
            "branchwater_conn_id": self.branchwater_conn_id,
            "poll_interval": self.poll_interval,
        }

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return classpath(self), self.arguments()


class BranchwaterBranchTrigger(BranchPolling, BaseTrigger):
    """A deferred sensor's wait on a branch: fires once `check` finds what it waits for.

    The event's payload is `{"status": "success", **found}`; `{"status": "timeout"}` once
    `deadline` (an aware datetime, the sensor's timeout) has passed without it; or
    `{"status": "error", "error": <its kind>, "message": ...}` when the wait failed (unknown
    repository, a branch deleted meanwhile, missing connection), so the deferred task, not
    the triggerer, reports the failure, as poke mode would: the kind (`BRANCH_GONE`, `FINAL`,
    `RETRYABLE`) says whether to skip, fail at once or retry. With `exponential_backoff` the
    polls back off as the sensor's pokes would (`backoff_wait`, at most `max_wait` seconds
    apart when given); otherwise they are `poll_interval` apart. The deferral's timeout, which
    the scheduler enforces, ends the wait then too; the trigger's own makes it end where no
    scheduler watches (`dag.test()` runs the trigger in line, never timing it out), and at
    the deadline rather than at the scheduler's next check. Subclasses add their arguments
    in `arguments` and answer `check` (run in a thread).
    """

    def __init__(
        self,
        *,
        deadline: datetime | None = None,
        exponential_backoff: bool = False,
        max_wait: float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if deadline is not None and deadline.tzinfo is None:
            raise ValueError(f"deadline must be an aware datetime, not {deadline!r}")
        self.deadline = deadline
        self.exponential_backoff = exponential_backoff
        self.max_wait = max_wait

    def arguments(self) -> dict[str, Any]:
        return {
            **super().arguments(),
            "deadline": self.deadline,
            "exponential_backoff": self.exponential_backoff,
            "max_wait": self.max_wait,
        }

    def interval(self, count: int) -> float:
        """The seconds between the `count`-th poll and the next."""
        if not self.exponential_backoff:
            return self.poll_interval
        seed = f"{self.repository}#{self.branch}#{self.deadline}"
        wait = backoff_wait(self.poll_interval, count, seed, self.max_wait)
        self.log.info("Polling branch %r again in %gs (exponential backoff)", self.branch, wait)
        return wait

    def check(self, hook: BranchwaterHook) -> dict[str, Any] | None:
        """The event's payload once the wait is over, else None."""
        raise NotImplementedError

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = BranchwaterHook(self.branchwater_conn_id)
        try:
            found = await poll(partial(self.check, hook), self.interval, self.deadline)
            if found is None:
                yield TriggerEvent({"status": "timeout"})
            else:
                yield TriggerEvent({"status": "success", **found})
        except Exception as exc:  # reported by the task, with the reason
            yield TriggerEvent(
                {
                    "status": "error",
                    "error": error_kind(exc),
                    "message": f"{type(exc).__name__}: {exc}",
                }
            )
        finally:
            await asyncio.to_thread(hook.close)


class BranchwaterCommitTrigger(BranchwaterBranchTrigger):
    """Fires once `branch` has a HEAD other than `since_commit`: `{"commit_id": ...}`."""

    def __init__(self, *, since_commit: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.since_commit = since_commit

    def arguments(self) -> dict[str, Any]:
        return {**super().arguments(), "since_commit": self.since_commit}

    def check(self, hook: BranchwaterHook) -> dict[str, Any] | None:
        head = head_commit_id(hook, self.repository, self.branch)
        return {"commit_id": head} if head != self.since_commit else None


class BranchwaterCompactionTrigger(BranchwaterBranchTrigger):
    """Fires once staging compaction is due on `branch` under `policy` (thresholds as
    `CompactionPolicy` takes them; the engine's defaults where absent): `{"compaction":
    <the branch's figures and verdict>}`."""

    def __init__(self, *, policy: dict[str, Any] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.policy = dict(policy or {})

    def arguments(self) -> dict[str, Any]:
        return {**super().arguments(), "policy": self.policy}

    def check(self, hook: BranchwaterHook) -> dict[str, Any] | None:
        due = compaction_if_due(hook, self.repository, self.branch, self.policy)
        return {"compaction": due} if due is not None else None


class BranchwaterCommitEventTrigger(BranchPolling, BaseEventTrigger):
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

    A branch or repository that is not there (deleted, not created yet), or a lake that is
    not there (`LakeNotFound`) or cannot be reached (`Unavailable`: its KV store down for a
    while), does not end the trigger: ending it, or raising, would have the triggerer start it
    again at once, in a loop that logs an error every time and never notices the branch come
    back. The trigger logs a warning once for what it waits for, polls with a wait doubling
    from `poll_interval` up to ten of them (at most five minutes), and watches the branch
    again once it can read it, an event reporting its HEAD if it is not the last one reported
    (a trigger that never saw the branch starts from the HEAD it finds). A mistake no wait
    fixes ends it with its error: a repository or branch name the engine's rules refuse is
    refused when the trigger is made (where the DAG declares it), a connection that is
    malformed (a KV URL the engine cannot use) ends it when it starts. Other errors (the
    connection not defined) end the trigger too, and the triggerer logs them.
    """

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        try:
            check_repository_name(self.repository)
            check_ref_name(self.branch)
        except InvalidName as exc:
            raise InvalidName(f"{exc}; the trigger would wait for it forever") from None

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

    @property
    def _max_backoff(self) -> float:
        """The longest wait between polls of a branch (or repository, or lake) that is gone
        or out of reach: ten poll intervals, at most `MAX_MISSING_BACKOFF`, never less than
        one."""
        return max(self.poll_interval, min(10 * self.poll_interval, MAX_MISSING_BACKOFF))

    async def _head(self, hook: BranchwaterHook, other_than: str | None) -> str:
        """The branch's HEAD once it is other than `other_than` (any HEAD when None), polled
        every `poll_interval` seconds. While the branch or its repository is gone, or the
        lake is not there or cannot be reached, the trigger waits for it to come back: it
        says so once in the log (again only if what it waits for changes), then polls with a
        wait doubling up to `_max_backoff`, and says so again when it reads the branch."""
        waiting: str | None = None
        wait = self.poll_interval
        while True:
            try:
                head = await asyncio.to_thread(head_commit_id, hook, self.repository, self.branch)
            except Exception as exc:
                missing = waited_for(exc)
                if missing is None:
                    raise
                if missing != waiting:
                    self._say_unwatchable(missing, exc)
                waiting = missing
                await asyncio.sleep(wait)
                wait = min(wait * 2, self._max_backoff)
                continue
            if waiting is not None:
                self._say_watching_again(waiting, head)
                waiting, wait = None, self.poll_interval
            if head != other_than:
                return head
            await asyncio.sleep(self.poll_interval)

    def _say_unwatchable(self, missing: str, exc: Exception) -> None:
        if missing == LAKE:
            self.log.warning(
                "The lake of connection %r cannot be reached (%s: %s): watching branch %r of "
                "repository %r once it can be, polling at most every %gs",
                self.branchwater_conn_id,
                type(exc).__name__,
                exc,
                self.branch,
                self.repository,
                self._max_backoff,
            )
            return
        self.log.warning(
            "Branch %r of repository %r cannot be watched (%s: %s): waiting for it to be there "
            "again, polling at most every %gs",
            self.branch,
            self.repository,
            type(exc).__name__,
            exc,
            self._max_backoff,
        )

    def _say_watching_again(self, missing: str, head: str) -> None:
        if missing == LAKE:
            self.log.info(
                "The lake of connection %r is back: watching branch %r of repository %r, at %s",
                self.branchwater_conn_id,
                self.branch,
                self.repository,
                head,
            )
            return
        self.log.info(
            "Branch %r of repository %r is there again, at %s: watching it",
            self.branch,
            self.repository,
            head,
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        hook = BranchwaterHook(self.branchwater_conn_id)
        try:
            last = await self._last_seen()
            if last is None:
                last = await self._head(hook, None)
                await self._remember(last)
            while True:
                head = await self._head(hook, last)
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
