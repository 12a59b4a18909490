"""SQLite's table layouts: new files are `WITHOUT ROWID`, older rowid files keep working, and
`upgrade_table` moves one to the new layout in one transaction while other processes write;
opening a file that has its table never waits for the write lock."""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

import pytest

from branchwater.engine import LakeClosed
from branchwater.engine.kv import open_store
from branchwater.engine.kv.sqlite import SQLiteStore
from tests.helpers.gc import rowid_sqlite_file
from tests.helpers.row_locks import sqlite_write_lock_held
from tests.helpers.servers import forked_context, forked_process

WRITERS = 3
KEYS_PER_WRITER = 300
START_TIMEOUT = 120


def table_sql(path: Path) -> str:
    with sqlite3.connect(path) as conn:
        (sql,) = conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = 'branchwater_kv'"
        ).fetchone()
    return str(sql)


def fill(store: SQLiteStore, partitions: int, keys: int) -> dict[tuple[bytes, bytes], bytes]:
    rows = {
        (b"p%d" % p, b"k%05d" % k): b"v%d-%d" % (p, k)
        for p in range(partitions)
        for k in range(keys)
    }
    for (partition, key), value in rows.items():
        store.set(partition, key, value)
    return rows


def contents(store: SQLiteStore, partitions: int) -> dict[tuple[bytes, bytes], bytes]:
    return {
        (b"p%d" % p, pair.key): pair.value
        for p in range(partitions)
        for pair in store.scan(b"p%d" % p)
    }


def test_a_new_file_gets_the_key_ordered_layout(tmp_path: Path) -> None:
    with open_store(f"sqlite:///{tmp_path / 'kv.db'}") as store:
        assert isinstance(store, SQLiteStore) and store.without_rowid
        assert store.upgrade_table() is False
    assert "WITHOUT ROWID" in table_sql(tmp_path / "kv.db").upper()


def test_a_closed_store_refuses_to_upgrade_and_opens_nothing(tmp_path: Path) -> None:
    store = open_store(rowid_sqlite_file(tmp_path / "kv.db"))
    assert isinstance(store, SQLiteStore) and not store.without_rowid
    store.close()
    with pytest.raises(LakeClosed):
        store.upgrade_table()
    assert "WITHOUT ROWID" not in table_sql(tmp_path / "kv.db").upper()


@pytest.mark.parametrize("layout", ["key-ordered", "rowid"])
def test_a_file_opens_and_reads_while_another_process_holds_the_write_lock(
    tmp_path: Path, layout: str
) -> None:
    """Writers waiting for the lock poll far more often than SQLite's busy handler, so an
    open that took the lock to look for its table could wait for as long as they write: a
    new process joining a busy lake (a task starting) would stall, then fail."""
    path = tmp_path / "kv.db"
    url = f"sqlite:///{path}" if layout == "key-ordered" else rowid_sqlite_file(path)
    with open_store(url) as store:
        store.set(b"p", b"k", b"v")
    with sqlite_write_lock_held(path), open_store(url) as store:
        assert isinstance(store, SQLiteStore)
        assert store.without_rowid is (layout == "key-ordered")
        assert store.get(b"p", b"k").value == b"v"
        assert [pair.key for pair in store.scan(b"p")] == [b"k"]


def test_an_older_rowid_file_opens_as_it_is(tmp_path: Path) -> None:
    url = rowid_sqlite_file(tmp_path / "kv.db")
    with open_store(url) as store:
        assert isinstance(store, SQLiteStore) and not store.without_rowid
        store.set(b"p", b"k", b"v")
        assert store.get(b"p", b"k").value == b"v"
    assert "WITHOUT ROWID" not in table_sql(tmp_path / "kv.db").upper()


def test_upgrade_keeps_every_row_and_a_store_opened_before_it_goes_on(tmp_path: Path) -> None:
    url = rowid_sqlite_file(tmp_path / "kv.db")
    with open_store(url) as upgrader, open_store(url) as other:
        assert isinstance(upgrader, SQLiteStore) and isinstance(other, SQLiteStore)
        rows = fill(other, partitions=4, keys=250)
        assert upgrader.upgrade_table() is True
        assert upgrader.without_rowid and upgrader.upgrade_table() is False
        assert contents(other, 4) == rows == contents(upgrader, 4)
        assert [pair.key for pair in other.scan(b"p1", b"k00100", 3)][:3] == [
            b"k00100",
            b"k00101",
            b"k00102",
        ]
        other.set(b"p9", b"after", b"upgrade")
        assert upgrader.get(b"p9", b"after").value == b"upgrade"
    assert "WITHOUT ROWID" in table_sql(tmp_path / "kv.db").upper()
    with open_store(url) as reopened:
        assert isinstance(reopened, SQLiteStore) and reopened.without_rowid


def write_keys(url: str, writer: int, barrier: Any) -> None:
    with open_store(url) as store:
        barrier.wait(START_TIMEOUT)
        for k in range(KEYS_PER_WRITER):
            store.set(b"w%d" % writer, b"k%05d" % k, b"v")


@pytest.mark.slow
def test_upgrade_while_other_processes_write_loses_nothing(tmp_path: Path) -> None:
    """Writers in other processes wait for the upgrade's transaction and then write into the
    new table: every acknowledged write is there afterwards."""
    url = rowid_sqlite_file(tmp_path / "kv.db")
    with open_store(url) as store:
        assert isinstance(store, SQLiteStore)
        fill(store, partitions=2, keys=2000)
        barrier = forked_context().Barrier(WRITERS + 1)
        writers = [forked_process(write_keys, url, w, barrier) for w in range(WRITERS)]
        for process in writers:
            process.start()
        try:
            barrier.wait(START_TIMEOUT)
            assert store.upgrade_table() is True
        finally:
            for process in writers:
                process.join(START_TIMEOUT)
        assert [process.exitcode for process in writers] == [0] * WRITERS
        for w in range(WRITERS):
            assert len(list(store.scan(b"w%d" % w))) == KEYS_PER_WRITER
        assert len(contents(store, 2)) == 4000
    assert "WITHOUT ROWID" in table_sql(tmp_path / "kv.db").upper()
