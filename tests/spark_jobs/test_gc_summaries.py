"""The runs' saved summaries, read without Spark: what `--sweep`, `gc explain` and an optimized
run's search for its base make of a summary that is not one."""

from __future__ import annotations

from pathlib import Path

import pytest

from branchwater.engine import CorruptedData, NotFound
from branchwater.engine.gc.runs import files, statuses
from branchwater.engine.gc.runs.storage import Namespace
from tests.helpers.gc import run_summary

OLDER, NEWER = "18f2a9c3b7d2-a1b2c3", "18f2a9c3b7d1-d4e5f6"
"""Run ids begin with an inverted time: the newer run's sorts first."""


def swept(run_id: str) -> files.RunSummary:
    return run_summary(
        run_id=run_id,
        dry_run=False,
        started_at="2026-11-24T06:00:00+00:00",
        prepare_started_at="2026-11-24T06:00:01+00:00",
        cutoff="2026-11-24T00:00:01+00:00",
        min_age_seconds=21600.0,
        default_min_age_seconds=21600.0,
        status=statuses.SWEPT,
        gate_success=True,
        considered_through="2026-11-24T00:00:01+00:00",
    )


@pytest.fixture
def ns(tmp_path: Path) -> Namespace:
    return Namespace.of(f"file://{tmp_path}/sales")


@pytest.mark.parametrize(
    "damage",
    [b"{not json", b"[1, 2]", b'{"run_id": "x", "counts": {"deleted": 5}}'],
    ids=["not JSON", "a list", "a wrong field"],
)
def test_a_damaged_summary_is_corrupted_data_naming_the_run(ns: Namespace, damage: bytes) -> None:
    ns.store.put(files.run_prefix(OLDER) + files.SUMMARY, damage)

    with pytest.raises(CorruptedData, match=f"GC run '{OLDER}' has a damaged summary.*clean run"):
        files.read_summary(ns, OLDER)
    with pytest.raises(CorruptedData, match=OLDER):
        list(files.summaries(ns))
    with pytest.raises(CorruptedData, match=OLDER):
        files.latest_base(ns, "0123456789abcdef")


def test_a_newer_run_is_the_base_and_the_damaged_summary_is_not_read(ns: Namespace) -> None:
    """What the error advises: after a clean run, optimized runs start from it."""
    ns.store.put(files.run_prefix(OLDER) + files.SUMMARY, b"{not json")
    files.write_summary(ns, swept(NEWER))

    base = files.latest_base(ns, "0123456789abcdef")

    assert base is not None and base.run_id == NEWER
    assert files.read_summary(ns, NEWER).status == statuses.SWEPT


def test_a_run_without_a_summary_is_not_found(ns: Namespace) -> None:
    with pytest.raises(NotFound, match="has no summary"):
        files.read_summary(ns, OLDER)
    assert files.latest_base(ns, "0123456789abcdef") is None
