"""The Spark job against clients that keep working: the reported shallow-copy race forced
through a real run, then clients in processes and a thread moving references while clean
and optimized runs go on (`tests/gc/test_concurrent_gc.py` does the same many times a second
on the GC rule alone).

The clients work in rounds, one run each; between two, with every client stopped, every
object a branch or commit references reads with its checksum, and the garbage left before
the round (`gc_clients.garbage`) is gone after it. `BRANCHWATER_LONG_TESTS=1` runs the long
variant.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from typing import Any

import pytest

from branchwater.engine import NotFound
from tests import gc_clients
from tests.gc_model import assert_references_intact
from tests.helpers.failpoints import paused_at
from tests.helpers.gc import GCLake
from tests.helpers.long_run import LONG_TESTS
from tests.helpers.servers import spawned_pool

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PROCESSES = 2
MIN_AGE = timedelta(seconds=0.25)
"""Longer than any client takes between writing an object and staging it."""


def test_a_copy_racing_a_delete_of_its_source_through_a_run_is_never_left_dangling(
    local_gc: GCLake,
) -> None:
    """The reported interleaving, forced: the copy has read its source, a second client
    deletes the source, the run prepares, then the copy goes on. The object is garbage the
    run collects, and no branch is left referring to it."""
    main = local_gc.repo.branch("main")
    precious = main.upload("src/0278", b"precious").address
    outcome: list[BaseException | None] = []

    with paused_at("copy.after_read") as pause, ThreadPoolExecutor(1) as client_a:
        copying = client_a.submit(main.copy, "src/0278", "dst/0278")
        pause.wait()
        main.delete("src/0278")

        def resume_copy_after_prepare(event: dict[str, Any]) -> None:
            if event.get("phase") == "prepare" and event.get("state") == "end":
                pause.release()
                outcome.append(copying.exception(gc_clients.MAX_SECONDS))

        summary = local_gc.run(events=resume_copy_after_prepare)

    assert isinstance(outcome[0], NotFound)
    assert summary.volume("deleted").objects == 1
    assert precious not in local_gc.data_objects()
    assert_references_intact(local_gc.repo)


def test_clean_and_optimized_runs_keep_every_reference_while_clients_move_them(
    local_gc: GCLake,
) -> None:
    """One run a round, with the clients working; between rounds, with them stopped, every
    reference reads and the garbage left before the round is gone."""
    repo = local_gc.repo
    gc_clients.start(repo)
    modes = ["clean", "optimized", "optimized", "clean"] * (5 if LONG_TESTS else 1)
    deleted = 0
    with spawned_pool(PROCESSES) as (manager, pool):
        for round_, mode in enumerate(modes):
            left = gc_clients.garbage(repo)
            time.sleep(MIN_AGE.total_seconds())
            with gc_clients.working(
                manager, pool, local_gc.kv_url, repo.name, round_, MIN_AGE
            ) as work:
                summary = local_gc.run(mode=mode, min_age=MIN_AGE)
            deleted += summary.volume("deleted").objects
            assert_references_intact(repo, work.slow)
            assert not left & set(local_gc.data_objects()), f"garbage outlived a {mode} run"
    assert deleted, "the runs collected nothing: the clients made no garbage"
