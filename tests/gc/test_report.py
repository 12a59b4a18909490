"""The GC run's HTML report (`engine/gc/runs/report.py`): its title says what the run did,
read from the parts its summary records, so a committed-only run does not read as an
uncommitted one."""

from __future__ import annotations

from typing import Any

import pytest

from branchwater.engine.gc.runs import report
from branchwater.engine.gc.runs.files import RunSummary

RULES = {"default_retention_days": 30, "branches": []}


def summary(retention: dict[str, Any]) -> RunSummary:
    now = "2026-03-01T12:00:00+00:00"
    return RunSummary(
        run_id="18f2a9c3b7d1-a1b2c3",
        repository="sales",
        repository_id="u",
        storage_namespace="file:///ns",
        mode="clean",
        requested_mode="clean",
        dry_run=True,
        started_at=now,
        prepare_started_at=now,
        cutoff=now,
        min_age_seconds=0.0,
        default_min_age_seconds=0.0,
        retention=retention,
    )


@pytest.mark.parametrize(
    ("retention", "title", "parts"),
    [
        ({}, "Uncommitted GC", "uncommitted"),
        ({"parts": ["uncommitted"], "rules": None}, "Uncommitted GC", "uncommitted"),
        ({"parts": ["committed"], "rules": RULES}, "Committed GC (retention)", "committed"),
        (
            {"parts": ["uncommitted", "committed"], "rules": RULES},
            "Uncommitted and committed GC (retention)",
            "uncommitted, committed",
        ),
        ({"parts": [], "rules": None}, "GC (no part ran)", "none"),
    ],
)
def test_the_title_names_the_parts_the_run_did(
    retention: dict[str, Any], title: str, parts: str
) -> None:
    page = report.render(summary(retention), None)
    assert f"<h1>{title} of <code>sales</code>, run <code>18f2a9c3b7d1-a1b2c3</code></h1>" in page
    assert f"<tr><th>parts</th><td>{parts}</td></tr>" in page
    assert ("Uncommitted" in page.split("</h1>")[0]) == ("uncommitted" in parts)
