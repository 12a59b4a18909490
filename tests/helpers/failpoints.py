"""Failpoints held from tests: the first thread to reach one waits for the test."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from branchwater.engine import failpoints
from branchwater.engine.graveler.graveler import RetryPolicy

if TYPE_CHECKING:
    pass


PAUSE_TIMEOUT = 60
SHORT_COMMIT_WAIT = RetryPolicy(commit_wait=0.25)
"""The retry policy of lakes whose commits tests kill or hold after their seal: the next
commit on the branch waits for such a seal this long, not the default's seconds, so it still
waits and still gives up."""


class Pause:
    """Holds the first thread that reaches a failpoint until `release`; later ones pass."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self._go = threading.Event()
        self._lock = threading.Lock()
        self._taken = False

    def hold(self) -> None:
        with self._lock:
            if self._taken:
                return
            self._taken = True
        self.reached.set()
        assert self._go.wait(PAUSE_TIMEOUT), "a paused operation was never released"

    def wait(self) -> None:
        assert self.reached.wait(PAUSE_TIMEOUT), "the operation never reached its failpoint"

    def release(self) -> None:
        self._go.set()


@contextmanager
def paused_at(point: str) -> Iterator[Pause]:
    """Arm `point` to hold the first thread that reaches it; released on the way out too."""
    pause = Pause()
    try:
        with failpoints.armed(point, pause.hold):
            yield pause
    finally:
        pause.release()


class Held:
    """An operation run in a thread of its own (`held_at`): what it returned, or raised."""

    def __init__(self) -> None:
        self.result: Any = None
        self.raised: BaseException | None = None


@contextmanager
def held_at(point: str, operation: Callable[[], Any]) -> Iterator[Held]:
    """Run `operation` in a thread held at `point` for the block (another process's step
    forced between two of its own), then released and joined: `Held` says how it ended."""
    held = Held()

    def run() -> None:
        try:
            held.result = operation()
        except BaseException as exc:
            held.raised = exc

    with paused_at(point) as pause:
        thread = threading.Thread(target=run)
        thread.start()
        pause.wait()
        try:
            yield held
        finally:
            pause.release()
            thread.join(PAUSE_TIMEOUT)
    assert not thread.is_alive(), f"the operation held at {point} never finished"
