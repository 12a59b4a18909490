"""Interpreter exit while pyarrow's threads still release the file objects a store opened.

pandas and pyarrow datasets read our file objects on Arrow's thread pools, and Arrow tears a
finished scan down on those threads after the read has returned: each file object, each
buffer a read returned and the fsspec handler is released with the GIL taken. When the
main thread reaches interpreter finalization while such a thread waits for the GIL, Python
(3.11, up to 3.13) ends that thread with `pthread_exit`, whose unwinding through Arrow's
`noexcept` destructors calls `std::terminate`: the process aborts after its work is done
("terminate called without an active exception", apache/arrow#34314). So the first file a
store opens registers an exit hook that waits, with the GIL released, until Arrow's CPU and
I/O pools are idle. Exit hooks run before finalization starts, so no Arrow thread is left
waiting for the GIL then. (Stores, obstore's runtime and our executors are not involved:
DuckDB alone never aborted, and the aborting thread is always one of Arrow's.)
"""

from __future__ import annotations

import atexit
import ctypes
import sys
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path

EXIT_WAIT = 10.0
"""Seconds the exit hook waits for Arrow's pools at most: a task that never ends (a stream
left open) must not hold the process up."""

_CPU_POOL = "_ZN5arrow8internal16GetCpuThreadPoolEv"
_IO_POOL = "_ZN5arrow2io8internal15GetIOThreadPoolEv"
_WAIT_FOR_IDLE = "_ZN5arrow8internal10ThreadPool11WaitForIdleEv"
"""`arrow::internal::GetCpuThreadPool()`, `arrow::io::internal::GetIOThreadPool()` and
`ThreadPool::WaitForIdle()`, as libarrow exports them (Itanium C++ ABI: Linux, macOS)."""

_registering = threading.Lock()
_registered = False


def drain_native_readers_at_exit() -> None:
    """Have the interpreter wait for Arrow's pools when it exits (once per process)."""
    global _registered
    with _registering:
        if not _registered:
            atexit.register(drain_arrow_pools)
            _registered = True


def drain_arrow_pools(timeout: float = EXIT_WAIT) -> bool:
    """Wait until Arrow's CPU and I/O pools run nothing, if pyarrow is loaded; whether they
    did within `timeout` (True when there is nothing to wait for)."""
    pyarrow = sys.modules.get("pyarrow")
    if pyarrow is None or pyarrow.__file__ is None:
        return True
    wait = _arrow_wait_for_idle(Path(pyarrow.__file__).parent)
    if wait is None:
        return True
    waiter = threading.Thread(target=wait, name="bw-arrow-drain", daemon=True)
    waiter.start()
    waiter.join(timeout)
    return not waiter.is_alive()


def _arrow_wait_for_idle(directory: Path) -> Callable[[], None] | None:
    """A call that waits for both pools twice over (a task on one may end by queueing one
    on the other), or None where libarrow lacks the symbols (another ABI, another build).
    ctypes releases the GIL for the call, so tasks waiting for it can finish."""
    for path in sorted(directory.glob("libarrow.so*")) + sorted(directory.glob("libarrow.*dylib")):
        try:
            library = ctypes.CDLL(str(path))
            cpu_pool, io_pool, wait_for_idle = (
                library[_CPU_POOL],
                library[_IO_POOL],
                library[_WAIT_FOR_IDLE],
            )
        except (OSError, AttributeError):
            continue
        cpu_pool.restype = io_pool.restype = ctypes.c_void_p
        cpu_pool.argtypes = io_pool.argtypes = []
        wait_for_idle.argtypes = [ctypes.c_void_p]
        wait_for_idle.restype = None
        return partial(_wait_for_pools, wait_for_idle, (cpu_pool(), io_pool()))
    return None


def _wait_for_pools(wait_for_idle: Callable[[int], None], pools: tuple[int, ...]) -> None:
    for _ in range(2):
        for pool in pools:
            wait_for_idle(pool)
