"""SQLite's write lock held by another process: a conditional write waits for it within a
bound and is applied once, or, past the bound, is `Unavailable` with a message that says
what holds it up and that nothing was written (a busy refusal applies nothing, so the same
predicate still passes once the lock is let go). `SQLITE_PROTOCOL`, contention for the WAL's
locks that SQLite stopped retrying, is waited out within the same bound."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from branchwater.engine.errors import Unavailable
from branchwater.engine.kv import Store, open_store, sql
from branchwater.engine.kv.sql import Cursor
from branchwater.engine.kv.sqlite import SQLiteStore
from tests.helpers.row_locks import sqlite_write_lock_held
from tests.kv.conftest import GUARD


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    with open_store(f"sqlite:///{tmp_path / 'kv.db'}") as opened:
        opened.set(*GUARD, b"record")
        opened.set(b"p", b"k", b"old")
        yield opened


WRITES: dict[str, tuple[Callable[[Store], object], dict[bytes, bytes]]] = {
    "create": (lambda s: s.set_if(b"p", b"new", b"v", None), {b"k": b"old", b"new": b"v"}),
    "swap": (lambda s: s.set_if(b"p", b"k", b"v", b"old"), {b"k": b"v"}),
    "delete_if": (lambda s: s.delete_if(b"p", b"k", b"old"), {}),
    "create_guarded": (
        lambda s: s.create_guarded(b"p", b"new", b"v", GUARD, b"record"),
        {b"k": b"old", b"new": b"v"},
    ),
}


@pytest.mark.parametrize("write", WRITES)
def test_a_conditional_write_waits_for_another_process_to_let_go(
    store: Store, tmp_path: Path, write: str
) -> None:
    run, after = WRITES[write]
    with sqlite_write_lock_held(tmp_path / "kv.db") as holder:
        threading.Timer(0.5, holder.let_go).start()
        run(store)
        assert holder.released.is_set(), "applied while another process held the write lock"
    assert dict(store.scan(b"p")) == after


@pytest.mark.parametrize("write", WRITES)
def test_a_conditional_write_busy_past_the_bound_is_unavailable_and_wrote_nothing(
    store: Store, tmp_path: Path, write: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sql, "BUSY_TIMEOUT_SECONDS", 0.3)
    run, after = WRITES[write]
    with sqlite_write_lock_held(tmp_path / "kv.db"), pytest.raises(Unavailable) as caught:
        run(store)
    message = str(caught.value)
    assert "database is locked" in message and str(tmp_path / "kv.db") in message
    assert "another connection held its write lock" in message
    assert "nothing was written" in message
    assert dict(store.scan(b"p")) == {b"k": b"old"}
    run(store)
    assert dict(store.scan(b"p")) == after


class WalContended(SQLiteStore):
    """A store whose next `refusals` statements fail as SQLite fails a statement whose
    connection kept losing the race for the WAL's locks (`SQLITE_PROTOCOL`), which no
    test can make SQLite do on cue. Such a statement applied nothing."""

    refusals = 0

    def _open_cursor(self, dbapi: Any) -> Cursor:
        return _Refusing(super()._open_cursor(dbapi), self)


class _Refusing:
    def __init__(self, cursor: Cursor, store: WalContended) -> None:
        self._cursor = cursor
        self._store = store

    @property
    def rowcount(self) -> int:
        return self._cursor.rowcount

    def execute(self, sql: str, params: Sequence[Any], /) -> Cursor:
        if self._store.refusals > 0:
            self._store.refusals -= 1
            error = sqlite3.OperationalError("locking protocol")
            error.sqlite_errorcode = sqlite3.SQLITE_PROTOCOL
            raise error
        self._cursor.execute(sql, params)
        return self

    def fetchone(self) -> Any:
        return self._cursor.fetchone()

    def fetchall(self) -> list[Any]:
        return self._cursor.fetchall()


@pytest.fixture
def contended(tmp_path: Path) -> Iterator[WalContended]:
    with WalContended(f"sqlite:///{tmp_path / 'kv.db'}") as opened:
        opened.set(*GUARD, b"record")
        opened.set(b"p", b"k", b"old")
        assert isinstance(opened, WalContended)
        yield opened


@pytest.mark.parametrize("write", WRITES)
def test_a_conditional_write_refused_by_wal_lock_contention_is_sent_again(
    contended: WalContended, write: str
) -> None:
    run, after = WRITES[write]
    contended.refusals = 2
    run(contended)
    assert contended.refusals == 0
    assert dict(contended.scan(b"p")) == after


def test_a_read_refused_by_wal_lock_contention_is_sent_again(contended: WalContended) -> None:
    contended.refusals = 1
    assert contended.get(b"p", b"k").value == b"old"
    assert contended.refusals == 0


@pytest.mark.parametrize("write", WRITES)
def test_wal_lock_contention_past_the_bound_is_unavailable_and_wrote_nothing(
    contended: WalContended, tmp_path: Path, write: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sql, "BUSY_TIMEOUT_SECONDS", 0.3)
    run, after = WRITES[write]
    contended.refusals = 1 << 30
    with pytest.raises(Unavailable) as caught:
        run(contended)
    message = str(caught.value)
    assert "locking protocol" in message and str(tmp_path / "kv.db") in message
    assert "WAL locks stayed contended" in message
    assert "nothing was written" in message
    contended.refusals = 0
    assert dict(contended.scan(b"p")) == {b"k": b"old"}
    run(contended)
    assert dict(contended.scan(b"p")) == after
