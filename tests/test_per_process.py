"""`engine/per_process.py`: what a forked child forgets of its parent's state. The worst
moment is forced: another thread of the parent holds the lock at the fork."""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from branchwater.engine import Lake
from branchwater.engine.per_process import ChildSafeLock, PerProcess
from tests.helpers.servers import child_answer


@contextmanager
def held_by_another_thread(
    hold: Callable[[threading.Event, threading.Event], None],
) -> Iterator[None]:
    """`hold(holding, release)` on a thread of its own, which sets `holding` once it holds
    what it holds and lets go when `release` is set; the block runs in between."""
    holding, release = threading.Event(), threading.Event()
    thread = threading.Thread(target=hold, args=(holding, release))
    thread.start()
    try:
        assert holding.wait(10)
        yield
    finally:
        release.set()
        thread.join(10)


def _take(lock: ChildSafeLock, answers: mp.Queue) -> None:
    with lock:
        answers.put("taken")


def test_a_child_finds_a_lock_free_that_a_parent_thread_held_at_the_fork() -> None:
    lock = ChildSafeLock()

    def hold(holding: threading.Event, release: threading.Event) -> None:
        with lock:
            holding.set()
            release.wait(30)

    with held_by_another_thread(hold):
        assert child_answer(_take, lock) == "taken"
    with lock:
        pass


def _read(lake: Lake, answers: mp.Queue) -> None:
    answers.put(lake.repository("sales").ref("main").read("orders/a.csv"))


def test_a_child_reads_committed_data_while_a_parent_thread_held_the_range_cache(
    tmp_path: Path,
) -> None:
    """A range stored in the background holds the in-memory range cache's lock while it
    weighs the range: a fork then would leave the child's cache locked for ever, and its
    first read of a range hung. The child starts with empty caches of its own."""
    with Lake.connect(f"sqlite:///{tmp_path}/kv.db") as lake:
        repo = lake.create_repository("sales", storage_namespace=f"file://{tmp_path}/ns")
        main = repo.branch("main")
        main.upload("orders/a.csv", b"id\n1\n")
        main.commit("orders")
        assert lake.wait_for_cleanup(timeout=30)
        ranges: Any = lake.graveler.committed(repo.record).storage._ranges

        def hold(holding: threading.Event, release: threading.Event) -> None:
            def weigh(table: Any) -> int:
                if not holding.is_set():
                    holding.set()
                    release.wait(30)
                return 0

            ranges._weight = weigh
            ranges.put("being-stored", object())

        with held_by_another_thread(hold):
            assert child_answer(_read, lake) == b"id\n1\n"
        assert main.read("orders/a.csv") == b"id\n1\n"


def test_threads_asking_at_once_share_one_value_per_process() -> None:
    """One made per thread would leak all but the last (a client and its sockets)."""
    made: list[object] = []
    start = threading.Barrier(16)

    def make() -> object:
        time.sleep(0.01)
        made.append(object())
        return made[-1]

    shared = PerProcess(make)

    def first_use() -> object:
        start.wait(10)
        return shared.get()

    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(lambda _: first_use(), range(16)))
    assert len(made) == 1
    assert all(value is made[0] for value in got)


def _link_address(lake: Lake, answers: mp.Queue) -> None:
    answers.put(lake.repository("sales").branch("main").get_physical_address().address)


def test_a_child_hands_out_addresses_while_a_parent_thread_was_recording_limits(
    tmp_path: Path,
) -> None:
    """The first address of a connection records its GC limits lake-wide, and hands out a
    token signed with the lake's key, each read under a lock held across a KV call: a fork
    then left the child's locks held for ever."""
    with Lake.connect(f"sqlite:///{tmp_path}/kv.db") as lake:
        lake.create_repository("sales", storage_namespace=f"file://{tmp_path}/ns")
        gc = lake.gc

        def hold(holding: threading.Event, release: threading.Event) -> None:
            with gc.limits._lock, gc.tokens._lock:
                holding.set()
                release.wait(30)

        with held_by_another_thread(hold):
            assert child_answer(_link_address, lake).startswith("data/")
