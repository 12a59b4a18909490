"""Clients in several processes and a thread keep copying, deleting, overwriting, linking,
committing, compacting, merging and resetting while GC runs go on, on SQLite and PostgreSQL.

The runs are prepared by the engine and swept by the GC rule (`tests.gc_model.sweep`), many
a second; the Spark job's own runs face the same clients in `tests/spark_jobs/
test_gc_reference_races.py`. The clients work in rounds; between two, with every client
stopped, every object a branch or commit references reads with its checksum, and the
garbage left before the round (`gc_clients.garbage`) is gone after it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from branchwater.engine import Lake
from branchwater.engine.api import Repository
from tests import gc_clients
from tests.gc_model import assert_references_intact, sweep
from tests.helpers.gc import data_objects
from tests.helpers.servers import forked_pool, unique_name

pytestmark = pytest.mark.slow

PROCESSES = 2
ROUNDS = 5
SECONDS = 1.5
"""How long the runs go on in each round."""
MIN_AGE = timedelta(seconds=0.25)
"""Longer than any client takes between writing an object and staging it."""


@pytest.fixture
def repo(race_kv: str, tmp_path: Path) -> Iterator[Repository]:
    with Lake.connect(race_kv) as lake:
        name = unique_name("concurrent-")
        repo = lake.create_repository(name, storage_namespace=f"file://{tmp_path}/{name}")
        gc_clients.start(repo)
        yield repo


def test_gc_runs_keep_every_reference_while_clients_move_them(
    repo: Repository, race_kv: str
) -> None:
    swept: set[str] = set()
    races = 0
    with forked_pool(PROCESSES) as (manager, pool):
        for round_ in range(ROUNDS):
            left = gc_clients.garbage(repo)
            time.sleep(MIN_AGE.total_seconds())
            with gc_clients.working(manager, pool, race_kv, repo.name, round_, MIN_AGE) as work:
                deadline = time.monotonic() + SECONDS
                while time.monotonic() < deadline:
                    swept |= sweep(repo, repo.prepare_uncommitted_for_gc(), MIN_AGE)
            races += sum(c.get("copy_racing_delete", 0) for c in work.counts)
            assert_references_intact(repo, work.slow)
            assert not left & set(data_objects(repo.lake, repo)), "garbage outlived a run"
    assert swept, "the runs collected nothing: the clients made no garbage"
    assert races, "no copy ever raced a delete of its source"
