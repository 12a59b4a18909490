"""Background removal of expired GC records (copy records, used link tokens).

With no server, the processes that write these records are the ones that clean up after
each other: each runs a sweep now and then, off the caller's path.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait

from branchwater.engine.errors import BranchwaterError

log = logging.getLogger(__name__)

SWEEP_INTERVAL_S = 600.0


class Housekeeper:
    """Runs each named job in one background thread, at most once per `interval` seconds."""

    def __init__(self, interval: float = SWEEP_INTERVAL_S) -> None:
        self.interval = interval
        self._last: dict[str, float] = {}
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._pending: list[Future[None]] = []

    def maybe_run(self, name: str, job: Callable[[], object]) -> None:
        now = time.monotonic()
        with self._lock:
            last = self._last.get(name)
            if last is not None and now - last < self.interval:
                return
            self._last[name] = now
            if self._executor is None:
                self._executor = ThreadPoolExecutor(
                    max_workers=1, thread_name_prefix="bw-housekeeping"
                )
            self._pending = [f for f in self._pending if not f.done()]
            self._pending.append(self._executor.submit(_quietly, name, job))

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the sweeps under way; False if some still run after `timeout` seconds."""
        with self._lock:
            pending = list(self._pending)
        _, running = wait(pending, timeout)
        return not running

    def close(self) -> None:
        self.wait()
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)


def _quietly(name: str, job: Callable[[], object]) -> None:
    """A failed sweep only delays cleanup: the next one removes the same records."""
    try:
        job()
    except BranchwaterError as exc:
        log.warning("GC housekeeping %s failed, left for the next sweep: %s", name, exc)
