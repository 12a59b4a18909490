"""The staged write against the swaps of its branch on PostgreSQL, where the row and its
validating read are one statement: only a change of what the write validates (the staging
token, the protection) waits for the writes under way; a commit's final swap passes them.
Forced with a row lock held by another session, not left to timing."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest

from branchwater.engine.api import Lake, Repository
from branchwater.engine.failpoints import armed
from branchwater.engine.kv.postgres import PostgresStore
from tests.helpers.row_locks import LOCK_WAIT_SECONDS, row_locked, waiting
from tests.helpers.servers import unique_name

pytestmark = pytest.mark.postgres


@pytest.fixture
def repo(postgres_url: str, tmp_path: Path) -> Iterator[Repository]:
    with Lake.connect(f"{postgres_url}?table={unique_name('writes_')}") as lake:
        repo = lake.create_repository("sales", f"file://{tmp_path}/sales")
        repo.branch("main").upload("base.txt", b"base")
        yield repo


def test_a_commits_final_swap_passes_a_write_under_way_and_the_next_seal_waits(
    repo: Repository, pg_session: psycopg.Connection
) -> None:
    """A write into the token the commit just opened is held mid-statement (its row locked by
    the other session), holding the branch record `FOR KEY SHARE`. The commit's final swap
    keeps that token, so it lands while the write is still under way; the next commit's seal
    moves the token, so it waits for the write, and commits it."""
    g = repo._g
    store = g.kv
    assert isinstance(store, PostgresStore)
    main = repo.branch("main")
    sealed, go = threading.Event(), threading.Event()

    def hold() -> None:
        sealed.set()
        assert go.wait(LOCK_WAIT_SECONDS)

    with ThreadPoolExecutor(3) as pool:
        with armed("commit.after_seal", hold):
            first = pool.submit(main.commit, "first")
            assert sealed.wait(LOCK_WAIT_SECONDS)
        main.upload("late.txt", b"early")
        token = g.refs.get_branch(repo.record, "main")[0].staging_token
        row = (token.encode(), b"late.txt")
        with row_locked(pg_session, store.table, row):
            write = pool.submit(main.upload, "late.txt", b"late")
            writer, _ = waiting(pg_session, "WITH guard")
            go.set()
            assert first.result(LOCK_WAIT_SECONDS).message == "first"
            assert not write.done()
            second = pool.submit(main.commit, "second")
            assert waiting(pg_session, "WITH fence")[1] == [writer]
            assert not second.done()
        write.result(LOCK_WAIT_SECONDS)
        assert second.result(LOCK_WAIT_SECONDS).message == "second"
    assert main.head().message == "second"
    assert main.read("late.txt") == b"late"
    assert list(main.uncommitted()) == []
