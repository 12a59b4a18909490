"""A sweep discards the writes killed half-way under the namespace's `data/` and
`_branchwater/` once older than a day (or the run's minimum age, if longer), and records
them in the run's summary; a mark that cannot be swept discards nothing. On a namespace on
local disk, without Spark: the Spark job's sweep is the same `sweep_mark`."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from branchwater.engine import GateFailed
from branchwater.engine.api import Repository
from branchwater.engine.gc.runs import files, statuses
from branchwater.engine.gc.runs.config import JobConfig
from branchwater.engine.gc.runs.sweeps import ABANDONED_WRITES, sweep_without_spark
from tests.helpers.gc import RUN_ID, saved_mark


def left_write(repo: Repository, folder: str, age: timedelta, size: int = 100) -> Path:
    """A write-in-progress file, as a writer killed `age` ago left it."""
    root = Path(repo.storage_namespace.removeprefix("file://"))
    path = root / folder / f".tmp-{os.urandom(16).hex()}"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(bytes(size))
    then = (datetime.now(UTC) - age).timestamp()
    os.utime(path, (then, then))
    return path


def sweep(repo: Repository) -> tuple[files.RunSummary, list[dict[str, Any]]]:
    events: list[dict[str, Any]] = []
    config = JobConfig("memory://", repo.name, sweep=RUN_ID)
    return sweep_without_spark(repo, config, events.append), events


def test_a_sweep_discards_abandoned_writes_older_than_a_day(repo: Repository) -> None:
    """A zero minimum age still leaves a day to a write. The engine's own writes (ranges,
    metaranges, run files) are discarded as data's are; a folder of the namespace that is
    not Branchwater's is never touched."""
    slice_ = "data/0fd4a8c2b9e1-c3d2e1"
    ns = saved_mark(repo, timedelta(0))
    old = left_write(repo, slice_, timedelta(hours=25), size=1234)
    young = left_write(repo, slice_, timedelta(hours=23))
    old_range = left_write(repo, "_branchwater/ranges", timedelta(days=3), size=1000)
    young_range = left_write(repo, "_branchwater/ranges", timedelta(hours=1))
    elsewhere = left_write(repo, "exports", timedelta(days=3))

    swept, events = sweep(repo)

    assert swept.status == statuses.SWEPT
    assert not old.exists() and young.exists() and elsewhere.exists()
    assert not old_range.exists() and young_range.exists()
    assert swept.volume(ABANDONED_WRITES) == files.Volume(2, 2234)
    assert files.read_summary(ns, RUN_ID).volume(ABANDONED_WRITES) == files.Volume(2, 2234)
    notices = [e["message"] for e in events if e["event"] == "notice"]
    assert "2 abandoned writes discarded (2.2 KiB)" in notices
    report = ns.store.get(files.run_prefix(RUN_ID) + files.REPORT).decode()
    assert "abandoned writes discarded" in report


def test_a_minimum_age_longer_than_a_day_protects_writes_that_long(repo: Repository) -> None:
    saved_mark(repo, timedelta(hours=48))
    kept = left_write(repo, "data/0fd4a8c2b9e1-c3d2e1", timedelta(hours=47))
    gone = left_write(repo, "data/0fd4a8c2b9e1-c3d2e1", timedelta(hours=49))

    swept, _ = sweep(repo)

    assert kept.exists() and not gone.exists()
    assert swept.volume(ABANDONED_WRITES).objects == 1


def test_a_mark_whose_gate_failed_discards_nothing(repo: Repository) -> None:
    saved_mark(repo, timedelta(0), status=statuses.GATE_FAILED, gate_success=False)
    old = left_write(repo, "data/0fd4a8c2b9e1-c3d2e1", timedelta(days=3))

    with pytest.raises(GateFailed):
        sweep(repo)

    assert old.exists()
