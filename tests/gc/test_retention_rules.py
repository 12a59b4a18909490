"""Retention rules: lakeFS's JSON shape, glob patterns, validation that stores nothing."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from branchwater.engine import InvalidGCRules, Lake
from branchwater.engine.api import Repository
from branchwater.engine.gc.retention.rules import RULES_KEY, BranchRule, GCRules
from tests.gc_model import retention_run

LAKEFS_RULES = {
    "default_retention_days": 30,
    "branches": [{"branch_id": "main", "retention_days": 90}],
}


def test_a_repository_has_no_rules_until_set(repo: Repository) -> None:
    assert repo.gc_rules() is None


def test_rules_round_trip_in_lakefs_shape(repo: Repository) -> None:
    stored = repo.set_gc_rules(LAKEFS_RULES)
    assert stored == GCRules(30, (BranchRule("main", 90),))
    assert repo.gc_rules() == stored
    assert stored.to_json() == LAKEFS_RULES


def test_rules_survive_a_new_connection(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path}/lake.db"
    with Lake.connect(url) as lake:
        lake.create_repository("sales", f"file://{tmp_path}/ns").set_gc_rules(
            {**LAKEFS_RULES, "keep_tags": "release-*"}
        )
    with Lake.connect(url) as lake:
        rules = lake.repository("sales").gc_rules()
    assert rules is not None and rules.keep_tags == "release-*"


def test_rules_replace_and_delete(repo: Repository) -> None:
    repo.set_gc_rules(LAKEFS_RULES)
    repo.set_gc_rules('{"default_retention_days": 7}')
    assert repo.gc_rules() == GCRules(7)
    repo.delete_gc_rules()
    assert repo.gc_rules() is None


def test_the_longest_matching_retention_wins() -> None:
    rules = GCRules.from_json(
        {
            "default_retention_days": 30,
            "branches": [
                {"branch_id": "*", "retention_days": 7},
                {"branch_id": "main", "retention_days": 90},
                {"branch_id": "tmp-?", "retention_days": 1},
                {"branch_id": "etl/[ab]*", "retention_days": 45},
            ],
        }
    )
    assert rules.retention_days("main") == 90
    assert rules.retention_days("tmp-1") == 7
    assert rules.retention_days("etl/a1") == 45
    assert rules.retention_days("etl/c1") == 7


def test_a_branch_no_pattern_matches_gets_the_default() -> None:
    rules = GCRules.from_json(
        {"default_retention_days": 30, "branches": [{"branch_id": "tmp-*", "retention_days": 1}]}
    )
    assert rules.retention_days("main") == 30
    assert rules.retention_days("tmp-x") == 1


@pytest.mark.parametrize("pattern", ["[-_]tmp", "tmp[+]x", "[é]t*", "[!a]x", "v[0-9]*"])
def test_a_pattern_is_accepted_when_any_name_it_matches_is_valid(pattern: str) -> None:
    """`-tmp` is no branch name but `_tmp` is: each class is tried with what it admits."""
    rules = GCRules.from_json(
        {"default_retention_days": 1, "branches": [{"branch_id": pattern, "retention_days": 2}]}
    )
    assert rules.branches[0].branch_id == pattern


def test_rules_stored_under_a_laxer_check_still_load(repo: Repository) -> None:
    """A stored pattern that matches no name protects nothing, but GC keeps working."""
    stored = {"default_retention_days": 3, "keep_tags": "release-[!]", "branches": []}
    repo.lake.graveler.kv.set(repo.record.partition, RULES_KEY, json.dumps(stored).encode())
    rules = repo.gc_rules()
    assert rules is not None and rules.keep_tags == "release-[!]"
    assert not rules.keeps_history("release-1")


def test_keep_tags_matches_tag_names() -> None:
    rules = GCRules.from_json({"default_retention_days": 1, "keep_tags": "v[0-9]*"})
    assert rules.keeps_history("v1.2")
    assert not rules.keeps_history("nightly")
    assert not GCRules(1).keeps_history("v1")


BAD_RULES: list[tuple[object, str]] = [
    ({"default_retention_days": -1}, "between 0 and"),
    ({"default_retention_days": 1.5}, "whole number"),
    ({"default_retention_days": True}, "whole number"),
    ({"default_retention_days": "30"}, "whole number"),
    ({}, "need default_retention_days"),
    ({"default_retention_days": 1, "retention": 3}, "unknown key(s) retention"),
    ({"default_retention_days": 1, "branches": {"main": 3}}, "must be a list"),
    ({"default_retention_days": 1, "branches": ["main"]}, "branches[0] must be an object"),
    (
        {"default_retention_days": 1, "branches": [{"branch_id": "main"}]},
        "lacks retention_days",
    ),
    (
        {"default_retention_days": 1, "branches": [{"branch_id": "a", "retention_days": -2}]},
        "branches[0].retention_days",
    ),
    (
        {
            "default_retention_days": 1,
            "branches": [{"branch_id": "a", "retention_days": 2, "days": 2}],
        },
        "unknown key(s) days",
    ),
    (
        {"default_retention_days": 1, "branches": [{"branch_id": "feat[", "retention_days": 2}]},
        "matches no valid branch name",
    ),
    (
        {"default_retention_days": 1, "branches": [{"branch_id": "a..b", "retention_days": 2}]},
        "matches no valid branch name",
    ),
    (
        {"default_retention_days": 1, "branches": [{"branch_id": "", "retention_days": 2}]},
        "non-empty",
    ),
    ({"default_retention_days": 1, "keep_tags": "v~*"}, "matches no valid tag name"),
    ({"default_retention_days": 1, "keep_tags": "release-[!]"}, "matches no valid tag name"),
    (
        {"default_retention_days": 1, "branches": [{"branch_id": "tmp-[~^]", "retention_days": 2}]},
        "matches no valid branch name",
    ),
    ({"default_retention_days": 1, "keep_tags": 3}, "non-empty tag"),
    ("{not json", "not valid JSON"),
    ([1, 2], "must be a JSON object"),
]


@pytest.mark.parametrize(("rules", "fragment"), BAD_RULES)
def test_bad_rules_are_a_typed_error_and_store_nothing(
    repo: Repository, rules: object, fragment: str
) -> None:
    repo.set_gc_rules(LAKEFS_RULES)
    with pytest.raises(InvalidGCRules) as raised:
        repo.set_gc_rules(rules)  # type: ignore[arg-type]
    assert fragment in str(raised.value)
    assert repo.gc_rules() == GCRules.from_json(LAKEFS_RULES)


def test_rules_go_with_their_repository(lake: Lake, tmp_path: Any) -> None:
    repo = lake.create_repository("sales", f"file://{tmp_path}/a")
    repo.set_gc_rules(LAKEFS_RULES)
    lake.delete_repository("sales")
    again = lake.create_repository("sales", f"file://{tmp_path}/b")
    assert again.gc_rules() is None


BAD_RULE_OBJECTS: list[tuple[GCRules, str]] = [
    (GCRules(-5), "default_retention_days must be between 0 and"),
    (GCRules(10**9), "default_retention_days must be between 0 and"),
    (GCRules(True), "whole number"),  # type: ignore[arg-type]
    (GCRules(1, (BranchRule("main", 10**9),)), "branches[0].retention_days"),
    (GCRules(1, (BranchRule("main", "30"),)), "whole number"),  # type: ignore[arg-type]
    (GCRules(1, (BranchRule("a..b", 2),)), "matches no valid branch name"),
    (GCRules(1, (BranchRule(7, 2),)), "non-empty branch"),  # type: ignore[arg-type]
    (GCRules(1, ("main",)), "branches[0] must be an object"),  # type: ignore[arg-type]
    (GCRules(1, None), "must be a list"),  # type: ignore[arg-type]
    (GCRules(1, "main"), "must be a list"),  # type: ignore[arg-type]
    (GCRules(1, keep_tags=""), "non-empty tag"),
    (GCRules(1, keep_tags="v~*"), "matches no valid tag name"),
]
"""Rules made in Python rather than read from a document: a dataclass checks no field."""


@pytest.mark.parametrize(("rules", "fragment"), BAD_RULE_OBJECTS, ids=repr)
def test_bad_rules_made_in_python_are_refused_as_their_document_is(
    repo: Repository, rules: GCRules, fragment: str
) -> None:
    """They were stored as given, and then every read of them, GC runs' included, failed."""
    repo.set_gc_rules(LAKEFS_RULES)
    kv, partition = repo.lake.graveler.kv, repo.record.partition
    before = kv.get(partition, RULES_KEY)
    with pytest.raises(InvalidGCRules) as raised:
        repo.set_gc_rules(rules)
    assert fragment in str(raised.value)
    assert kv.get(partition, RULES_KEY) == before
    assert repo.gc_rules() == GCRules.from_json(LAKEFS_RULES)


def test_gc_runs_on_the_rules_a_refused_set_left(repo: Repository) -> None:
    """A day's retention, set before the refusal, still expires the replaced commit."""
    rules = GCRules(1, (BranchRule("etl/*", 9),), keep_tags="v*")
    main = repo.branch("main")
    main.upload("a", b"old")
    old = main.commit("old").id
    main.upload("a", b"new")
    main.commit("new")
    assert repo.set_gc_rules(rules) == rules
    with pytest.raises(InvalidGCRules):
        repo.set_gc_rules(GCRules(-5, (BranchRule("main", 10**9),), keep_tags=""))
    assert repo.gc_rules() == rules
    old_address = repo.ref(old).stat("a").address
    run = retention_run(repo, datetime.now(UTC) + timedelta(days=2))
    assert run.expiring == [old]
    assert old_address in run.deleted
    assert repo.branch("main").read("a") == b"new"
