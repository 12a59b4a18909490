"""Background removal of expired GC records (copy records, used link tokens).

With no server, the processes that write these records are the ones that clean up after
each other: each runs a sweep now and then, off the caller's path.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from branchwater.engine.background import Background
from branchwater.engine.errors import BranchwaterError
from branchwater.engine.per_process import ChildSafeLock

log = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 600.0


class Housekeeper:
    """Runs each named job in one background thread, at most once per `interval` seconds."""

    def __init__(self, interval: float = SWEEP_INTERVAL_S) -> None:
        self.interval = interval
        self._last: dict[str, float] = {}
        self._lock = ChildSafeLock()
        self._background = Background(1, "bw-housekeeping")

    def maybe_run(self, name: str, job: Callable[[], object]) -> None:
        now = time.monotonic()
        with self._lock:
            last = self._last.get(name)
            if last is not None and now - last < self.interval:
                return
            self._last[name] = now
        self._background.submit(_quietly, name, job)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the sweeps under way; False if some still run after `timeout` seconds."""
        _, running = self._background.wait(timeout)
        return not running

    def close(self) -> None:
        self._background.close()


def _quietly(name: str, job: Callable[[], object]) -> None:
    """A failed sweep only delays cleanup: the next one removes the same records."""
    try:
        job()
    except BranchwaterError as exc:
        log.warning("GC housekeeping %s failed, left for the next sweep: %s", name, exc)
