"""PostgreSQL statements the server ran and committed, whose reply never reached the client.

A relay between the store and the server forwards both ways and, once armed, cuts the
connection when the server answers the request it picked: the statement was run and
committed (autocommit: the reply is sent after the commit), the client reads EOF. That is
the worst moment for a lost session, and the one a terminated backend cannot force.

A conditional write so cut is `OutcomeUnknown`, never sent again (it would find its own
write and report `PredicateFailed`); a statement that may run twice is run again on a new
connection. A commit or merge whose branch swap is cut reads the branch, finds its record
and succeeds; a branch delete so cut is `OutcomeUnknown` and its next call finds it done.
Nothing is recorded twice, and the tokens they let go of are dropped.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import psycopg
import pytest

from branchwater.engine import (
    AlreadyExists,
    Lake,
    NoChanges,
    NotFound,
    OutcomeUnknown,
    PathExists,
    PredicateFailed,
    Unavailable,
    failpoints,
)
from branchwater.engine.api import Repository
from branchwater.engine.kv import EXISTS, Store, open_store
from branchwater.engine.kv.postgres import PostgresStore
from tests.helpers.relay import Relay, close_socket
from tests.helpers.row_locks import row_locked
from tests.helpers.servers import PG_HOST, PG_PORT, unique_name
from tests.helpers.views import committed, work_under_way

pytestmark = pytest.mark.postgres

GUARD = (b"branches", b"main")
WAIT_S = 30.0
UNKNOWN = "may or may not have been applied"


class ReplyCutter(Relay):
    """A relay to PostgreSQL that cuts a connection at the reply to a picked request, or
    the client's side of it right after the request (the server's stays open)."""

    def __init__(self) -> None:
        super().__init__((PG_HOST, PG_PORT))
        self.cuts = 0
        self._picks: Callable[[bytes], bool] | None = None
        self._at_request = False

    def url(self, database_url: str) -> str:
        """`database_url` (a postgresql:// URL of the local server) through the relay."""
        return database_url.replace(f"{PG_HOST}:{PG_PORT}", f"127.0.0.1:{self.port}", 1)

    def cut_reply_to(self, picks: Callable[[bytes], bool]) -> None:
        """Cut the connection of the next request `picks` (bytes the client sent, a whole
        Bind/Execute/Sync of one statement) at the server's first byte of reply."""
        with self._lock:
            self._picks, self._at_request = picks, False

    def cut_client_after(self, picks: Callable[[bytes], bool]) -> None:
        """Forward the next request `picks` to the server, then close the client's side
        only: to the server, which never hears it go, the statement runs on, as across a
        network partition (replies later go nowhere)."""
        with self._lock:
            self._picks, self._at_request = picks, True

    def pipe(self, client: socket.socket, server: socket.socket) -> None:
        cut = threading.Event()
        threading.Thread(target=self._requests, args=(client, server, cut), daemon=True).start()
        threading.Thread(target=self._replies, args=(server, client, cut), daemon=True).start()

    def _requests(self, client: socket.socket, server: socket.socket, cut: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while data := client.recv(65536):
                with self._lock:
                    picked, at_request = self._picks is not None and self._picks(data), False
                    if picked:
                        self._picks, at_request = None, self._at_request
                        cut.set()
                server.sendall(data)
                if at_request:
                    with self._lock:
                        self.cuts += 1
                    close_socket(client)
                    return
        close_socket(server)

    def _replies(self, server: socket.socket, client: socket.socket, cut: threading.Event) -> None:
        with contextlib.suppress(OSError):
            while data := server.recv(65536):
                if cut.is_set() or client.fileno() < 0:
                    with self._lock:
                        self.cuts += 1
                    break
                client.sendall(data)
        close_socket(client)
        close_socket(server)


@pytest.fixture
def relay() -> Iterator[ReplyCutter]:
    cutter = ReplyCutter()
    cutter.start()
    yield cutter
    cutter.stop()


@pytest.fixture
def store(relay: ReplyCutter, postgres_url: str) -> Iterator[PostgresStore]:
    with open_store(relay.url(f"{postgres_url}?table={unique_name('kv_')}")) as opened:
        assert isinstance(opened, PostgresStore)
        opened.set(*GUARD, b"record")
        yield opened


def marker() -> bytes:
    """A value no other request carries, to pick the request that writes it."""
    return f"mark-{uuid.uuid4().hex}".encode()


Op = Callable[[Store, bytes], object]
"""A store call given the marker it writes (or expects) and returns what it returned."""

CONDITIONAL: dict[str, tuple[Op, Callable[[bytes], bytes | None]]] = {
    "create": (lambda s, m: s.set_if(b"p", b"k", m, None), lambda m: m),
    "replace": (lambda s, m: s.set_if(b"p", b"old", m, EXISTS), lambda m: m),
    "swap": (lambda s, m: s.set_if(b"p", b"old", m, b"old"), lambda m: m),
    "swap-unfenced": (lambda s, m: s.set_if(b"p", b"old", m, b"old", fence=False), lambda m: m),
    "create-guarded": (lambda s, m: s.create_guarded(b"p", b"k", m, GUARD, b"record"), lambda m: m),
}


def _value(store: Store, key: bytes) -> bytes | None:
    try:
        return store.get(b"p", key).value
    except NotFound:
        return None


@pytest.mark.parametrize("write", CONDITIONAL)
def test_a_conditional_write_whose_reply_was_lost_is_unknown_not_retried(
    store: PostgresStore, relay: ReplyCutter, write: str
) -> None:
    """Applied and committed, reply lost: `Unavailable` saying so; sent again it would be a
    false `PredicateFailed` (or, after an ABA, a double apply)."""
    run, stored = CONDITIONAL[write]
    store.set(b"p", b"old", b"old")
    mark = marker()
    relay.cut_reply_to(lambda data: mark in data)
    with pytest.raises(OutcomeUnknown, match=UNKNOWN):
        run(store, mark)
    assert relay.cuts == 1
    key = b"k" if write in ("create", "create-guarded") else b"old"
    assert _value(store, key) == stored(mark), "the write was not applied: no reply was lost"


def test_a_conditional_delete_whose_reply_was_lost_is_unknown_not_retried(
    store: PostgresStore, relay: ReplyCutter
) -> None:
    mark = marker()
    store.set(b"p", b"k", mark)
    relay.cut_reply_to(lambda data: mark in data)
    with pytest.raises(OutcomeUnknown, match=UNKNOWN):
        store.delete_if(b"p", b"k", mark)
    assert relay.cuts == 1
    assert _value(store, b"k") is None


def test_a_unique_write_whose_reply_was_lost_is_settled_by_a_read(
    store: PostgresStore, relay: ReplyCutter, pg_session: psycopg.Connection
) -> None:
    """`set_unique_if`: the key holding the value written means it landed; holding another
    (the write waiting on a lock, its client gone) settles nothing."""
    store.set(b"p", b"k", b"old")
    mark = marker()
    relay.cut_reply_to(lambda data: mark in data)
    store.set_unique_if(b"p", b"k", mark, b"old")
    assert relay.cuts == 1 and _value(store, b"k") == mark
    with row_locked(pg_session, store.table, (b"p", b"k")):
        other = marker()
        relay.cut_client_after(lambda data: other in data)
        with pytest.raises(OutcomeUnknown, match=UNKNOWN):
            store.set_unique_if(b"p", b"k", other, mark)


def test_a_gc_run_lease_whose_replies_were_lost_is_held_and_renewed(
    repo: Repository, relay: ReplyCutter
) -> None:
    """Taking the lease and renewing it write records naming this run alone: a lost reply
    read back as ours is ours, not `GCRunLocked` by ourselves until the lease expires."""
    holder = f"run-{uuid.uuid4().hex}"
    relay.cut_reply_to(lambda data: holder.encode() in data)
    lease = repo.lock_gc_run(holder)
    assert relay.cuts == 1
    taken = lease.current()
    assert taken is not None and taken.holder == holder
    relay.cut_reply_to(lambda data: holder.encode() in data)
    lease.renew()
    assert relay.cuts == 2
    renewed = lease.current()
    assert renewed is not None and renewed.expires >= taken.expires
    lease.release()


def test_a_conditional_write_cut_off_may_still_land_after_it_failed(
    store: PostgresStore, relay: ReplyCutter, pg_session: psycopg.Connection
) -> None:
    """The client's side lost while the statement waits on a row lock: `Unavailable`, and a
    read then shows the write not applied, yet it lands once the lock is let go. So a read
    that does not show such a write settles nothing: only a conditional retry is safe (it
    and the late write cannot both apply)."""
    store.set(b"p", b"k", b"old")
    with row_locked(pg_session, store.table, (b"p", b"k")):
        mark = marker()
        relay.cut_client_after(lambda data: mark in data)
        with pytest.raises(OutcomeUnknown, match=UNKNOWN):
            store.set_if(b"p", b"k", mark, b"old")
        assert _value(store, b"k") == b"old"
    deadline = time.monotonic() + WAIT_S
    while _value(store, b"k") != mark:
        assert time.monotonic() < deadline, "the cut-off write never landed"
        time.sleep(0.01)
    with pytest.raises(PredicateFailed):
        store.set_if(b"p", b"k", b"retry", b"old")


REPEATABLE: dict[str, tuple[Op, object]] = {
    "set": (lambda s, m: s.set(b"p", b"k", m), None),
    "set-guarded": (lambda s, m: s.set_guarded(b"p", b"k", m, GUARD), b"record"),
}


@pytest.mark.parametrize("write", REPEATABLE)
def test_a_write_that_may_run_twice_is_run_again_after_a_lost_reply(
    store: PostgresStore, relay: ReplyCutter, write: str
) -> None:
    run, returned = REPEATABLE[write]
    mark = marker()
    relay.cut_reply_to(lambda data: mark in data)
    assert run(store, mark) == returned
    assert relay.cuts == 1
    assert _value(store, b"k") == mark


def test_a_guarded_delete_whose_reply_was_lost_is_run_again(
    store: PostgresStore, relay: ReplyCutter
) -> None:
    """Removing twice is removing once; the repeat still sees the guard hold."""
    mark = marker()
    store.set(*GUARD, mark)
    store.set(b"p", b"k", b"v")
    relay.cut_reply_to(lambda data: mark in data)
    assert store.delete_guarded(b"p", b"k", GUARD, mark) is True
    assert relay.cuts == 1
    assert _value(store, b"k") is None


def test_the_store_serves_the_next_calls_after_a_lost_reply(
    store: PostgresStore, relay: ReplyCutter
) -> None:
    """The connection that lost its reply is dropped, never handed out again."""
    mark = marker()
    relay.cut_reply_to(lambda data: mark in data)
    with pytest.raises(Unavailable):
        store.set_if(b"p", b"k", mark, None)
    assert all(conn.usable for conn in store._idle)
    store.set_if(b"p", b"k", b"next", mark)
    store.delete_if(b"p", b"k", b"next")
    assert _value(store, b"k") is None


@pytest.fixture
def lake(relay: ReplyCutter, postgres_url: str) -> Iterator[Lake]:
    with Lake.connect(relay.url(f"{postgres_url}?table={unique_name('lake_')}")) as opened:
        yield opened


@pytest.fixture
def repo(lake: Lake, tmp_path: Path) -> Repository:
    return work_under_way(lake, "lost", f"file://{tmp_path}/ns")


def cut_branch_swap(lake: Lake, repo: Repository, relay: ReplyCutter, branch: str) -> None:
    """Cut the reply to the next conditional write of `branch`'s record as it is now: the
    request carries the record read as its predicate (a read of the record does not)."""
    partition = lake.graveler.refs.get_repository(repo.name).partition
    key = f"branches/{branch}".encode()
    record = lake.graveler.kv.get(partition, key).value
    relay.cut_reply_to(lambda data: key in data and record in data)


def armed_cut(
    lake: Lake, repo: Repository, relay: ReplyCutter, point: str, branch: str
) -> AbstractContextManager[None]:
    """`point` armed to cut the reply to the next swap of `branch` (`cut_branch_swap`)."""
    return failpoints.armed(point, lambda: cut_branch_swap(lake, repo, relay, branch))


def token_rows(lake: Lake, tokens: list[str]) -> int:
    return sum(1 for token in tokens for _ in lake.graveler.kv.scan(token.encode()))


def dropped(lake: Lake, tokens: list[str]) -> bool:
    """Whether the tokens' rows are gone once the background drops and the cleanup ran."""
    assert lake.wait_for_cleanup(WAIT_S)
    lake.graveler.collect_dropped_partitions()
    return token_rows(lake, tokens) == 0


def tokens_of(lake: Lake, repo: Repository, branch: str) -> list[str]:
    record = lake.graveler.read_branch(lake.graveler.refs.get_repository(repo.name), branch)
    return [record.staging_token, *record.sealed_tokens]


def test_a_commit_whose_branch_swap_reply_was_lost_has_landed_once(
    lake: Lake, repo: Repository, relay: ReplyCutter
) -> None:
    """The commit reads the branch, finds its swap landed and succeeds; the next commit has
    nothing to record (not a second commit of the same changes), and the token the commit
    let go of is dropped."""
    main = repo.branch("main")
    before = main.head().id
    sealed = tokens_of(lake, repo, "main")
    with armed_cut(lake, repo, relay, "commit.before_set", "main"):
        landed = main.commit("b")
    assert relay.cuts == 1
    assert main.head() == landed
    assert landed.parents == (before,) and landed.message == "b"
    assert committed(repo, "main") == ["a", "b"]
    with pytest.raises(NoChanges) as again:
        main.commit("b")
    assert type(again.value) is NoChanges, again.value
    assert main.head().id == landed.id
    assert dropped(lake, sealed), "the landed commit's token was never dropped"


def test_a_merge_whose_branch_swap_reply_was_lost_has_landed_once(
    lake: Lake, repo: Repository, relay: ReplyCutter
) -> None:
    main = repo.branch("main")
    main.commit("b")
    target = repo.create_branch("target", "main")
    target.upload("t", b"t")
    target.commit("t")
    with armed_cut(lake, repo, relay, "merge.before_set", "target"):
        merged = repo.merge("feature", into="target", message="merge").commit
    assert relay.cuts == 1
    assert committed(repo, "target") == ["a", "b", "f", "t"]
    assert repo.branch("target").head() == merged
    with pytest.raises(NoChanges):
        repo.merge("feature", into="target", message="merge")
    assert repo.branch("target").head().id == merged.id


def test_a_branch_delete_whose_reply_was_lost_has_deleted_it_and_drops_its_tokens(
    lake: Lake, repo: Repository, relay: ReplyCutter
) -> None:
    feature = repo.branch("feature")
    feature.upload("g", b"g")
    tokens = tokens_of(lake, repo, "feature")
    assert token_rows(lake, tokens) == 1
    cut = armed_cut(lake, repo, relay, "branch.before_delete", "feature")
    with cut, pytest.raises(OutcomeUnknown, match=UNKNOWN):
        repo.delete_branch("feature")
    assert relay.cuts == 1
    with pytest.raises(NotFound):
        repo.branch("feature").head()
    assert dropped(lake, tokens), "the deleted branch's token was never dropped"


def test_an_exclusive_upload_whose_reply_was_lost_is_settled_by_a_read(
    lake: Lake, repo: Repository, relay: ReplyCutter
) -> None:
    """The creation is not sent again (it would find its own row and say the path exists):
    a read finds the row holding its entry, whose address is new, so it has landed."""
    main = repo.branch("main")
    arm = failpoints.armed(
        "write.before_create", lambda: relay.cut_reply_to(lambda data: b"new-path" in data)
    )
    with arm:
        entry = main.upload("new-path", b"n", if_absent=True)
    assert relay.cuts == 1
    assert main.stat("new-path") == entry
    assert main.read("new-path") == b"n"
    with pytest.raises(PathExists):
        main.upload("new-path", b"n", if_absent=True)


def test_a_repository_creation_whose_reply_was_lost_is_settled_by_a_read(
    lake: Lake, relay: ReplyCutter, tmp_path: Path
) -> None:
    """Its record names a new unique id, so a read showing it settles the creation, which
    then takes its partition off the to-delete list: a cleanup leaves it alone."""
    name = unique_name("lost-repo-")
    key = b"repos/" + name.encode()
    arm = failpoints.armed(
        "repository.before_insert", lambda: relay.cut_reply_to(lambda data: key in data)
    )
    with arm:
        repo = lake.create_repository(name, storage_namespace=f"file://{tmp_path}/{name}")
    assert relay.cuts == 1
    lake.graveler.collect_dropped_partitions()
    repo.branch("main").upload("a", b"a")
    assert lake.repository(name).branch("main").read("a") == b"a"


def test_a_branch_creation_whose_reply_was_lost_is_settled_by_a_read(
    lake: Lake, repo: Repository, relay: ReplyCutter
) -> None:
    arm = failpoints.armed(
        "branch.before_insert",
        lambda: relay.cut_reply_to(lambda data: b"branches/lost-branch" in data),
    )
    with arm:
        created = repo.create_branch("lost-branch", "main")
    assert relay.cuts == 1
    assert created.head() == repo.branch("main").head()
    with pytest.raises(AlreadyExists):
        repo.create_branch("lost-branch", "main")


def test_a_tag_creation_whose_reply_was_lost_is_settled_by_a_read(
    lake: Lake, repo: Repository, relay: ReplyCutter
) -> None:
    """Sent again, it would meet its own tag as `AlreadyExists`: a read finding the tag at
    the commit asked for settles it as created; one finding another commit's settles
    nothing."""
    relay.cut_reply_to(lambda data: b"tags/lost-tag" in data)
    tag = repo.tag("lost-tag", "main")
    assert relay.cuts == 1
    assert (tag.name, tag.commit_id) == ("lost-tag", repo.branch("main").head().id)
    assert repo.tags() == [tag]
    taken = repo.tag("taken", "feature")
    relay.cut_reply_to(lambda data: b"tags/taken" in data)
    with pytest.raises(OutcomeUnknown):
        repo.tag("taken", "main")
    assert relay.cuts == 2
    assert repo.tags() == [tag, taken]


def _sessions(admin_url: str, application: str) -> list[int]:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as admin:
        rows = admin.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (application,)
        ).fetchall()
    return [pid for (pid,) in rows]


def _cut(admin_url: str, pids: list[int]) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (pids,))
        while admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY(%s)", (pids,)
        ).fetchone()[0]:  # type: ignore[index]
            pass


def test_sessions_lost_again_and_again_leave_no_connection_behind(postgres_url: str) -> None:
    """Each round a burst of threads leaves idle connections and the server cuts them all:
    the store's next calls succeed, and it holds exactly the sessions its pool keeps (each
    lost one closed, none opened and forgotten); `close` ends them all."""
    application = unique_name("leak_")
    url = f"{postgres_url}?table={unique_name('kv_')}&application_name={application}"
    with open_store(url) as store:
        assert isinstance(store, PostgresStore)
        store.set(b"p", b"k", b"0")
        for round_ in range(5):
            taken = [store._take() for _ in range(8)]
            for conn in taken:
                store._give(conn)
            pids = _sessions(postgres_url, application)
            assert len(pids) == 8
            _cut(postgres_url, pids)
            value = store.get(b"p", b"k").value
            store.set_if(b"p", b"k", b"%d" % (round_ + 1), value)
            store.set_if(b"p", b"tmp", b"t", None)
            store.delete_if(b"p", b"tmp", b"t")
            assert [kv.key for kv in store.scan(b"p")] == [b"k"]
            assert len(_sessions(postgres_url, application)) == len(store._idle) == 1
    assert _sessions(postgres_url, application) == []
