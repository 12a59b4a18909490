"""The repository's GC run lease: one GC run at a time, taken with compare-and-swap, expiring
so a crashed run does not block the next forever, and naming its holder to whoever waits."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from branchwater.engine import GCRunLocked, InvalidArgument, Lake
from tests.helpers.gc import FakeClock, use_clock
from tests.helpers.servers import forked_pool, unique_name

RACE_TIMEOUT = 60
RACERS = 4


def _race_for_the_lease(kv_url: str, repo_name: str, number: int, start) -> tuple[str, str]:
    """Take the lease as `runner <number>` at the barrier; ('won', holder) or ('lost', why)."""
    with Lake.connect(kv_url) as lake:
        repo = lake.repository(repo_name)
        holder = f"runner {number}"
        start.wait(RACE_TIMEOUT)
        try:
            repo.lock_gc_run(holder)
        except GCRunLocked as exc:
            return "lost", str(exc)
        return "won", holder


def race(kv_url: str, namespace: str) -> None:
    name = unique_name("lease-")
    with Lake.connect(kv_url) as lake:
        lake.create_repository(name, storage_namespace=namespace)
    with forked_pool(RACERS) as (manager, pool):
        start = manager.Barrier(RACERS)
        results = [
            pool.apply_async(_race_for_the_lease, (kv_url, name, number, start))
            for number in range(RACERS)
        ]
        outcomes = [result.get(RACE_TIMEOUT) for result in results]
    winners = [holder for outcome, holder in outcomes if outcome == "won"]
    assert len(winners) == 1, outcomes
    for outcome, message in outcomes:
        if outcome == "lost":
            assert f"another GC run holds repository {name!r}: {winners[0]}" in message


@pytest.mark.slow
def test_of_processes_racing_for_the_lease_one_wins(race_kv: str, tmp_path: Path) -> None:
    race(race_kv, f"file://{tmp_path}/ns")


@pytest.fixture
def lake(tmp_path: Path) -> Iterator[Lake]:
    with Lake.connect(f"sqlite:///{tmp_path}/lake.db") as lake:
        yield lake


@pytest.fixture
def clock(lake: Lake) -> FakeClock:
    clock = FakeClock()
    use_clock(lake, clock)
    return clock


def test_a_lease_shorter_than_a_second_is_refused(lake: Lake, tmp_path: Path) -> None:
    """It would renew faster than a remote KV store answers, always looking lapsed."""
    repo = lake.create_repository("sales", storage_namespace=f"file://{tmp_path}/ns")
    with pytest.raises(InvalidArgument, match="at least 1 s"):
        repo.lock_gc_run("h", ttl=timedelta(milliseconds=1))
    with repo.lock_gc_run("h", ttl=timedelta(seconds=1)) as lease:
        lease.check()


def test_a_crashed_holders_lease_expires_and_cannot_then_undo_its_successor(
    lake: Lake, clock: FakeClock, tmp_path: Path
) -> None:
    repo = lake.create_repository("sales", storage_namespace=f"file://{tmp_path}/ns")
    crashed = repo.lock_gc_run("dag gc_clean run 1", ttl=timedelta(minutes=1))

    clock.advance(timedelta(seconds=59))
    with pytest.raises(GCRunLocked, match=r"dag gc_clean run 1.*lease until"):
        repo.lock_gc_run("cli run")
    clock.advance(timedelta(seconds=2))
    successor = repo.lock_gc_run("cli run")

    with pytest.raises(GCRunLocked, match="taken over by 'cli run'"):
        crashed.renew()
    crashed.release()
    with pytest.raises(GCRunLocked, match="cli run"):
        repo.lock_gc_run("dag gc_clean run 2")
    successor.release()
    repo.lock_gc_run("dag gc_clean run 2").release()


def test_renewing_keeps_the_lease_and_releasing_frees_it_at_once(
    lake: Lake, clock: FakeClock, tmp_path: Path
) -> None:
    repo = lake.create_repository("sales", storage_namespace=f"file://{tmp_path}/ns")
    other = lake.create_repository("other", storage_namespace=f"file://{tmp_path}/other")
    lease = repo.lock_gc_run("first", ttl=timedelta(minutes=1))
    other.lock_gc_run("another repository's run").release()

    clock.advance(timedelta(seconds=50))
    lease.renew()
    clock.advance(timedelta(seconds=50))
    with pytest.raises(GCRunLocked, match="first"):
        repo.lock_gc_run("second")
    with lease:
        pass
    assert repo.lock_gc_run("second").holder == "second"
    for ttl in (timedelta(0), timedelta(days=10**8)):
        with pytest.raises(InvalidArgument, match="a duration above 0 up to 36500 days"):
            repo.lock_gc_run("third", ttl=ttl)
