"""SQLite's write lock held by another process: a conditional write waits for it within a
bound and is applied once, or, past the bound, is `Unavailable` with a message that says
what holds it up and that nothing was written (a busy refusal applies nothing, so the same
predicate still passes once the lock is let go)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from branchwater.engine.errors import Unavailable
from branchwater.engine.kv import Store, open_store, sql

GUARD = (b"branches", b"main")
HOLDER = textwrap.dedent(
    """
    import sqlite3, sys
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("INSERT OR REPLACE INTO branchwater_kv VALUES (x'70', x'686f6c646572', x'31')")
    print("held", flush=True)
    sys.stdin.readline()
    conn.execute("ROLLBACK")
    """
)
"""Another process that takes the write lock (with a write under way) until told to let go."""


class Holder:
    """Another process holding the database's write lock until `let_go` (from any thread,
    once)."""

    def __init__(self, path: Path) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.released = threading.Event()
        self._lock = threading.Lock()

    def let_go(self) -> None:
        with self._lock:
            if not self.released.is_set():
                self.released.set()
                assert self.process.stdin is not None
                self.process.stdin.write("\n")
                self.process.stdin.close()


@contextmanager
def write_lock_held(path: Path) -> Iterator[Holder]:
    holder = Holder(path)
    try:
        assert holder.process.stdout is not None
        assert holder.process.stdout.readline().strip() == "held"
        yield holder
    finally:
        holder.let_go()
        assert holder.process.wait(30) == 0


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
    with write_lock_held(tmp_path / "kv.db") as holder:
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
    with write_lock_held(tmp_path / "kv.db"), pytest.raises(Unavailable) as caught:
        run(store)
    message = str(caught.value)
    assert "database is locked" in message and str(tmp_path / "kv.db") in message
    assert "another connection held its write lock" in message
    assert "nothing was written" in message
    assert dict(store.scan(b"p")) == {b"k": b"old"}
    run(store)
    assert dict(store.scan(b"p")) == after
