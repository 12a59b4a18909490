"""The triggers, run on an event loop as the triggerer runs them: serialization round trips,
events, failures, the event trigger's remembered HEAD, and its use in an `AssetWatcher`."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from functools import partial
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from airflow.sdk import DAG, Asset, AssetWatcher
from airflow.sdk._shared.module_loading import import_string
from airflow.triggers.base import BaseTrigger, TriggerEvent

from branchwater.engine import (
    ConfigurationError,
    InvalidName,
    Lake,
    NotFound,
    Repository,
    Unavailable,
)
from branchwater.plugin import triggers
from branchwater.plugin.sensors import BranchwaterCommitSensor
from branchwater.plugin.triggers import (
    BRANCH_GONE,
    FINAL,
    RETRYABLE,
    BranchwaterCommitEventTrigger,
    BranchwaterCommitTrigger,
    BranchwaterCompactionTrigger,
    backoff_wait,
)
from tests.plugin.conftest import LakeConnection, set_connection

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
    deadline = datetime(2030, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    commit = BranchwaterCommitTrigger(
        repository="sales", branch="main", since_commit="c0", poll_interval=2.0, deadline=deadline
    )
    assert commit.serialize() == (
        "branchwater.plugin.triggers.BranchwaterCommitTrigger",
        {
            "repository": "sales",
            "branch": "main",
            "since_commit": "c0",
            "branchwater_conn_id": "branchwater_default",
            "poll_interval": 2.0,
            "deadline": deadline,
            "exponential_backoff": False,
            "max_wait": None,
        },
    )
    round_trip(commit)
    compaction = BranchwaterCompactionTrigger(
        repository="sales",
        branch="etl",
        policy={"max_tombstones": 10},
        poll_interval=2.0,
        exponential_backoff=True,
        max_wait=60.0,
    )
    assert compaction.serialize() == (
        "branchwater.plugin.triggers.BranchwaterCompactionTrigger",
        {
            "repository": "sales",
            "branch": "etl",
            "policy": {"max_tombstones": 10},
            "branchwater_conn_id": "branchwater_default",
            "poll_interval": 2.0,
            "deadline": None,
            "exponential_backoff": True,
            "max_wait": 60.0,
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


@pytest.mark.parametrize("kind", ["commit", "compaction"])
def test_the_branch_triggers_end_the_wait_at_their_deadline(
    lake_conn: LakeConnection, repo: Repository, kind: str
) -> None:
    """The sensor's timeout, which only the scheduler enforced (the deferral's), so a trigger
    run where none watches (`dag.test()`) waited for ever; the wait is looked at once more
    at the deadline."""
    deadline = datetime.now(timezone.utc) + timedelta(seconds=0.5)
    names: dict[str, Any] = {
        "repository": repo.name,
        "branch": "main",
        "poll_interval": 0.2,
        "deadline": deadline,
    }
    trigger = round_trip(
        BranchwaterCommitTrigger(since_commit=repo.branch("main").commit_id, **names)
        if kind == "commit"
        else BranchwaterCompactionTrigger(**names)
    )

    (event,) = asyncio.run(asyncio.wait_for(events(trigger, 1), 30))

    assert event.payload == {"status": "timeout"}
    assert datetime.now(timezone.utc) >= deadline


@pytest.mark.parametrize("max_wait", [None, 7.0])
@pytest.mark.parametrize("poke_interval", [0.5, 1.0, 3.0])
def test_the_backoff_of_the_branch_triggers_is_that_of_a_poking_sensor(
    poke_interval: float, max_wait: float | None
) -> None:
    """Airflow's `_get_next_poke_interval` for the same sensor, seeded alike, wait for wait;
    far past where Airflow's own overflows, the wait is still `max_wait`."""
    with DAG("bw_backoff", schedule=None):
        sensor = BranchwaterCommitSensor(
            task_id="wait",
            repository="sales",
            branch="main",
            poke_interval=poke_interval,
            exponential_backoff=True,
            max_wait=max_wait,
            timeout=10**9,
        )
    started_at = 1234.5
    seed = f"{sensor.dag_id}#{sensor.task_id}#{started_at}"
    counts = range(1, 25)

    ours = [backoff_wait(poke_interval, count, seed, max_wait) for count in counts]

    assert ours == [sensor._get_next_poke_interval(started_at, lambda: 0.0, n) for n in counts]
    assert backoff_wait(poke_interval, 5_000, seed, 60.0) == 60.0


class AssetStateStore:
    """The asset state store the triggerer gives an event trigger watching one asset."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    async def aget(self, key: str, default: Any = None) -> Any:
        return self.values.get(key, default)

    async def aset(self, key: str, value: Any) -> None:
        self.values[key] = value


class Polls:
    """The trigger's reads of the branch's HEAD, counted as they end (`missed`: the branch,
    its repository or the lake was not there, or the lake could not be reached): what a test
    waits on instead of sleeping and hoping the trigger polled meanwhile."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.found = 0
        self.missed = 0
        self._changed = threading.Condition()
        read = triggers.head_commit_id

        def counted(*args: Any) -> str:
            try:
                head = read(*args)
            except (NotFound, Unavailable):
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


def lines_saying(said: list[str], text: str) -> list[str]:
    return [line for line in said if text in line]


@contextmanager
def refusing_connections(postgres_url: str) -> Iterator[Callable[[], None]]:
    """A callable that cuts the PostgreSQL database of `postgres_url` off, as a server
    restarting or failing over does: its sessions are ended and new ones refused until the
    context ends (or until the callable it gives back is called)."""
    database = urlsplit(postgres_url).path.lstrip("/")
    admin = urlunsplit(urlsplit(postgres_url)._replace(path="/postgres"))

    def allow(allowed: bool) -> None:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS {str(allowed).lower()}')
            if not allowed:
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = %s AND pid <> pg_backend_pid()",
                    (database,),
                )

    allow(False)
    try:
        yield partial(allow, True)
    finally:
        allow(True)


@pytest.mark.postgres
@pytest.mark.parametrize("kv_url", ["postgres"], indirect=True)
def test_the_event_trigger_waits_out_a_lake_it_cannot_reach(
    postgres_url: str,
    lake_conn: LakeConnection,
    repo: Repository,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The KV store unreachable for a while (its database ending every session and refusing
    new ones: the engine's reads raise `Unavailable`) ended the trigger, and the triggerer
    started it again at once, raising again; it warns once, keeps polling with backoff and,
    once the lake is back, reports the commit made meanwhile."""
    store = AssetStateStore()
    trigger = round_trip(
        BranchwaterCommitEventTrigger(repository=repo.name, branch="main", poll_interval=0.05)
    )
    trigger.asset_state_store = store  # type: ignore[attr-defined]
    polls = Polls(monkeypatch)

    def commit(path: str) -> str:
        made = commit_on_main(repo, path)
        # The test's lake drops staging in the background: done before the database goes.
        assert lake_conn.lake.wait_for_cleanup(timeout=30)
        return made

    async def scenario() -> tuple[list[TriggerEvent], list[str]]:
        listening = asyncio.create_task(events(trigger, 2))
        await polls.reach("found", 1)
        first = await asyncio.to_thread(commit, "one.csv")
        while first not in store.values.values():  # the first event is out
            await asyncio.sleep(0.05)
        with refusing_connections(postgres_url) as reconnect:
            await polls.reach("missed", 3)
            assert not listening.done()
            await asyncio.to_thread(reconnect)
        second = await asyncio.to_thread(commit, "two.csv")
        return await asyncio.wait_for(listening, 30), [first, second]

    found, made = asyncio.run(scenario())

    assert [e.payload["commit_id"] for e in found] == made
    assert found[1].payload["previous_commit_id"] == made[0]
    said = capfd.readouterr().out.splitlines()
    unreachable = lines_saying(said, "cannot be reached")
    assert len(unreachable) == 1, said
    assert "The lake of connection 'branchwater_default'" in unreachable[0]
    assert "(Unavailable: PostgreSQL at" in unreachable[0]
    assert f"branch 'main' of repository {repo.name!r}" in unreachable[0]
    assert len(lines_saying(said, "The lake of connection 'branchwater_default' is back")) == 1
    assert not lines_saying(said, "cannot be watched")


@pytest.mark.parametrize(
    ("blocked", "error"),
    [(False, "(LakeNotFound: no lake at"), (True, "(Unavailable: SQLite database")],
    ids=["not_created_yet", "cannot_be_opened"],
)
def test_the_event_trigger_waits_for_a_lake_it_cannot_open(
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    blocked: bool,
    error: str,
) -> None:
    """A SQLite lake that is not there yet (`LakeNotFound`), or whose file cannot be opened
    (a folder stands at its path: `Unavailable`), is waited for, with one warning, and never
    started by the trigger; its first event reports the first commit after the HEAD it
    found."""
    lake_file = tmp_path / "later" / "lake.db"
    if blocked:
        lake_file.mkdir(parents=True)
    kv_url = f"sqlite:///{lake_file}"
    set_connection(monkeypatch, "branchwater_later", "branchwater", password=kv_url)
    trigger = BranchwaterCommitEventTrigger(
        repository="sales",
        branch="main",
        branchwater_conn_id="branchwater_later",
        poll_interval=0.05,
    )
    polls = Polls(monkeypatch)

    async def scenario(opened: list[Lake]) -> tuple[list[TriggerEvent], str, str]:
        listening = asyncio.create_task(events(trigger, 1))
        await polls.reach("missed", 3)
        assert not listening.done()
        assert [p.name for p in tmp_path.rglob("*")] == (["later", "lake.db"] if blocked else [])
        if blocked:
            lake_file.rmdir()
        opened.append(await asyncio.to_thread(Lake.connect, kv_url))
        created = await asyncio.to_thread(
            opened[0].create_repository, "sales", (tmp_path / "sales").as_uri()
        )
        first = created.branch("main").commit_id
        await polls.reach("found", 1)
        head = await asyncio.to_thread(commit_on_main, created, "new.csv")
        return await asyncio.wait_for(listening, 30), first, head

    opened: list[Lake] = []
    try:
        (event,), first, head = asyncio.run(scenario(opened))
    finally:
        for lake in opened:
            lake.close()

    assert (event.payload["previous_commit_id"], event.payload["commit_id"]) == (first, head)
    said = capfd.readouterr().out.splitlines()
    unreachable = lines_saying(said, "cannot be reached")
    assert len(unreachable) == 1, said
    assert "The lake of connection 'branchwater_later'" in unreachable[0]
    assert error in unreachable[0]


def test_the_event_trigger_ends_on_a_mistake_no_wait_can_fix(
    lake_conn: LakeConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A repository or branch name the engine refuses was waited for forever, as one not
    created yet: the trigger refuses it where the DAG declares it. A connection whose URL is
    malformed ends the trigger with the error, not a wait."""
    with pytest.raises(InvalidName, match="invalid repository name 'Sales Data'"):
        BranchwaterCommitEventTrigger(repository="Sales Data", branch="main")
    with pytest.raises(InvalidName, match=r"invalid branch name 'main\.\.x'.* wait for it forever"):
        BranchwaterCommitEventTrigger(repository="sales", branch="main..x")

    set_connection(monkeypatch, "malformed", "branchwater", password="sqlite://host/lake.db")
    trigger = BranchwaterCommitEventTrigger(
        repository="sales", branch="main", branchwater_conn_id="malformed", poll_interval=0.05
    )
    with pytest.raises(ConfigurationError, match="malformed SQLite URL"):
        asyncio.run(asyncio.wait_for(events(trigger, 1), 30))
