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
    """An operation run in a thread of its own (`in_thread`, `held_at`): the thread, and what
    the operation returned, or raised."""

    def __init__(self, operation: Callable[[], Any]) -> None:
        self.result: Any = None
        self.raised: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(operation,))

    def _run(self, operation: Callable[[], Any]) -> None:
        try:
            self.result = operation()
        except BaseException as exc:
            self.raised = exc


def in_thread(operation: Callable[[], Any]) -> Held:
    """Start `operation` in a thread of its own; `Held` says how it ended once joined."""
    held = Held(operation)
    held.thread.start()
    return held


@contextmanager
def held_at(point: str, operation: Callable[[], Any]) -> Iterator[Held]:
    """Run `operation` in a thread held at `point` for the block (another process's step
    forced between two of its own), then released and joined: `Held` says how it ended."""
    with paused_at(point) as pause:
        held = in_thread(operation)
        pause.wait()
        try:
            yield held
        finally:
            pause.release()
            held.thread.join(PAUSE_TIMEOUT)
    assert not held.thread.is_alive(), f"the operation held at {point} never finished"
