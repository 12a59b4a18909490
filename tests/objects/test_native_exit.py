"""The exit hook that waits for Arrow's pools (`native_exit`) finds them in this pyarrow:
if its symbols moved, the hook would silently do nothing and processes that read through
pandas could abort at exit again (tests/filesystem/test_native_threads.py shows that)."""

from __future__ import annotations

import io
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from branchwater.engine.objects import native_exit


def test_arrow_pools_are_found_and_drained_after_a_threaded_read() -> None:
    assert native_exit._arrow_wait_for_idle(Path(pa.__file__).parent) is not None
    buffer = io.BytesIO()
    pq.write_table(pa.table({"x": list(range(1000))}), buffer)
    buffer.seek(0)
    assert pq.read_table(buffer, use_threads=True).num_rows == 1000
    assert native_exit.drain_arrow_pools(timeout=30)
