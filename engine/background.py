"""Threads a process runs work on off the caller's path, and what a forked child makes of them.

A process that forks (a task runner, a multiprocessing pool) leaves its threads behind: the
child inherits executors whose threads it does not have, and work that no thread of its will
run, so submitting to them, or waiting for that work, would hang it. A `Background` starts
its threads on first use in each process; a forked child forgets its parent's threads and
work, as the KV stores forget their connections (`kv/sql.py`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

from branchwater.engine.errors import lake_closed
from branchwater.engine.per_process import forget_in_child

T = TypeVar("T")


class Background:
    """Up to `workers` threads named `name`, started on first use, for work whose callers
    may wait for it all (`wait`) before they stop the threads (`shutdown`)."""

    def __init__(self, workers: int, name: str) -> None:
        self._workers = workers
        self._name = name
        self._lock = threading.Lock()
        self._executor: ThreadPoolExecutor | None = None
        self._pending: list[Future[Any]] = []
        self._closed = False
        forget_in_child(self)

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        with self._lock:
            if self._closed:
                raise lake_closed()
            if self._executor is None:
                self._executor = ThreadPoolExecutor(self._workers, thread_name_prefix=self._name)
            self._pending = [future for future in self._pending if not future.done()]
            future = self._executor.submit(fn, *args)
            self._pending.append(future)
            return future

    def wait(self, timeout: float | None = None) -> tuple[set[Future[Any]], set[Future[Any]]]:
        """Wait for the work submitted so far: (finished, still running after `timeout`)."""
        with self._lock:
            pending = list(self._pending)
        finished, running = wait(pending, timeout)
        with self._lock:
            self._pending = [future for future in self._pending if future not in finished]
        return finished, running

    def shutdown(self) -> None:
        """Wait for the work, then stop the threads; a later `submit` starts them again."""
        self.wait()
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=True)

    def close(self) -> None:
        """`shutdown` for good: a later `submit` raises `LakeClosed` instead of starting
        threads again, so work still running when its lake closes leaves none behind."""
        with self._lock:
            self._closed = True
        self.shutdown()

    def after_fork_in_child(self) -> None:
        """In a forked child: the parent's threads are not here, nor is anyone running its
        work; its lock may have been held at the fork."""
        self._lock = threading.Lock()
        self._executor = None
        self._pending = []
