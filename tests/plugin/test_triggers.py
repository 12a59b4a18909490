"""The triggers, run on an event loop as the triggerer runs them: serialization round trips,
events, failures, the event trigger's remembered HEAD, and its use in an `AssetWatcher`."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator
from typing import Any

import pytest
from airflow.sdk import DAG, Asset, AssetWatcher
from airflow.sdk._shared.module_loading import import_string
from airflow.triggers.base import BaseTrigger, TriggerEvent

from branchwater.engine import NotFound, Repository
from branchwater.plugin import triggers
from branchwater.plugin.triggers import (
    BRANCH_GONE,
    FINAL,
    RETRYABLE,
    BranchwaterCommitEventTrigger,
    BranchwaterCommitTrigger,
    BranchwaterCompactionTrigger,
)
from tests.plugin.conftest import LakeConnection

pytestmark = pytest.mark.timeout(60)


def round_trip(trigger: BaseTrigger) -> BaseTrigger:
    """Rebuild a trigger from its serialized form, as the triggerer does."""
    classpath, kwargs = trigger.serialize()
    rebuilt: BaseTrigger = import_string(classpath)(**kwargs)
    assert rebuilt.serialize() == (classpath, kwargs)
    return rebuilt


def commit_on_main(repo: Repository, path: str) -> str:
    main = repo.branch("main")
    main.upload(path, path.encode())
    return main.commit(path).id


async def events(trigger: BaseTrigger, count: int) -> list[TriggerEvent]:
    found: list[TriggerEvent] = []
    run: AsyncIterator[TriggerEvent] = trigger.run()
    try:
        async for event in run:
            found.append(event)
            if len(found) == count:
                break
    finally:
        await run.aclose()
    return found


def test_triggers_serialize_to_their_class_path_and_arguments() -> None:
    commit = BranchwaterCommitTrigger(
        repository="sales", branch="main", since_commit="c0", poll_interval=2.0
    )
    assert commit.serialize() == (
        "branchwater.plugin.triggers.BranchwaterCommitTrigger",
        {
            "repository": "sales",
            "branch": "main",
            "since_commit": "c0",
            "branchwater_conn_id": "branchwater_default",
            "poll_interval": 2.0,
        },
    )
    round_trip(commit)
    compaction = BranchwaterCompactionTrigger(
        repository="sales", branch="etl", policy={"max_tombstones": 10}, poll_interval=2.0
    )
    assert compaction.serialize() == (
        "branchwater.plugin.triggers.BranchwaterCompactionTrigger",
        {
            "repository": "sales",
            "branch": "etl",
            "policy": {"max_tombstones": 10},
            "branchwater_conn_id": "branchwater_default",
            "poll_interval": 2.0,
        },
    )
    round_trip(compaction)
    event = BranchwaterCommitEventTrigger(repository="sales", branch="main", poll_interval=2.0)
    assert event.serialize()[0] == "branchwater.plugin.triggers.BranchwaterCommitEventTrigger"
    round_trip(event)


def test_the_commit_trigger_fires_once_the_head_moves(
    lake_conn: LakeConnection, repo: Repository
) -> None:
    since = repo.branch("main").commit_id
    trigger = round_trip(
        BranchwaterCommitTrigger(
            repository=repo.name, branch="main", since_commit=since, poll_interval=0.1
        )
    )

    async def scenario() -> list[TriggerEvent]:
        waiting = asyncio.create_task(events(trigger, 1))
        await asyncio.sleep(0.5)
        assert not waiting.done()
        head = await asyncio.to_thread(commit_on_main, repo, "new.csv")
        found = await waiting
        assert found[0].payload["commit_id"] == head
        return found

    (event,) = asyncio.run(scenario())
    assert event.payload["status"] == "success"


def test_the_compaction_trigger_fires_once_compaction_is_due(
    lake_conn: LakeConnection, repo: Repository
) -> None:
    main = repo.branch("main")
    trigger = round_trip(
        BranchwaterCompactionTrigger(
            repository=repo.name, branch="main", policy={"max_tombstones": 1}, poll_interval=0.1
        )
    )

    async def scenario() -> list[TriggerEvent]:
        waiting = asyncio.create_task(events(trigger, 1))
        await asyncio.sleep(0.5)
        assert not waiting.done()
        await asyncio.to_thread(main.delete, "base.csv")
        return await waiting

    (event,) = asyncio.run(scenario())
    assert event.payload["status"] == "success"
    assert event.payload["compaction"]["due"] is True
    assert event.payload["compaction"]["reasons"] == ["1 staged tombstones >= 1"]


@pytest.mark.parametrize(
    ("repository", "branch", "conn_id", "error", "message"),
    [
        ("nope", "main", "branchwater_default", FINAL, "NotFound: repository 'nope' not found"),
        (None, "gone", "branchwater_default", BRANCH_GONE, "BranchGone: branch 'gone' not found"),
        (None, "main", "gone", RETRYABLE, "The conn_id `gone` isn't defined"),
    ],
)
@pytest.mark.parametrize("kind", ["commit", "compaction"])
def test_the_branch_triggers_report_failures_as_events_of_their_kind(
    lake_conn: LakeConnection,
    repo: Repository,
    repository: str | None,
    branch: str,
    conn_id: str,
    error: str,
    message: str,
    kind: str,
) -> None:
    """The kind tells the deferred sensor what poke mode would do: skip or fail at once for
    a branch gone, fail at once for another error a retry cannot fix, else retry."""
    names: dict[str, Any] = {
        "repository": repository or repo.name,
        "branch": branch,
        "branchwater_conn_id": conn_id,
    }
    trigger: BaseTrigger = (
        BranchwaterCommitTrigger(since_commit="c0", **names)
        if kind == "commit"
        else BranchwaterCompactionTrigger(**names)
    )
    (event,) = asyncio.run(events(trigger, 1))
    assert (event.payload["status"], event.payload["error"]) == ("error", error)
    assert message in event.payload["message"]


class AssetStateStore:
    """The asset state store the triggerer gives an event trigger watching one asset."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    async def aget(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    async def aset(self, key: str, value: Any) -> None:
        self.values[key] = value


class Polls:
    """The trigger's reads of the branch's HEAD, counted as they end: what a test waits on
    instead of sleeping and hoping the trigger polled meanwhile."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.found = 0
        self.missed = 0
        self._changed = threading.Condition()
        read = triggers.head_commit_id

        def counted(*args: Any) -> str:
            try:
                head = read(*args)
            except NotFound:
                self._count("missed")
                raise
            self._count("found")
            return head

        monkeypatch.setattr(triggers, "head_commit_id", counted)

    def _count(self, outcome: str) -> None:
        with self._changed:
            setattr(self, outcome, getattr(self, outcome) + 1)
            self._changed.notify_all()

    async def reach(self, outcome: str, count: int) -> None:
        def wait() -> None:
            with self._changed:
                assert self._changed.wait_for(lambda: getattr(self, outcome) >= count, 30)

        await asyncio.to_thread(wait)


def test_the_event_trigger_reports_every_new_head_and_remembers_the_last(
    lake_conn: LakeConnection, repo: Repository, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = AssetStateStore()
    polls = Polls(monkeypatch)
    start = repo.branch("main").commit_id

    def watcher() -> BranchwaterCommitEventTrigger:
        trigger = BranchwaterCommitEventTrigger(
            repository=repo.name, branch="main", poll_interval=0.1
        )
        trigger.asset_state_store = store  # type: ignore[assignment]
        return trigger

    async def scenario() -> tuple[list[TriggerEvent], list[str]]:
        listening = asyncio.create_task(events(watcher(), 2))
        await polls.reach("found", 1)
        first = await asyncio.to_thread(commit_on_main, repo, "one.csv")
        while len(store.values) != 1 or first not in store.values.values():
            await asyncio.sleep(0.1)
        second = await asyncio.to_thread(commit_on_main, repo, "two.csv")
        return await listening, [first, second]

    found, made = asyncio.run(scenario())
    assert [e.payload["commit_id"] for e in found] == made
    assert [e.payload["previous_commit_id"] for e in found] == [start, made[0]]
    assert found[0].payload["repository"] == repo.name
    # Stopped right after yielding the second event, before the triggerer moved it on: at
    # least once, a restarted trigger reports it again, with what landed meanwhile.
    assert list(store.values.values()) == [made[0]]
    while_down = commit_on_main(repo, "while-down.csv")
    (event,) = asyncio.run(events(watcher(), 1))
    assert event.payload["commit_id"] == while_down
    assert event.payload["previous_commit_id"] == made[0]


def test_an_asset_watched_by_the_event_trigger_schedules_a_dag() -> None:
    from airflow.serialization.serialized_objects import DagSerialization

    trigger = BranchwaterCommitEventTrigger(repository="sales", branch="main")
    asset = Asset(
        "branchwater_sales_main", watchers=[AssetWatcher(name="sales_main", trigger=trigger)]
    )
    with DAG("bw_on_commit", schedule=[asset]) as dag:
        pass

    serialized = DagSerialization.to_dict(dag)
    (watched,) = serialized["dag"]["timetable"]["__var"]["asset_condition"]["objects"]
    watchers = watched["watchers"]
    assert watchers[0]["trigger"]["classpath"] == trigger.serialize()[0]
    assert watchers[0]["trigger"]["kwargs"]["repository"] == "sales"
    classpath, kwargs = trigger.serialize()
    assert BranchwaterCommitEventTrigger.hash(classpath, kwargs) == (
        BranchwaterCommitEventTrigger.hash(*round_trip(trigger).serialize())
    )


def test_the_event_trigger_waits_out_a_branch_deleted_and_re_created(
    lake_conn: LakeConnection,
    repo: Repository,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An asset watcher's trigger that raised (`BranchGone`) was started again by the
    triggerer at once, raising again; it logs once, keeps polling with backoff, and reports
    the re-created branch's HEAD."""
    start = repo.create_branch("etl").commit_id
    trigger = round_trip(
        BranchwaterCommitEventTrigger(repository=repo.name, branch="etl", poll_interval=0.05)
    )
    polls = Polls(monkeypatch)

    def re_create() -> str:
        branch = repo.create_branch("etl")
        branch.upload("again.csv", b"again")
        return branch.commit("again").id

    async def scenario() -> tuple[list[TriggerEvent], str]:
        listening = asyncio.create_task(events(trigger, 1))
        await polls.reach("found", 1)
        await asyncio.to_thread(repo.delete_branch, "etl")
        await polls.reach("missed", 3)
        assert not listening.done()
        head = await asyncio.to_thread(re_create)
        return await asyncio.wait_for(listening, 30), head

    (event,), head = asyncio.run(scenario())

    assert event.payload["commit_id"] == head
    assert event.payload["previous_commit_id"] == start
    said = capfd.readouterr().out.splitlines()
    gone = [line for line in said if "cannot be watched" in line]
    assert len(gone) == 1, said
    assert "Branch 'etl' of repository" in gone[0]
    assert "(BranchGone: branch 'etl' not found" in gone[0]
    assert any("Branch 'etl' of repository" in line and "is there again" in line for line in said)


def test_the_event_trigger_of_a_repository_not_created_yet_waits_for_it(
    lake_conn: LakeConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trigger that never saw its branch starts from the HEAD it first finds."""
    trigger = BranchwaterCommitEventTrigger(repository="later", branch="main", poll_interval=0.05)
    polls = Polls(monkeypatch)

    async def scenario() -> tuple[list[TriggerEvent], str, str]:
        listening = asyncio.create_task(events(trigger, 1))
        await polls.reach("missed", 2)
        assert not listening.done()
        created = await asyncio.to_thread(
            lake_conn.lake.create_repository, "later", f"{lake_conn.namespace}/later"
        )
        first = created.branch("main").commit_id
        await polls.reach("found", 1)
        head = await asyncio.to_thread(commit_on_main, created, "new.csv")
        return await asyncio.wait_for(listening, 30), first, head

    (event,), first, head = asyncio.run(scenario())
    assert (event.payload["previous_commit_id"], event.payload["commit_id"]) == (first, head)
