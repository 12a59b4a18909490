"""The GC run's HTML report (`engine/gc/runs/report.py`): its title says what the run did,
read from the parts its summary records, so a committed-only run does not read as an
uncommitted one."""

from __future__ import annotations

from typing import Any

import pytest

from branchwater.engine.gc.runs import report
from tests.helpers.gc import run_summary

RULES = {"default_retention_days": 30, "branches": []}


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
    page = report.render(run_summary(retention=retention), None)
    assert f"<h1>{title} of <code>sales</code>, run <code>18f2a9c3b7d1-a1b2c3</code></h1>" in page
    assert f"<tr><th>parts</th><td>{parts}</td></tr>" in page
    assert ("Uncommitted" in page.split("</h1>")[0]) == ("uncommitted" in parts)
