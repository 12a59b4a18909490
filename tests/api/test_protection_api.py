"""The protection and checks API (issue 39, items 3 and 4): rules set, listed, replaced,
removed and logged; checks recorded once, read back, validated."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from branchwater.engine import AlreadyExists, InvalidArgument, InvalidName, NotFound
from branchwater.engine.api import Repository
from branchwater.engine.graveler.checks import MAX_DETAILS_BYTES
from branchwater.engine.graveler.protection import ProtectionRule, pattern_matches


def test_protect_lists_replaces_and_removes_rules_by_pattern(repo: Repository) -> None:
    rule = repo.protect("main", no_direct_writes=True, required_checks=["quality"], by="ana")
    assert rule == ProtectionRule("main", True, ("quality",))
    repo.protect("release/*", no_delete=True, no_reset=True, by="bo")
    assert [r.pattern for r in repo.protections()] == ["main", "release/*"]
    repo.protect("main", no_delete=True, by="ana")
    assert repo.protections()[0] == ProtectionRule("main", no_delete=True)
    repo.unprotect("main", by="cy")
    assert [r.pattern for r in repo.protections()] == ["release/*"]
    with pytest.raises(NotFound, match="release/\\*"):
        repo.unprotect("main")


def test_every_rule_change_is_logged_with_who_and_when(repo: Repository) -> None:
    repo.protect("main", no_direct_writes=True, by="ana")
    repo.protect("main", no_direct_writes=True, by="ana")
    repo.unprotect("main", by="bo")
    log = repo.protection_log()
    assert [(c.version, c.action, c.pattern, c.by) for c in log] == [
        (1, "protect", "main", "ana"),
        (2, "unprotect", "main", "bo"),
    ]
    assert log[0].rule == ProtectionRule("main", no_direct_writes=True)
    assert log[1].rule is None and log[0].at <= log[1].at


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        ({"pattern": "main"}, InvalidArgument),
        ({"pattern": "", "no_delete": True}, InvalidName),
        ({"pattern": "a b", "no_delete": True}, InvalidName),
        ({"pattern": "main", "no_delete": "yes"}, InvalidArgument),
        ({"pattern": "main", "required_checks": "quality"}, InvalidArgument),
        ({"pattern": "main", "required_checks": ["no spaces"]}, InvalidName),
        ({"pattern": "main", "required_checks": [f"c{i}" for i in range(65)]}, InvalidArgument),
    ],
)
def test_bad_rules_are_refused_and_store_nothing(
    repo: Repository, arguments: dict[str, object], error: type[Exception]
) -> None:
    pattern = arguments.pop("pattern")
    with pytest.raises(error):
        repo.protect(pattern, **arguments)  # type: ignore[arg-type]
    assert repo.protections() == [] and repo.protection_log() == []


def test_patterns_match_like_github_branch_protection() -> None:
    assert pattern_matches("release/*", "release/1.0")
    assert not pattern_matches("release/*", "release/1.0/hotfix")
    assert pattern_matches("release/**", "release/1.0/hotfix")
    assert pattern_matches("v?", "v1") and not pattern_matches("v?", "v10")
    assert not pattern_matches("main", "main2")


GLOB_TEXT = st.text(st.sampled_from("ab/*?"), max_size=8)


@settings(max_examples=500, deadline=None)
@given(pattern=GLOB_TEXT.filter(bool), branch=st.text(st.sampled_from("ab/"), max_size=10))
def test_patterns_match_as_their_regular_expression_would(pattern: str, branch: str) -> None:
    """The matcher against the pattern's translation to a regular expression, the plain
    statement of its rules, on names short enough for the expression's backtracking."""
    wild = {"**": ".*", "*": "[^/]*", "?": "[^/]"}
    parts = re.split(r"(\*\*|\*|\?)", pattern)
    expression = "".join(wild.get(part, re.escape(part)) for part in parts)
    assert pattern_matches(pattern, branch) == (re.fullmatch(expression, branch) is not None)


def test_a_pattern_that_backtracks_a_regular_expression_protects_in_linear_time(
    repo: Repository,
) -> None:
    """`*a*a…*b` against a long run of `a`: a regular expression would take exponential
    time (this test would hang), as would every branch created while the rule stands."""
    hostile = "*a" * 60 + "*b"
    repo.protect(hostile, no_delete=True)
    name = "a" * 255
    repo.create_branch(name)
    repo.delete_branch(name)
    assert not pattern_matches(hostile, name) and pattern_matches(hostile, name[:-1] + "b")


def test_a_check_is_recorded_once_and_read_back(repo: Repository) -> None:
    head = repo.branch("main").head().id
    result = repo.record_check(head, "quality", True, {"rows": 10, "url": "s3://r"}, by="gx")
    assert (result.commit_id, result.name, result.passed) == (head, "quality", True)
    assert repo.record_check(head, "quality", True, {"url": "s3://r", "rows": 10}) == result
    with pytest.raises(AlreadyExists, match="cannot be rewritten"):
        repo.record_check(head, "quality", False, {"rows": 10, "url": "s3://r"})
    repo.record_check("main", "review", False)
    assert [(c.name, c.passed) for c in repo.checks(head)] == [("quality", True), ("review", False)]
    assert repo.checks(head)[0].recorded_by == "gx"
    assert repo.checks(head)[0].details == {"rows": 10, "url": "s3://r"}


@pytest.mark.parametrize(
    "details",
    [
        [1, 2],
        {"x": float("nan")},
        {"x": object()},
        {"x": {1, 2}},
        {"x": "y" * MAX_DETAILS_BYTES},
    ],
)
def test_bad_details_are_refused_and_record_nothing(repo: Repository, details: object) -> None:
    head = repo.branch("main").head().id
    with pytest.raises(InvalidArgument):
        repo.record_check(head, "quality", True, details)  # type: ignore[arg-type]
    assert repo.checks(head) == []


def test_checks_name_an_existing_commit(repo: Repository) -> None:
    with pytest.raises(NotFound):
        repo.record_check("f" * 64, "quality", True)
    with pytest.raises(InvalidArgument):
        repo.record_check("main", "quality", "yes")  # type: ignore[arg-type]
