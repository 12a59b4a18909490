"""SQLite's write lock held by another process: a conditional write waits for it within a
bound and is applied once, or, past the bound, is `Unavailable` with a message that says
what holds it up and that nothing was written (a busy refusal applies nothing, so the same
predicate still passes once the lock is let go)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from branchwater.engine.errors import Unavailable
from branchwater.engine.kv import Store, open_store, sql
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
