"""Which allocator Arrow's buffers come from in a process that opens a lake.

pyarrow's default pool on Linux is mimalloc, which hands freed pages back to the kernel
within milliseconds. A commit frees its range buffers, and the next one, a moment later,
faults the same amount in again, and the kernel zeroing those pages was a large share of a
small commit's CPU. jemalloc keeps them for seconds; the system allocator keeps them too. A
pool chosen with `ARROW_DEFAULT_MEMORY_POOL` is left alone.
"""

from __future__ import annotations

import os

import pyarrow as pa

STEADY_POOLS = ("jemalloc", "system")
"""Pools that keep freed pages for reuse, in order of preference."""


def settle_arrow_allocator() -> None:
    """Make the default pool one of `STEADY_POOLS` unless the process chose one."""
    chosen = os.environ.get("ARROW_DEFAULT_MEMORY_POOL")
    if chosen or pa.default_memory_pool().backend_name in STEADY_POOLS:
        return
    for name in STEADY_POOLS:
        if name in pa.supported_memory_backends():
            pool: pa.MemoryPool = getattr(pa, f"{name}_memory_pool")()
            pa.set_memory_pool(pool)
            return
