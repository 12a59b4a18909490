"""Races: a committer committing a branch in a loop, read-after-write across processes (a
shared path overwritten in one process and read in others), and a merge that loses every
race."""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, TypeVar

import pytest

from branchwater.engine.api import Branch, Lake, Ref, Repository
from branchwater.engine.errors import MergeRaceLost, NoChanges, NotFound, TooManyTries
from branchwater.engine.graveler.checksums import content_checksum

if TYPE_CHECKING:
    from multiprocessing.managers import SyncManager
    from multiprocessing.pool import Pool


T = TypeVar("T")
LATER_TRIES = 5

SHARED_PATH = "shared"
OVERWRITES = 300
DELETE_EVERY = 7
"""Version `v` of the shared path is a delete where `v % DELETE_EVERY == 0`, else an upload
of `str(v)`; the last version is an upload."""


def lost_merge(repo: Repository, source: str, into: str) -> MergeRaceLost:
    """The error of a merge of `source` into `into` whose every attempt lost its race (the
    destination's update made to fail), with the hint the engine signed for that merge."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(repo.lake.graveler, "try_update_branch", lambda *args: False)
        with pytest.raises(MergeRaceLost) as lost:
            repo.merge(source, into=into)
    return lost.value


def committer(kv_url: str, repository: str, start, stop, commits) -> None:
    """Commit `main` of `repository` in a loop from `start` until `stop`, counting the
    commits made in `commits` (a manager's value)."""
    with Lake.connect(kv_url) as lake:
        main = lake.repository(repository).branch("main")
        start.wait(30)
        while not stop.is_set():
            try:
                main.commit(f"round {commits.value}")
                commits.value += 1
            except NoChanges:
                pass


def later(call: Callable[[], T], tries: int = LATER_TRIES) -> T:
    """`call()`, doing what `TooManyTries` asks (retry later) up to `tries` times: compactors
    sealing without pause on a loaded machine can make every validated look of one call lose.
    A write that gives up may leave its row in tokens sealed meanwhile, which a commit or
    compaction may still absorb: calling it again writes it again (see `delete_later`)."""
    for _ in range(tries - 1):
        try:
            return call()
        except TooManyTries:
            time.sleep(0.2)
    return call()


def delete_later(branch: Branch, path: str) -> None:
    """`branch.delete(path)` as `later` retries it. A retry that finds the path gone is the
    earlier try's tombstone, left in a sealed token and absorbed since: the delete landed."""
    calls = 0

    def delete() -> None:
        nonlocal calls
        calls += 1
        try:
            branch.delete(path)
        except NotFound:
            if calls == 1:
                raise

    later(delete)


def overwrite(kv_url: str, repository: str, start, announced) -> None:
    """Write versions 1 to OVERWRITES of the shared path on main, announcing each once it is
    acknowledged: what another process reads after an announcement must be that new."""
    with Lake.connect(kv_url) as lake:
        main = lake.repository(repository).branch("main")
        start.wait(60)
        for version in range(1, OVERWRITES + 1):
            if version % DELETE_EVERY:
                later(partial(main.upload, SHARED_PATH, str(version).encode()))
            else:
                delete_later(main, SHARED_PATH)
            announced.value = version


def read_back(kv_url: str, repository: str, start, stop, announced) -> tuple[int, list[str]]:
    """Read the shared path until `stop`, by a lookup and by a listing in turn; returns the
    reads and the stale ones. A read must show a version from the one announced before it
    began to the one in flight after it ended: a value, or a delete among those versions when
    the path is absent. A read that raises `TooManyTries` (compactors sealing without pause
    on a loaded machine can make a validated read lose every attempt) does what it asks,
    retry later, and is not a read."""
    versions = {content_checksum(str(v).encode()): v for v in range(1, OVERWRITES + 1)}
    reads, stale = 0, []
    with Lake.connect(kv_url) as lake:
        main = lake.repository(repository).branch("main")
        start.wait(60)
        while not stop.is_set():
            floor = announced.value
            if floor == 0:
                continue
            seen: int | None
            how = "listing" if reads % 2 else "lookup"
            try:
                if reads % 2:
                    listed = [e for e in main.list(prefix=SHARED_PATH) if e.path == SHARED_PATH]
                    seen = versions[listed[0].checksum] if listed else None
                else:
                    try:
                        seen = int(main.read(SHARED_PATH))
                    except NotFound as exc:
                        seen, how = None, f"lookup ({exc})"
            except TooManyTries:
                time.sleep(0.05)
                continue
            ceiling = announced.value + 1
            reads += 1
            if seen is None:
                if not any(v % DELETE_EVERY == 0 for v in range(floor, ceiling + 1)):
                    stale.append(f"{how}: absent, but versions {floor}-{ceiling} delete nothing")
            elif not floor <= seen <= ceiling:
                stale.append(f"{how}: version {seen} after version {floor} was acknowledged")
    return reads, stale


class SharedPathRace:
    """`overwrite` and `read_back` started in a race's pool: one process overwriting the
    shared path of `repository`'s main, another reading it back until `stop`."""

    PROCESSES = 2

    def __init__(
        self, manager: SyncManager, pool: Pool, kv_url: str, repository: str, start, stop
    ) -> None:
        self._announced = manager.Value("i", 0)
        """Held here: the manager frees a shared value once the parent drops its proxy."""
        args = (kv_url, repository, start)
        self._writes = pool.apply_async(overwrite, (*args, self._announced))
        self._reads = pool.apply_async(read_back, (*args, stop, self._announced))

    def wait_for_writes(self, timeout: float) -> None:
        self._writes.get(timeout)

    def check_reads(self, timeout: float) -> None:
        """Once `stop` is set: the reader read, and never saw the path older than it was."""
        reads, stale = self._reads.get(timeout)
        assert reads >= 1 and stale == [], f"{reads} reads, stale: {stale[:5]}"

    @staticmethod
    def check_committed(ref: Ref) -> None:
        assert ref.read(SHARED_PATH) == str(OVERWRITES).encode()
