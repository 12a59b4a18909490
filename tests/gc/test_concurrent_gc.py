"""Clients in several processes and a thread keep copying, deleting, overwriting, linking,
committing, compacting, merging and resetting while GC runs go on, on SQLite and PostgreSQL.

The runs are prepared by the engine and swept by the GC rule (`tests.gc_model.sweep`), many
a second; the Spark job's own runs face the same clients in `tests/spark_jobs/
test_gc_concurrent_model.py`. After the clients stop, every object a branch or commit
references reads with its checksum, and one more run leaves nothing else but what it holds
uncommitted (hidden layers included) and what copy records still hold.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path

import pytest

from branchwater.engine import Lake
from branchwater.engine.api import Repository
from tests import gc_clients
from tests.gc_model import assert_references_intact, referenced_entries, sweep
from tests.helpers import data_objects, run_addresses, spawned_pool, unique_name

pytestmark = pytest.mark.slow

PROCESSES = 2
SECONDS = 8.0
"""How long the runs go on once every client works."""
MIN_AGE = timedelta(seconds=0.25)
"""Longer than any client takes between writing an object and staging it."""


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def kv_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgres":
        return request.getfixturevalue("postgres_url")
    return f"sqlite:///{tmp_path}/lake.db"


@pytest.fixture
def repo(kv_url: str, tmp_path: Path) -> Iterator[Repository]:
    with Lake.connect(kv_url) as lake:
        name = unique_name("concurrent-")
        repo = lake.create_repository(name, storage_namespace=f"file://{tmp_path}/{name}")
        gc_clients.start(repo)
        yield repo


def test_gc_runs_keep_every_reference_while_clients_move_them(
    repo: Repository, kv_url: str
) -> None:
    swept: set[str] = set()
    with spawned_pool(PROCESSES) as (manager, pool), ThreadPoolExecutor(1) as thread:
        stop, thread_stop = manager.Event(), threading.Event()
        started = [manager.Event() for _ in range(PROCESSES + 1)]
        args = [(kv_url, repo.name, f"p{i}", i, started[i], stop) for i in range(PROCESSES)]
        processes = [pool.apply_async(gc_clients.move_references, a) for a in args]
        in_thread = thread.submit(
            gc_clients.move_references, kv_url, repo.name, "t", 99, started[-1], thread_stop, ""
        )
        try:
            assert all(event.wait(gc_clients.MAX_SECONDS) for event in started)
            deadline = time.monotonic() + SECONDS
            while time.monotonic() < deadline:
                swept |= sweep(repo, repo.prepare_uncommitted_for_gc(), MIN_AGE)
        finally:
            stop.set()
            thread_stop.set()
        counts = [p.get(gc_clients.MAX_SECONDS) for p in processes]
        counts.append(in_thread.result(gc_clients.MAX_SECONDS))
    assert all(c.get("copy_then_delete", 0) > 0 for c in counts)
    assert swept, "the runs collected nothing: the clients made no garbage"
    assert_references_intact(repo)
    time.sleep(MIN_AGE.total_seconds())
    last = repo.prepare_uncommitted_for_gc()
    sweep(repo, last, MIN_AGE)
    held = {entry.address for _, entry in referenced_entries(repo)}
    held |= {record.address for record in repo.lake.gc.copies.records(repo.record)}
    assert set(data_objects(repo.lake, repo)) <= held | run_addresses(repo, last)
