"""Clients that keep moving references to old objects while GC runs, for the concurrent model
tests (`tests/gc/test_concurrent_gc.py` on the GC rule, `tests/spark_jobs/
test_gc_concurrent_model.py` on the Spark job).

Each client works on `main` (writes, overwrites, shallow copies then deletes, links,
commits, compactions) and on branches of its own (created from `main`, written, reset or
committed and merged into `stable`, deleted). Failpoints given as `widen` slow the steps
between an operation's read and its write, so the races a run must survive happen often.
Every object a client writes holds content whose SHA-256 is its entry's checksum, so
`assert_references_intact` can check what it reads.

A run's minimum age is its premise: no write takes longer than it between writing its object
and staging it (the documented 5-minute margin, here a fraction of a second). On a loaded
machine a write can take longer; a client notes the content of every such write (`Work.slow`)
and only those, and their copies, may be missing after the round: any other reference lost
still fails the test.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.managers import SyncManager
from multiprocessing.pool import Pool
from typing import Any

from branchwater.engine import (
    DirtyBranch,
    Lake,
    MergeConflict,
    NoChanges,
    NotFound,
    TooManyTries,
    failpoints,
)
from branchwater.engine.api import Branch, Repository
from branchwater.engine.graveler.checksums import content_checksum
from tests.gc_model import referenced_entries
from tests.helpers.gc import data_objects, run_addresses

PATHS = [f"p/{i:02d}" for i in range(24)]
STABLE = "stable"
"""The branch side branches merge into: nothing is staged on it, so merges are never dirty."""
WIDEN = "copy.after_read=sleep(100),copy.after_record=sleep(5),link.before_stage=sleep(5)"
RACE_DELAY = 0.01
"""How long after a copy starts a racing delete comes: within the copy's widened steps."""
PACE = 0.02
"""A pause between steps: objects then live long enough to be old for a run's minimum age."""
MAX_STEPS = 30_000
MAX_SECONDS = 600.0
EXPECTED = (NotFound, NoChanges, MergeConflict, DirtyBranch, TooManyTries)
"""What a step may meet from the other clients: a path deleted, nothing to commit, a lost
race. Anything else fails the test."""


def start(repo: Repository) -> None:
    """The branches the clients share, and old objects on `main` to move around."""
    repo.create_branch(STABLE, source="main")
    main = repo.branch("main")
    for path in PATHS[::2]:
        main.upload(path, f"seed {path}".encode())


@dataclass
class Work:
    """What the clients of a round did: how many of each step each took, and the checksums
    of the writes that took longer than the runs' minimum age (the premise GC's young-object
    protection rests on)."""

    counts: list[dict[str, int]] = field(default_factory=list)
    slow: set[str] = field(default_factory=set)


class Client:
    def __init__(self, repo: Repository, name: str, seed: int, min_age: timedelta) -> None:
        self.repo = repo
        self.name = name
        self.random = random.Random(seed)
        self.min_age = min_age.total_seconds()
        self.written = 0
        self.slow: set[str] = set()
        self.steps: dict[Callable[[], None], float] = {
            self.write: 5,
            self.copy: 2,
            self.copy_then_delete: 4,
            self.copy_racing_delete: 4,
            self.delete: 3,
            self.link: 2,
            self.commit: 0.2,
            self.compact: 0.2,
            self.merge_side_branch: 1,
            self.reset_side_branch: 1,
        }

    def step(self) -> str:
        chosen = self.random.choices(list(self.steps), weights=list(self.steps.values()))[0]
        with contextlib.suppress(*EXPECTED):
            chosen()
        return chosen.__name__

    def content(self) -> bytes:
        self.written += 1
        return f"{self.name} {self.written}".encode()

    def staged(self, stage: Callable[[bytes], object]) -> None:
        """`stage(new content)`, whose object is written and staged within the call: noted
        in `slow` when the call took the minimum age or longer."""
        data = self.content()
        began = time.monotonic()
        stage(data)
        if time.monotonic() - began >= self.min_age:
            self.slow.add(content_checksum(data))

    def path(self) -> str:
        return self.random.choice(PATHS)

    def write(self) -> None:
        main = self.repo.branch("main")
        self.staged(lambda data: main.upload(self.path(), data))

    def copy(self) -> None:
        self.repo.branch("main").copy(self.path(), self.path())

    def copy_then_delete(self) -> None:
        """A rename: the copy's source goes right after it."""
        main = self.repo.branch("main")
        src = self.path()
        main.copy(src, self.path())
        main.delete(src)

    def copy_racing_delete(self) -> None:
        """The reported race: a second client deletes the source while the copy is under way
        (a copy held at its failpoints is still going when the delete lands)."""
        main = self.repo.branch("main")
        src = self.path()
        with ThreadPoolExecutor(1) as other:
            copying = other.submit(main.copy, src, self.path())
            time.sleep(RACE_DELAY)
            with contextlib.suppress(NotFound):
                main.delete(src)
            copying.result()

    def delete(self) -> None:
        self.repo.branch("main").delete(self.path())

    def link(self) -> None:
        main = self.repo.branch("main")
        self.staged(lambda data: self.linked(main, data))

    def linked(self, main: Branch, data: bytes) -> None:
        physical = main.get_physical_address()
        self.repo.lake.graveler.objects(self.repo.storage_namespace).put(physical.address, data)
        main.link_physical_address(
            self.path(), physical.token, size=len(data), checksum=content_checksum(data)
        )

    def commit(self) -> None:
        self.repo.branch("main").commit(f"{self.name} commits")

    def compact(self) -> None:
        self.repo.branch("main").compact()

    def side_branch(self) -> str:
        self.written += 1
        name = f"{self.name}-{self.written}"
        side = self.repo.create_branch(name, source="main")
        self.staged(lambda data: side.upload(self.path(), data))
        side.copy(self.random.choice([e.path for e in side.list()]), self.path())
        return name

    def merge_side_branch(self) -> None:
        name = self.side_branch()
        try:
            self.repo.branch(name).commit("side")
            self.repo.merge(name, into=STABLE, strategy="source-wins")
        finally:
            self.repo.delete_branch(name)

    def reset_side_branch(self) -> None:
        name = self.side_branch()
        try:
            self.repo.branch(name).reset()
        finally:
            self.repo.delete_branch(name)


def move_references(
    kv_url: str,
    repository: str,
    name: str,
    seed: int,
    min_age: timedelta,
    started: Any,
    stop: Any,
    widen: str = WIDEN,
) -> tuple[dict[str, int], set[str]]:
    """Run one client, setting `started` once it works, until `stop` is set (a bounded number
    of steps and seconds); returns how many of each step it took and its slow writes. Run in
    a spawned process (`widen` arms failpoints there for good) or in a thread of the test's
    (`widen=""`)."""
    failpoints.arm_from_env(widen)
    counts: Counter[str] = Counter()
    deadline = time.monotonic() + MAX_SECONDS
    with Lake.connect(kv_url) as lake:
        client = Client(lake.repository(repository), name, seed, min_age)
        started.set()
        while not stop.is_set() and sum(counts.values()) < MAX_STEPS:
            assert time.monotonic() < deadline, f"client {name} was never told to stop"
            counts[client.step()] += 1
            time.sleep(PACE)
    return dict(counts), client.slow


@contextmanager
def working(
    manager: SyncManager,
    pool: Pool,
    kv_url: str,
    repository: str,
    round_: int,
    min_age: timedelta,
) -> Iterator[Work]:
    """Clients in every process of `pool` and in a thread of this process, all working when
    the block starts; on the way out they are stopped, every step they began finished, and
    the `Work` yielded holds what they did."""
    processes = pool._processes  # type: ignore[attr-defined]
    stop, thread_stop = manager.Event(), threading.Event()
    started = [manager.Event() for _ in range(processes + 1)]
    work = Work()
    with ThreadPoolExecutor(1) as thread:
        clients = [
            pool.apply_async(
                move_references,
                (
                    kv_url,
                    repository,
                    f"p{i}r{round_}",
                    round_ * 100 + i,
                    min_age,
                    started[i],
                    stop,
                ),
            )
            for i in range(processes)
        ]
        in_thread = thread.submit(
            move_references,
            kv_url,
            repository,
            f"tr{round_}",
            round_,
            min_age,
            started[-1],
            thread_stop,
            "",
        )
        try:
            assert all(event.wait(MAX_SECONDS) for event in started)
            yield work
        finally:
            stop.set()
            thread_stop.set()
            done = [client.get(MAX_SECONDS) for client in clients]
            done.append(in_thread.result(MAX_SECONDS))
            for counts, slow in done:
                work.counts.append(counts)
                work.slow |= slow


def garbage(repo: Repository) -> set[str]:
    """Objects nothing holds, with the clients stopped: no branch, commit, copy record, nor
    the uncommitted addresses a prepare run now reads (hidden layers included). No client
    can refer to them again, so the next run must collect them."""
    held = run_addresses(repo, repo.prepare_uncommitted_for_gc())
    held |= {entry.address for _, entry in referenced_entries(repo)}
    held |= {record.address for record in repo.lake.gc.copies.records(repo.record)}
    return set(data_objects(repo.lake, repo)) - held
