"""DuckDB and pyarrow (under pandas) call the filesystem from their own native threads, each
call in a thread state made and torn down around it. Nothing the engine keeps per thread may
be released in that teardown (Python 3.11 crashes there): a child process reads a dataset
through both, many times over, and must exit cleanly. Arrow also releases our file objects
on its threads after a read returns; a process that exits then must not abort
(`branchwater.engine.objects.native_exit`)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.filesystem.conftest import FsLake

ROUNDS = 40

CHILD = textwrap.dedent(
    """
    import json, sys
    import duckdb, fsspec, pandas as pd
    from branchwater.engine import BranchwaterFileSystem

    if "branchwater" not in fsspec.available_protocols():
        fsspec.register_implementation("branchwater", BranchwaterFileSystem)
    options = json.loads(sys.argv[1])
    rounds, expected = int(sys.argv[2]), int(sys.argv[3])
    fs = fsspec.filesystem("branchwater", **options)
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")  # a slow query draws one on stdout
    con.register_filesystem(fs)
    query = (
        "SELECT count(*) FROM read_parquet("
        "'branchwater://sales/main/data/*/*.parquet', hive_partitioning=true)"
    )
    for _ in range(rounds):
        assert con.sql(query).fetchall() == [(expected,)]
        frame = pd.read_parquet("branchwater://sales/main/data/", storage_options=options)
        assert len(frame) == expected
    print("ok")
    """
)


@pytest.mark.slow
def test_native_reader_threads_read_many_times_and_the_process_exits_cleanly(
    fs_lake: FsLake, tmp_path: Path
) -> None:
    import io
    import json

    import pyarrow as pa
    import pyarrow.parquet as pq

    main = fs_lake.repo.branch("main")
    for part in range(4):
        for n in range(3):
            buffer = io.BytesIO()
            pq.write_table(pa.table({"x": list(range(10))}), buffer)
            main.upload(f"data/p={part}/f{n}.parquet", buffer.getvalue())
    main.commit("data")
    child = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(fs_lake.options), str(ROUNDS), "120"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert child.stdout.strip() == "ok", child.stderr[-3000:]
    assert child.returncode == 0, child.stderr[-3000:]


def test_one_filesystem_serves_many_python_threads_at_once(fs_lake: FsLake) -> None:
    """Threads share the filesystem and its lake's pooled connections: every write lands,
    every read sees its own thread's writes, and the pool holds at most one connection per
    thread that was ever running a statement at once."""
    from concurrent.futures import ThreadPoolExecutor

    fs, threads, files = fs_lake.fs, 8, 10

    def work(n: int) -> list[bytes]:
        for i in range(files):
            fs.pipe(f"sales/main/t{n}/{i}.bin", f"{n}-{i}".encode())
        return [fs.cat(f"sales/main/t{n}/{i}.bin") for i in range(files)]

    with ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(work, range(threads)))
    assert results == [[f"{n}-{i}".encode() for i in range(files)] for n in range(threads)]
    assert len(fs.find("sales/main")) == threads * files
    kv = fs.lake.graveler.kv
    if hasattr(kv, "_idle"):
        assert 1 <= len(kv._connections) <= threads + 2
