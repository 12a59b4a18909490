"""Compaction under real concurrency: separate processes on SQLite and PostgreSQL.

- Writers stage and delete paths while a committer commits and two compactors compact in a
  loop. Each writer checks that it reads its own writes and deletes; afterwards every
  acknowledged write is on the branch and in HEAD with its address, and no acknowledged
  delete comes back. Compactors sealing without a pause can outrun a commit's bounded
  retries on a loaded machine; the committer then does what `TooManyTries` asks (retries
  later), and most of its commits must make it. A writer's read-back can give up the same
  way (`TooManyTries`: the branch kept changing under every validated look), and so can its
  writes and the shared path's overwriter; each retries later too (`races.later`), and one
  that still gives up after a few tries fails the test. Another process overwrites and
  deletes a path meanwhile, and a reader in one more never reads it older than acknowledged.
- A compactor killed with SIGKILL right after any of its steps leaves the branch readable
  and complete, and the next compaction and commit succeed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from functools import partial
from pathlib import Path

import pytest

from branchwater.engine import Lake, NoChanges, NotFound, TooManyTries
from branchwater.engine.graveler import compaction
from branchwater.engine.graveler.graveler import LET_GO_DROP_S
from tests.helpers.races import SHARED_PATH, SharedPathRace, delete_later, later
from tests.helpers.servers import forked_context, forked_pool, forked_process

WRITERS = 3
WRITES_EACH = 120
DELETE_EVERY = 3
COMPACTORS = 2


def _writer(kv_url: str, index: int, start) -> tuple[dict[str, str], list[str], list[str]]:
    """Write paths of our own, deleting one of them every few writes; check each by reading."""
    live: dict[str, str] = {}
    deleted: list[str] = []
    violations: list[str] = []
    with Lake.connect(kv_url) as lake:
        main = lake.repository("race").branch("main")
        start.wait(60)
        for j in range(WRITES_EACH):
            path = f"w{index}/{j:04d}"
            entry = later(partial(main.upload, path, f"{index}-{j}".encode()))
            live[path] = entry.address
            if later(partial(main.stat, path)).address != entry.address:
                violations.append(f"{path} does not read back after its upload")
            if j % DELETE_EVERY == DELETE_EVERY - 1:
                victim = sorted(live)[len(live) // 2]
                delete_later(main, victim)
                del live[victim]
                deleted.append(victim)
                with contextlib.suppress(NotFound):
                    later(partial(main.stat, victim))
                    violations.append(f"{victim} still reads after its delete")
    return live, deleted, violations


def _committer(kv_url: str, start, stop) -> tuple[int, int, int]:
    """Commit in a loop; returns the commits made, the ones that ran out of tries and the
    ones that found nothing to commit."""
    commits = gave_up = empty = 0
    with Lake.connect(kv_url) as lake:
        main = lake.repository("race").branch("main")
        start.wait(60)
        while not stop.is_set():
            try:
                main.commit(f"round {commits}")
                commits += 1
            except NoChanges:
                empty += 1
            except TooManyTries:
                gave_up += 1
            time.sleep(0.05)
    return commits, gave_up, empty


def _compactor(kv_url: str, start, stop) -> dict[str, int]:
    outcomes: dict[str, int] = {}
    with Lake.connect(kv_url) as lake:
        main = lake.repository("race").branch("main")
        start.wait(60)
        while not stop.is_set():
            result = main.compact()
            outcomes[result.outcome] = outcomes.get(result.outcome, 0) + 1
    return outcomes


def race(kv_url: str, namespace: str) -> None:
    with Lake.connect(kv_url) as lake:
        main = lake.create_repository("race", storage_namespace=namespace).branch("main")
        for i in range(50):
            main.upload(f"base/{i:03d}", b"b")
        main.commit("base")
    with forked_pool(WRITERS + 1 + COMPACTORS + SharedPathRace.PROCESSES) as (manager, pool):
        start, stop = manager.Event(), manager.Event()
        committer = pool.apply_async(_committer, (kv_url, start, stop))
        compactors = [
            pool.apply_async(_compactor, (kv_url, start, stop)) for _ in range(COMPACTORS)
        ]
        writers = [pool.apply_async(_writer, (kv_url, i, start)) for i in range(WRITERS)]
        shared = SharedPathRace(manager, pool, kv_url, "race", start, stop)
        start.set()
        results = [w.get(300) for w in writers]
        shared.wait_for_writes(300)
        stop.set()
        shared.check_reads(300)
        commits, gave_up, empty = committer.get(300)
        outcomes: dict[str, int] = {}
        for c in compactors:
            for outcome, count in c.get(300).items():
                outcomes[outcome] = outcomes.get(outcome, 0) + count

    live = {path: address for result in results for path, address in result[0].items()}
    deleted = {path for result in results for path in result[1]}
    assert [v for result in results for v in result[2]] == []
    made = {"commits": commits, "gave_up": gave_up, "empty": empty, **outcomes}
    assert commits >= 1 and outcomes.get("compacted", 0) >= 2, made
    assert gave_up < commits, f"{gave_up} commits ran out of tries, {commits} made it"
    expected = {**{f"base/{i:03d}": None for i in range(50)}, SHARED_PATH: None, **live}
    with Lake.connect(kv_url) as lake:
        repo = lake.repository("race")
        main = repo.branch("main")
        shown = {e.path: e.address for e in main.list()}
        assert set(shown) == set(expected), "the branch lost or resurrected paths"
        assert {p: shown[p] for p in live} == live
        with contextlib.suppress(NoChanges):
            main.commit("final")
        head = {e.path: e.address for e in repo.ref("main").list()}
        assert set(head) == set(expected) and not deleted & set(head)
        SharedPathRace.check_committed(repo.ref("main"))
        assert {p: head[p] for p in live} == live
        assert list(main.uncommitted()) == []


@pytest.mark.slow
def test_compactors_race_writers_and_a_committer(race_kv: str, tmp_path: Path) -> None:
    race(race_kv, f"file://{tmp_path}/ns")


# --- kill -9 between steps -----------------------------------------------------------------


def _compact_and_hang(kv_url: str, stop_at: str, reached) -> None:
    """Compact, and at `stop_at` tell the parent and wait for its SIGKILL."""

    def hook(step: str) -> None:
        if step == stop_at:
            reached.set()
            time.sleep(600)

    with Lake.connect(kv_url) as lake:
        repo = lake.repository("kill")
        compaction.compact(lake.graveler, repo.record, "main", on_step=hook)


def prepare_kill(kv_url: str, namespace: str) -> dict[str, str]:
    with Lake.connect(kv_url) as lake:
        main = lake.create_repository("kill", storage_namespace=namespace).branch("main")
        for i in range(40):
            main.upload(f"d/{i:03d}", f"v{i}".encode())
        main.commit("tree")
        for i in range(0, 40, 2):
            main.delete(f"d/{i:03d}")
        main.upload("d/001", b"changed")
        main.upload("n/new", b"new")
        return {e.path: e.address for e in main.list()}


def kill_at(kv_url: str, namespace: str, step: str) -> None:
    expected = prepare_kill(kv_url, namespace)
    reached = forked_context().Event()
    child = forked_process(_compact_and_hang, kv_url, step, reached)
    child.start()
    try:
        assert reached.wait(120), f"the compactor never reached {step!r}"
        os.kill(child.pid, signal.SIGKILL)
        child.join(30)
    finally:
        if child.is_alive():
            child.kill()
    assert child.exitcode == -signal.SIGKILL

    with Lake.connect(kv_url) as lake:
        repo = lake.repository("kill")
        main = repo.branch("main")
        assert {e.path: e.address for e in main.list()} == expected
        assert main.read("d/001") == b"changed"
        with pytest.raises(NotFound):
            main.stat("d/000")
        removed = {c.path for c in main.uncommitted() if c.type == "removed"}
        assert removed == {f"d/{i:03d}" for i in range(0, 40, 2)}
        main.upload("later", b"l")
        assert main.compact().compacted
        expected["later"] = main.stat("later").address
        assert {e.path: e.address for e in main.list()} == expected
        commit = main.commit("after the kill")
        assert {e.path: e.address for e in repo.ref(commit.id).list()} == expected
        assert list(main.uncommitted()) == []


@pytest.mark.slow
@pytest.mark.parametrize("step", compaction.STEPS)
def test_a_killed_compactor_leaves_the_branch_whole(
    race_kv: str, tmp_path: Path, step: str
) -> None:
    kill_at(race_kv, f"file://{tmp_path}/ns", step)


# --- kill -9 right after the final set_if ----------------------------------------------------


def _absorb_and_die(kv_url: str, how: str) -> None:
    """Compact or commit, and die by SIGKILL the moment the branch has let go of its tokens,
    before any of their rows are dropped."""
    with Lake.connect(kv_url) as lake:
        lake.graveler.drop_listed_later = lambda mark, partitions: os.kill(  # type: ignore[method-assign]
            os.getpid(), signal.SIGKILL
        )
        main = lake.repository("kill").branch("main")
        if how == "compact":
            main.compact()
        else:
            main.commit("killed after its set_if")


def kill_after_update(kv_url: str, namespace: str, how: str) -> None:
    expected = prepare_kill(kv_url, namespace)
    with Lake.connect(kv_url) as lake:
        token = lake.graveler.read_branch(lake.repository("kill").record, "main").staging_token
    child = forked_process(_absorb_and_die, kv_url, how)
    child.start()
    child.join(120)
    if child.is_alive():
        child.kill()
    assert child.exitcode == -signal.SIGKILL

    with Lake.connect(kv_url) as lake:
        g, repo = lake.graveler, lake.repository("kill")
        main, record = repo.branch("main"), g.read_branch(repo.record, "main")
        assert token not in (record.staging_token, *record.sealed_tokens)
        assert list(g.kv.scan(token.encode())), "the absorbed rows were dropped before the kill"
        assert [m for m in g.refs.partitions_to_delete() if token.encode() in m.partitions]
        shown = main.list() if how == "compact" else repo.ref(record.commit_id).list()
        assert {e.path: e.address for e in shown} == expected
        main.upload("later", b"l")
        main.commit("a commit right after leaves the list to its process, as if alive")
        assert lake.wait_for_cleanup(timeout=60)
        assert list(g.kv.scan(token.encode()))
        (listed,) = [m for m in g.refs.partitions_to_delete() if token.encode() in m.partitions]
        aged = time.time() - LET_GO_DROP_S - 1
        g.refs.mark_partitions_for_deletion(listed.mark, listed.partitions, aged, listed.guard)
        main.upload("later", b"m")
        main.commit("the next commit sweeps what the dead process listed")
        assert lake.wait_for_cleanup(timeout=60)
        assert list(g.kv.scan(token.encode())) == []
        assert list(g.refs.partitions_to_delete()) == []


@pytest.mark.slow
@pytest.mark.parametrize("how", ["compact", "commit"])
def test_rows_absorbed_by_a_process_killed_after_its_update_are_dropped_later(
    race_kv: str, tmp_path: Path, how: str
) -> None:
    kill_after_update(race_kv, f"file://{tmp_path}/ns", how)
