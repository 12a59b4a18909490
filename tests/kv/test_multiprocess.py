"""The shared drivers under real contention: processes, threads and a racy first use.

Workers are processes of their own, forked from a server that imported the drivers and opened
nothing (`tests.helpers.servers.forked_context`), so each makes its own connections, exactly
like separate Airflow workers sharing one store.
"""

from __future__ import annotations

import gc
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from branchwater.engine.errors import PredicateFailed
from branchwater.engine.kv import Store, open_store, sql
from tests.helpers.servers import child_answer, forked_context, forked_process, unique_name

PROCESSES = 6
INCREMENTS = 25
THREADS = 8
START_TIMEOUT = 120
COUNTER = (b"counters", b"shared")

SHARED_DRIVERS = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
]


@pytest.fixture(params=SHARED_DRIVERS)
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A URL whose file or table does not exist yet: the first `open_store` creates it."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'shared' / 'kv.db'}"
    return f"{request.getfixturevalue('postgres_url')}?table={unique_name('kv_')}"


def increment(store: Store, times: int) -> int:
    """Add one to the counter `times` times by read-then-compare-and-swap; return the tries.

    Only a swap whose predicate still matched counts, so a lost update would leave the
    counter short of the number of successful swaps.
    """
    tries = 0
    for _ in range(times):
        while True:
            tries += 1
            value, predicate = store.get(*COUNTER)
            try:
                store.set_if(*COUNTER, b"%d" % (int(value) + 1), predicate)
                break
            except PredicateFailed:
                continue
    return tries


def increment_worker(url: str, barrier: Any, times: int, results: Any) -> None:
    with open_store(url) as store:
        barrier.wait(START_TIMEOUT)
        tries = increment(store, times)
    results.put(("ok", times, tries))


def first_use_worker(url: str, barrier: Any, index: int, results: Any) -> None:
    barrier.wait(START_TIMEOUT)
    with open_store(url) as store:
        store.set_if(b"first-use", b"worker-%d" % index, b"%d" % index, None)
    results.put(("ok", index, 0))


def run_processes(target: Any, url: str, arguments: list[Any]) -> list[tuple[str, int, int]]:
    """Start one process per argument, release them together, collect their results."""
    ctx = forked_context()
    barrier, results = ctx.Barrier(len(arguments)), ctx.Queue()
    processes = [forked_process(target, url, barrier, a, results) for a in arguments]
    for process in processes:
        process.start()
    for process in processes:
        process.join(START_TIMEOUT * 2)
    assert [p.exitcode for p in processes] == [0] * len(processes)
    return [results.get(timeout=10) for _ in processes]


@pytest.mark.slow
def test_processes_never_lose_an_increment(fresh_url: str) -> None:
    with open_store(fresh_url) as store:
        store.set(*COUNTER, b"0")
        outcomes = run_processes(increment_worker, fresh_url, [INCREMENTS] * PROCESSES)
        successes = sum(done for _, done, _ in outcomes)
        assert successes == PROCESSES * INCREMENTS
        assert int(store.get(*COUNTER).value) == successes


@pytest.mark.slow
def test_concurrent_first_use_creates_schema_once(fresh_url: str) -> None:
    outcomes = run_processes(first_use_worker, fresh_url, list(range(PROCESSES)))
    assert sorted(index for _, index, _ in outcomes) == list(range(PROCESSES))
    with open_store(fresh_url) as store:
        stored = {pair.key: pair.value for pair in store.scan(b"first-use")}
    assert stored == {b"worker-%d" % i: b"%d" % i for i in range(PROCESSES)}


def test_threads_sharing_one_store_never_lose_an_increment(fresh_url: str) -> None:
    with open_store(fresh_url) as store:
        store.set(*COUNTER, b"0")
        errors: list[BaseException] = []

        def work() -> None:
            try:
                increment(store, INCREMENTS)
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work) for _ in range(THREADS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
        assert int(store.get(*COUNTER).value) == THREADS * INCREMENTS


def test_threads_one_after_another_share_one_connection(fresh_url: str) -> None:
    """Connections are pooled, not kept per thread: short-lived threads leave none behind,
    and none is closed when a thread (or a native caller's thread state) ends."""
    with open_store(fresh_url) as store:
        store.set(*COUNTER, b"0")
        for _ in range(THREADS):
            thread = threading.Thread(target=store.get, args=COUNTER)
            thread.start()
            thread.join()
        gc.collect()
        assert len(store._connections) == 1  # type: ignore[attr-defined]
        assert store._idle[0].finalizer.alive  # type: ignore[attr-defined]


def report_connection(store: Store, results: Any) -> None:
    """Runs in a forked child: use the inherited store, report which session served it."""
    store.set(b"fork", b"child", b"written by child")
    results.put(session_of(store))


def session_of(store: Store) -> int:
    """The PostgreSQL backend pid, or the identity of the sqlite3 connection object."""
    dbapi = store._idle[-1].dbapi  # type: ignore[attr-defined]
    info = getattr(dbapi, "info", None)
    return info.backend_pid if info is not None else id(dbapi)


@pytest.mark.slow
def test_forked_child_opens_its_own_connection(fresh_url: str) -> None:
    with open_store(fresh_url) as store:
        store.set(b"fork", b"parent", b"written by parent")
        parent_session = session_of(store)
        child_session = child_answer(report_connection, store)
        assert store.get(b"fork", b"child").value == b"written by child"
        assert session_of(store) == parent_session
        if fresh_url.startswith("postgresql"):
            assert child_session != parent_session


def pause_next_write(store: Store, paused: threading.Event, resume: threading.Event) -> None:
    """Make the next statement of the store's idle SQLite connection stop at its first
    step, the write lock held, until `resume` is set."""
    dbapi = store._idle[-1].dbapi  # type: ignore[attr-defined]

    def handler() -> int:
        dbapi.set_progress_handler(None, 1)
        paused.set()
        resume.wait()
        return 0

    dbapi.set_progress_handler(handler, 1)


def write_and_read_in_child(store: Store, results: Any) -> None:
    """Runs in a forked child: write, then report what the parent's paused write left."""
    try:
        store.set(b"fork", b"child", b"written by child")
        results.put(store.get(b"fork", b"parent").value)
    except Exception as exc:
        results.put(repr(exc))


@pytest.mark.slow
def test_a_fork_waits_for_a_write_under_way_in_another_thread(tmp_path: Path) -> None:
    """SQLite keeps its lock state per process: a child forked while a thread of its parent
    held the write lock would find it held for ever. The fork waits for the write instead,
    so the child writes, and sees the parent's write as committed."""
    with open_store(f"sqlite:///{tmp_path / 'kv.db'}") as store:
        store.set(b"fork", b"parent", b"before")
        paused, resume = threading.Event(), threading.Event()
        pause_next_write(store, paused, resume)
        writer = threading.Thread(target=store.set, args=(b"fork", b"parent", b"written"))
        writer.start()
        assert paused.wait(10)
        threading.Timer(0.2, resume.set).start()
        try:
            assert child_answer(write_and_read_in_child, store) == b"written"
        finally:
            resume.set()
            writer.join()
        assert store.get(b"fork", b"child").value == b"written by child"


def test_a_store_opened_while_a_fork_is_under_way_is_left_alone(tmp_path: Path) -> None:
    """The release after a fork undoes exactly what the hold before it took: a store another
    thread opened between the two was never held, and releasing it would fail and leave
    the stores after it held."""
    with open_store(f"sqlite:///{tmp_path / 'a.db'}") as held:
        held.set(b"p", b"k", b"before")
        sql._before_fork()
        try:
            opened = open_store(f"sqlite:///{tmp_path / 'b.db'}")
        finally:
            sql._after_fork_in_parent()
        with opened:
            opened.set(b"p", b"k", b"after")
            assert opened.get(b"p", b"k").value == b"after"
        held.set(b"p", b"k", b"after")
        assert held.get(b"p", b"k").value == b"after"


def _fork_and_write(store: Store, name: bytes, forks: int, failures: list[str]) -> None:
    """Fork `forks` children in turn, each writing once through the inherited store."""
    for i in range(forks):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                store.set(b"forks", b"%s-%d" % (name, i), b"child")
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        if status != 0:
            failures.append(f"{name!r} child {i} exited with status {status}")


@pytest.mark.slow
def test_threads_forking_at_once_while_another_writes(tmp_path: Path) -> None:
    """Two threads fork at the same time as a third writes: every child writes, and the
    parent's stores are all released after every fork."""
    forks = 15
    with open_store(f"sqlite:///{tmp_path / 'kv.db'}") as store:
        store.set(b"forks", b"parent", b"0")
        failures: list[str] = []
        stop = threading.Event()

        def write() -> None:
            while not stop.is_set():
                store.set(b"forks", b"parent", b"1")

        writer = threading.Thread(target=write)
        forkers = [
            threading.Thread(target=_fork_and_write, args=(store, name, forks, failures))
            for name in (b"a", b"b")
        ]
        writer.start()
        for forker in forkers:
            forker.start()
        for forker in forkers:
            forker.join(START_TIMEOUT)
        stop.set()
        writer.join(START_TIMEOUT)
        assert failures == []
        written = {kv.key for kv in store.scan(b"forks")}
        assert written == {b"parent"} | {
            b"%s-%d" % (n, i) for n in (b"a", b"b") for i in range(forks)
        }
