"""Which commits retention expires: the rule on hand-made histories, then the engine's walk
against the model's fixpoint (tests/gc_model.py) over random histories spread over months,
swept by the address rule and checked for what must stay and what must go."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import pytest

from branchwater.engine.api import Repository
from branchwater.engine.gc.addresses import newest_first_time
from branchwater.engine.gc.retention.expiry import (
    DANGLING,
    CommitNode,
    RefHeads,
    classify,
    deletable,
    newly_active,
    repository_retention,
)
from branchwater.engine.gc.retention.rules import BranchRule, GCRules
from tests.gc_model import (
    RetentionHistory,
    active_commits,
    assert_retention_holds,
    commit_addresses,
    retention_candidates,
)
from tests.helpers.gc import FakeClock, data_objects, run_addresses

NOW = datetime(2026, 6, 1, tzinfo=UTC)


def days_ago(days: float) -> datetime:
    return NOW - timedelta(days=days)


def history(*nodes: tuple[str, tuple[str, ...], float]) -> dict[str, CommitNode]:
    return {c: CommitNode(c, parents, days_ago(age)) for c, parents, age in nodes}


# a <- b <- c <- d (main), 100, 60, 20, 5 days old; e <- f on a deleted branch off b
LINEAR = history(
    ("a", (), 100),
    ("b", ("a",), 60),
    ("c", ("b",), 20),
    ("d", ("c",), 5),
    ("e", ("b",), 50),
    ("f", ("e",), 10),
)


def test_a_branch_keeps_what_is_newer_than_its_retention_and_its_head_back_then() -> None:
    """b, 60 days old, was main's HEAD 30 days ago: what it holds was on main until c."""
    got = classify(LINEAR, RefHeads({"main": "d"}, {}), GCRules(30), NOW)
    assert got.active == {"d", "c", "b", "f"}
    assert got.expired == {"a", "e"}
    assert got.branch_of == {"a": "main", "e": DANGLING}


def test_an_object_deleted_within_the_retention_is_kept_however_old_its_commit() -> None:
    """lakeFS's promise: deleted a day ago, kept for the branch's 7 days, though the only
    commit that holds it is 40 days old; the commit before it is the one that goes."""
    made = history(("old", (), 90), ("added", ("old",), 40), ("deleted", ("added",), 1))
    got = classify(made, RefHeads({"main": "deleted"}, {}), GCRules(7), NOW)
    assert got.active == {"deleted", "added"}
    assert got.expired == {"old"}


def test_the_head_back_then_follows_first_parents_only() -> None:
    """A merge's second parent older than the cutoff was the other branch's HEAD, not this
    one's: its files reached this branch through the merge, which holds them."""
    merged = history(("r", (), 90), ("p", ("r",), 40), ("q", ("r",), 45), ("m", ("p", "q"), 2))
    got = classify(merged, RefHeads({"main": "m"}, {}), GCRules(30), NOW)
    assert got.active == {"m", "p"}
    assert got.expired == {"r", "q"}


def test_branches_off_one_trunk_each_keep_their_own_head_back_then() -> None:
    trunk = history(("t0", (), 80), ("t1", ("t0",), 50), ("t2", ("t1",), 20), ("x", ("t1",), 10))
    rules = GCRules(30, (BranchRule("short", 15),))
    got = classify(trunk, RefHeads({"main": "t2", "long": "x", "short": "x"}, {}), rules, NOW)
    assert got.active == {"t2", "x", "t1"}
    longer = GCRules(5, (BranchRule("short", 55),))
    got = classify(trunk, RefHeads({"short": "x"}, {}), longer, NOW)
    assert got.active == {"x", "t1", "t0"}  # 55 days: t1 is in, t0 was HEAD back then


def test_the_head_is_active_however_old() -> None:
    got = classify(LINEAR, RefHeads({"main": "a"}, {}), GCRules(1), NOW)
    assert "a" in got.active
    assert {"b", "c", "d", "e"} <= got.expired  # no ref reaches them and they are > 1 day


def test_per_branch_patterns_and_the_longest_wins() -> None:
    rules = GCRules(7, (BranchRule("ma*", 70), BranchRule("main", 30)))
    got = classify(LINEAR, RefHeads({"main": "d"}, {}), rules, NOW)
    assert got.active == {"d", "c", "b", "a"}  # f: reached by no ref, older than 7 days


def test_a_commit_behind_an_old_one_is_not_reached() -> None:
    gap = history(("x", (), 3), ("y", ("x",), 40), ("z", ("y",), 1))
    got = classify(gap, RefHeads({"main": "z"}, {}), GCRules(30), NOW)
    assert got.active == {"z", "y"}
    assert got.expired == {"x"}


def test_merges_keep_both_parents_within_retention() -> None:
    merged = history(("r", (), 90), ("p", ("r",), 10), ("q", ("r",), 12), ("m", ("p", "q"), 2))
    got = classify(merged, RefHeads({"main": "m"}, {}), GCRules(30), NOW)
    assert got.active == {"m", "p", "q", "r"}  # r: main's HEAD 30 days ago


def test_tags_keep_their_commit_and_keep_tags_the_history() -> None:
    heads = RefHeads({"main": "d"}, {"nightly": "b", "v1": "e"})
    got = classify(LINEAR, heads, GCRules(30, keep_tags="v*"), NOW)
    assert got.active == {"d", "c", "f", "b", "e", "a"}
    got = classify(LINEAR, heads, GCRules(30), NOW)
    assert got.active == {"d", "c", "f", "b", "e"}
    assert got.expired == {"a"}


def test_dangling_commits_expire_with_the_default_retention() -> None:
    got = classify(LINEAR, RefHeads({"main": "d"}, {}), GCRules(55), NOW)
    assert "e" in got.active  # 50 days old, reached by nothing: kept under 55 days
    got = classify(LINEAR, RefHeads({"main": "d"}, {}), GCRules(45), NOW)
    assert "e" in got.expired


def test_a_ref_moved_onto_an_expired_commit_makes_it_active_again() -> None:
    rules = GCRules(30)
    first = classify(LINEAR, RefHeads({"main": "d"}, {}), rules, NOW)
    moved = RefHeads({"main": "d", "old": "a"}, {"keep": "e"})
    assert newly_active(first, LINEAR, moved, rules) == {"a", "e"}


def test_deletable_keeps_young_uncommitted_and_active_addresses() -> None:
    cutoff = days_ago(1)
    listed = {"data/a": days_ago(3), "data/b": days_ago(3), "data/c": days_ago(3), "data/d": NOW}
    assert deletable(listed, cutoff, {"data/a"}, {"data/b"}) == {"data/c"}


SEEDS = range(10)


@pytest.mark.parametrize("seed", SEEDS)
def test_random_histories_over_months(repo: Repository, seed: int) -> None:
    rng = random.Random(seed)
    clock = FakeClock(datetime(2026, 1, 1, tzinfo=UTC))
    RetentionHistory(repo, seed, clock).play(90)
    rules = repo.set_gc_rules(
        {
            "default_retention_days": rng.choice([0, 14, 30]),
            "branches": [
                {"branch_id": "main", "retention_days": rng.choice([30, 90])},
                {"branch_id": "b*", "retention_days": rng.choice([0, 7, 20])},
            ],
            **({"keep_tags": "v*"} if seed % 2 else {}),
        }
    )
    now = clock.now + timedelta(days=rng.randint(0, 30))
    retention = repository_retention(repo.lake.graveler, repo.record, rules, now)
    every = {c.id for c in repo.lake.graveler.refs.list_commits(repo.record)}
    assert retention.active == active_commits(repo, rules, now)
    assert retention.active | retention.expired == every
    assert not retention.active & retention.expired
    if rules.keep_tags is None:
        assert retention.expired, "a history over months with these rules expires something"

    run = repo.prepare_uncommitted_for_gc()
    listed = {key: info.mtime for key, info in data_objects(repo.lake, repo).items()}
    doomed = deletable(
        listed,
        newest_first_time(run.run_id),
        run_addresses(repo, run),
        commit_addresses(repo, set(retention.active)),
    )
    assert doomed == retention_candidates(repo, run, timedelta(0), rules, now)
    repo.lake.graveler.objects(repo.storage_namespace).delete(sorted(doomed))
    assert_retention_holds(repo, rules, now, run, set(listed), doomed)
