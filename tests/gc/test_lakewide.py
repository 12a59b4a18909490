"""The GC limits a lake's clients were promised, recorded lake-wide: a run's minimum age and
duration limit follow the longest token expiry and the shortest copy lifetime any process
used, not the settings of the process that runs GC."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from branchwater.engine import Lake, NotFound, RunExpired
from branchwater.engine.gc.addresses import newest_first_id
from branchwater.engine.gc.prepare import read_manifest
from branchwater.engine.gc.settings import GCSettings
from branchwater.engine.graveler.fence import OPERATION_MARGIN
from tests.helpers.gc import FakeClock, use_clock

DAY = timedelta(days=1)


def minimum_age(lake: Lake) -> timedelta:
    repo = lake.repository("sales")
    run = repo.prepare_uncommitted_for_gc()
    manifest = read_manifest(lake.graveler.objects(repo.storage_namespace), run.run_id)
    assert (
        manifest["token_expiry_seconds"] + OPERATION_MARGIN.total_seconds()
        == (manifest["min_age_seconds"])
    )
    return timedelta(seconds=manifest["min_age_seconds"])


def test_a_run_keeps_objects_as_long_as_the_longest_token_any_client_was_given(
    tmp_path: Path,
) -> None:
    """A client with 24-hour tokens writes under one for hours: the GC process, on the
    default 6 hours, must not collect the object at 6 hours 5 minutes."""
    url = f"sqlite:///{tmp_path}/lake.db"
    with Lake.connect(url) as gc_side:
        gc_side.create_repository("sales", storage_namespace=f"file://{tmp_path}/sales")
        assert minimum_age(gc_side) == timedelta(hours=6) + OPERATION_MARGIN
        with Lake.connect(url, gc=GCSettings(token_expiry=2 * DAY)):
            pass  # connected only: promised nothing
        assert minimum_age(gc_side) == timedelta(hours=6) + OPERATION_MARGIN
        with Lake.connect(url, gc=GCSettings(token_expiry=DAY)) as client:
            client.repository("sales").branch("main").get_physical_address()
        assert minimum_age(gc_side) == DAY + OPERATION_MARGIN
        with Lake.connect(url, gc=GCSettings(token_expiry=timedelta(hours=1))) as short:
            short.repository("sales").branch("main").get_physical_address()
        assert minimum_age(gc_side) == DAY + OPERATION_MARGIN, "a shorter client narrows nothing"


def test_a_run_longer_than_the_shortest_copy_lifetime_any_client_used_is_refused(
    tmp_path: Path,
) -> None:
    """A client recording copies for one hour: a prepare run that started two hours ago
    reads its records after they may be gone."""
    url = f"sqlite:///{tmp_path}/lake.db"
    with Lake.connect(url) as gc_side:
        repo = gc_side.create_repository("sales", storage_namespace=f"file://{tmp_path}/sales")
        clock = FakeClock()
        use_clock(gc_side, clock)
        two_hours_ago = newest_first_id(clock.now - timedelta(hours=2))
        with pytest.raises(NotFound, match="saved no progress"):
            repo.prepare_uncommitted_for_gc(two_hours_ago)  # within its own two days
        with Lake.connect(url, gc=GCSettings(copy_record_ttl=timedelta(hours=1))) as client:
            main = client.repository("sales").branch("main")
            main.upload("a", b"a")
            main.copy("a", "b")
        with pytest.raises(RunExpired, match="shortest copy-record lifetime \\(1:00:00\\)"):
            repo.prepare_uncommitted_for_gc(two_hours_ago)
