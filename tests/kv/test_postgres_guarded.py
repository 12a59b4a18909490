"""`set_guarded` on PostgreSQL is one statement that reads the guard `FOR KEY SHARE`: the
interleavings a staged write's single round trip rests on, forced with row locks held by
another session and observed in `pg_blocking_pids`, not left to timing.

- A fence of the guard (a commit sealing the branch's token) that comes while a guarded
  write is under way waits for the write to be committed, so the committer, which reads
  the sealed token after its swap, sees the row.
- A guarded write that comes while a fence is under way waits for it and returns the
  swapped value, so the writer learns its token was sealed and writes again.
- A guarded write that comes while a fence waits for earlier ones waits behind it, so a
  stream of writes cannot hold a commit's seal off.
- An unfenced swap (a commit's final one, which keeps the token) and a guarded write pass
  each other.
- A guarded write locks the partitions it reads and writes, not every partition of the
  table (what a prepared read through the partitioned table does), and a guard deleted
  after a write is still found missing.
- `delete_guarded` (a delete dropping a row only staged) locks the guard as the write
  does: a fence that comes while it is under way waits for the removal; one under way
  when it comes is what it reads, and it removes nothing.
- `create_guarded` (an exclusive creation) locks the guard alike: a fence waits for the
  creation under way; one under way when it comes makes it refuse, writing nothing.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from branchwater.engine.errors import NotFound, PredicateFailed
from branchwater.engine.kv.postgres import PostgresStore
from tests.helpers.row_locks import LOCK_WAIT_SECONDS, partitions_locked, row_locked, waiting

pytestmark = pytest.mark.postgres

GUARD = (b"refs", b"branch")
ROW = (b"token-1", b"path")


@pytest.fixture
def store(pg_store: PostgresStore) -> PostgresStore:
    pg_store.set(*GUARD, b"token-1")
    return pg_store


@pytest.mark.parametrize("fence", [True, False], ids=["fence", "unfenced"])
def test_a_swap_of_the_guard_and_the_guarded_write_under_way(
    store: PostgresStore, pg_session: psycopg.Connection, fence: bool
) -> None:
    """A fence waits for the write (held on its row by the other session); an unfenced
    swap lands while the write is still held, and the write returns what it read."""
    store.set(*ROW, b"older")
    swapped_to = b"token-2" if fence else b"token-1 at commit 2"
    with ThreadPoolExecutor(2) as pool:
        with row_locked(pg_session, store.table, ROW):
            write = pool.submit(store.set_guarded, *ROW, b"written", GUARD)
            writer, blockers = waiting(pg_session, "WITH guard")
            assert blockers == [pg_session.info.backend_pid]
            swap = pool.submit(store.set_if, *GUARD, swapped_to, b"token-1", fence=fence)
            if fence:
                assert waiting(pg_session, "WITH fence")[1] == [writer]
                assert not swap.done()
            else:
                swap.result(LOCK_WAIT_SECONDS)
            assert not write.done()
        assert write.result(LOCK_WAIT_SECONDS) == b"token-1"
        swap.result(LOCK_WAIT_SECONDS)
    assert store.get(*GUARD).value == swapped_to
    assert store.get(*ROW).value == b"written"


def test_a_guarded_write_that_meets_a_fence_under_way_returns_the_swapped_value(
    store: PostgresStore, pg_session: psycopg.Connection
) -> None:
    """The fence is held up by the other session's lock of the guard row; the write comes
    while it waits there. A fence that locked less than `FOR UPDATE` would let the write,
    which read the guard before the fence committed, lock that old version and return
    it: the writer would take a write to a sealed token for acknowledged."""
    with ThreadPoolExecutor(2) as pool:
        with row_locked(pg_session, store.table, GUARD):
            swap = pool.submit(store.set_if, *GUARD, b"token-2", b"token-1")
            swapper, _ = waiting(pg_session, "WITH fence")
            write = pool.submit(store.set_guarded, *ROW, b"written", GUARD)
            assert waiting(pg_session, "WITH guard")[1] == [swapper]
            assert not write.done()
        swap.result(LOCK_WAIT_SECONDS)
        assert write.result(LOCK_WAIT_SECONDS) == b"token-2"
    assert store.get(*ROW).value == b"written"


def test_a_guarded_write_passes_an_unfenced_swap_under_way(
    store: PostgresStore, pg_session: psycopg.Connection
) -> None:
    with ThreadPoolExecutor(1) as pool, pg_session.transaction():
        swapped(pg_session, store.table, GUARD, b"token-1 at commit 2")
        write = pool.submit(store.set_guarded, *ROW, b"written", GUARD)
        assert write.result(LOCK_WAIT_SECONDS) == b"token-1"
    assert store.get(*GUARD).value == b"token-1 at commit 2"


def swapped(
    pg_session: psycopg.Connection, table: str, row: tuple[bytes, bytes], value: bytes
) -> None:
    """`row` updated to `value` in the other session's open transaction: a plain `UPDATE`,
    as an unfenced swap runs it (a fence is that under a `FOR UPDATE` lock)."""
    pg_session.execute(
        f'UPDATE "{table}" SET value = %s WHERE partition_key = %s AND key = %s', (value, *row)
    )


def test_a_guarded_write_does_not_overtake_a_swap_waiting_for_earlier_ones(
    store: PostgresStore, pg_session: psycopg.Connection
) -> None:
    store.set(*ROW, b"older")
    later = (b"token-1", b"later")
    with ThreadPoolExecutor(3) as pool:
        with row_locked(pg_session, store.table, ROW):
            first = pool.submit(store.set_guarded, *ROW, b"written", GUARD)
            writer, _ = waiting(pg_session, "WITH guard")
            swap = pool.submit(store.set_if, *GUARD, b"token-2", b"token-1")
            swapper, _ = waiting(pg_session, "WITH fence")
            second = pool.submit(store.set_guarded, *later, b"later", GUARD)
            assert waiting(pg_session, "WITH guard", besides=(writer,))[1] == [swapper]
            assert not (first.done() or swap.done() or second.done())
        assert first.result(LOCK_WAIT_SECONDS) == b"token-1"
        swap.result(LOCK_WAIT_SECONDS)
        assert second.result(LOCK_WAIT_SECONDS) == b"token-2"
    assert store.get(*later).value == b"later"


def test_a_guarded_write_locks_the_guards_partition_not_every_partition(
    store: PostgresStore, pg_session: psycopg.Connection
) -> None:
    """Held on its own row by the other session, the write has read the guard: the
    partitions it locks by then are the guard's and the row's, with the statement's plan
    made once for every guard (`GENERIC_PLANS`)."""
    store.set_guarded(*ROW, b"first", GUARD)
    with ThreadPoolExecutor(1) as pool, row_locked(pg_session, store.table, ROW):
        write = pool.submit(store.set_guarded, *ROW, b"written", GUARD)
        writer, _ = waiting(pg_session, "WITH guard")
        locked = partitions_locked(pg_session, writer, store.table)
        assert 1 <= len(locked) <= 2, locked
    assert write.result(LOCK_WAIT_SECONDS) == b"token-1"
    assert store.get(*ROW).value == b"written"


def test_a_guard_deleted_after_a_write_is_found_missing_and_nothing_is_written(
    store: PostgresStore,
) -> None:
    assert store.set_guarded(*ROW, b"first", GUARD) == b"token-1"
    store.delete(*GUARD)
    with pytest.raises(NotFound):
        store.set_guarded(*ROW, b"unguarded", GUARD)
    assert store.get(*ROW).value == b"first"
    store.set(*GUARD, b"token-2")
    assert store.set_guarded(*ROW, b"second", GUARD) == b"token-2"
    assert store.get(*ROW).value == b"second"


def test_a_fence_waits_for_a_guarded_delete_under_way(
    store: PostgresStore, pg_session: psycopg.Connection
) -> None:
    """The delete, held on its row by the other session, has locked the guard: the fence
    (a commit sealing the token) waits until the removal is committed, so the committer
    reading the sealed token never sees the row it removed."""
    store.set(*ROW, b"staged")
    with ThreadPoolExecutor(2) as pool:
        with row_locked(pg_session, store.table, ROW):
            delete = pool.submit(store.delete_guarded, *ROW, GUARD, b"token-1")
            deleter, _ = waiting(pg_session, "WITH guard")
            swap = pool.submit(store.set_if, *GUARD, b"token-2", b"token-1")
            assert waiting(pg_session, "WITH fence")[1] == [deleter]
            assert not (delete.done() or swap.done())
        assert delete.result(LOCK_WAIT_SECONDS)
        swap.result(LOCK_WAIT_SECONDS)
    with pytest.raises(NotFound):
        store.get(*ROW)


def test_a_guarded_delete_that_meets_a_fence_under_way_removes_nothing(
    store: PostgresStore, pg_session: psycopg.Connection
) -> None:
    """The fence is held up by the other session's lock of the guard row; the delete comes
    while it waits there, waits behind it, reads the swapped value and leaves the row."""
    store.set(*ROW, b"staged")
    with ThreadPoolExecutor(2) as pool:
        with row_locked(pg_session, store.table, GUARD):
            swap = pool.submit(store.set_if, *GUARD, b"token-2", b"token-1")
            swapper, _ = waiting(pg_session, "WITH fence")
            delete = pool.submit(store.delete_guarded, *ROW, GUARD, b"token-1")
            assert waiting(pg_session, "WITH guard")[1] == [swapper]
            assert not delete.done()
        swap.result(LOCK_WAIT_SECONDS)
        assert not delete.result(LOCK_WAIT_SECONDS)
    assert store.get(*ROW).value == b"staged"


def test_a_fence_waits_for_a_guarded_creation_under_way(
    store: PostgresStore, pg_session: psycopg.Connection
) -> None:
    """The creation (over a tombstone, whose row the other session holds) has locked the
    guard: the fence waits until the row is committed, so the committer reading the sealed
    token sees it."""
    store.set(*ROW, b"")
    with ThreadPoolExecutor(2) as pool:
        with row_locked(pg_session, store.table, ROW):
            create = pool.submit(store.create_guarded, *ROW, b"created", GUARD, b"token-1")
            creator, _ = waiting(pg_session, "WITH guard")
            swap = pool.submit(store.set_if, *GUARD, b"token-2", b"token-1")
            assert waiting(pg_session, "WITH fence")[1] == [creator]
            assert not (create.done() or swap.done())
        assert create.result(LOCK_WAIT_SECONDS)
        swap.result(LOCK_WAIT_SECONDS)
    assert store.get(*ROW).value == b"created"


def test_a_guarded_creation_that_meets_a_fence_under_way_writes_nothing(
    store: PostgresStore, pg_session: psycopg.Connection
) -> None:
    """The creation comes while a fence waits on the guard row, waits behind it, reads the
    swapped value and refuses; the tombstone stays."""
    store.set(*ROW, b"")
    with ThreadPoolExecutor(2) as pool:
        with row_locked(pg_session, store.table, GUARD):
            swap = pool.submit(store.set_if, *GUARD, b"token-2", b"token-1")
            swapper, _ = waiting(pg_session, "WITH fence")
            create = pool.submit(store.create_guarded, *ROW, b"created", GUARD, b"token-1")
            assert waiting(pg_session, "WITH guard")[1] == [swapper]
            assert not create.done()
        swap.result(LOCK_WAIT_SECONDS)
        with pytest.raises(PredicateFailed):
            create.result(LOCK_WAIT_SECONDS)
    assert store.get(*ROW).value == b""
