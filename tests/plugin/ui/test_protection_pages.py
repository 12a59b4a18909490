"""The view shows a repository's protection rules and each commit's checks (issue 39, item
7), through FastAPI's test client on a real lake; markup in a check's details is text."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from branchwater.engine import failpoints
from branchwater.engine.failpoints import FailpointHit
from tests.plugin.ui.conftest import ViewLake, get


def test_a_repository_lists_its_protection_rules(view_lake: ViewLake, client: TestClient) -> None:
    repo = view_lake.repo
    assert "No branch is protected." in get(client, f"/repositories/{repo.name}").text
    repo.protect("main", no_direct_writes=True, required_checks=["quality", "schema"])
    repo.protect("release/*", no_delete=True, no_reset=True)

    rules = get(client, f"/repositories/{repo.name}").tables["protections"]

    assert "main refused : merges only quality, schema allowed allowed" in rules
    assert "release/* allowed none refused refused" in rules


def test_a_rule_whose_fence_is_pending_says_so(view_lake: ViewLake, client: TestClient) -> None:
    """A protect killed before its fence: branches that existed may not enforce it yet."""
    repo = view_lake.repo

    def killed() -> None:
        raise FailpointHit("killed")

    with failpoints.armed("protect.before_fence", killed), pytest.raises(FailpointHit):
        repo.protect("main", no_delete=True)
    rules = get(client, f"/repositories/{repo.name}").tables["protections"]
    assert "main pending : not yet enforced on every branch (run protect again)" in rules

    repo.protect("main", no_delete=True)
    assert "pending" not in get(client, f"/repositories/{repo.name}").tables["protections"]


def test_a_commit_shows_its_checks(view_lake: ViewLake, client: TestClient) -> None:
    repo = view_lake.repo
    page = f"/repositories/{repo.name}/commits/{view_lake.second.id}"
    assert "No checks recorded on this commit." in get(client, page).text
    repo.record_check(view_lake.second.id, "quality", True, {"rows": 2}, by="gx")
    repo.record_check(view_lake.second.id, "schema", False, {"why": "<b>a</b>"}, by="ci")

    response = client.get(page)

    checks = get(client, page).tables["checks"]
    assert "quality passed" in checks and "gx rows : 2" in checks
    assert "schema failed" in checks and "ci why : <b>a</b>" in checks
    assert "&lt;b&gt;a&lt;/b&gt;" in response.text
    other = get(client, f"/repositories/{repo.name}/commits/{view_lake.first.id}")
    assert "No checks recorded on this commit." in other.text
