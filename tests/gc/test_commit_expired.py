"""Expired commits say so: once a sweep recorded a commit as expired, reading it, branching
from it, resetting to it or tagging it raises `CommitExpired` naming it and when; branches,
tags, history and the commit record itself are unaffected."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from branchwater.engine import CommitExpired
from branchwater.engine.api import Repository
from branchwater.engine.gc.retention.expired import expired_at
from tests.helpers.gc import record_expired

WHEN = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)


def old_and_new(repo: Repository) -> tuple[str, str]:
    main = repo.branch("main")
    main.upload("a", b"1")
    old = main.commit("old").id
    main.upload("a", b"2")
    new = main.commit("new").id
    record_expired(repo.lake.graveler.kv, repo.record, [old], WHEN, "18f2a9c3b7d1-a1b2c3")
    return old, new


def test_every_way_to_reach_an_expired_commit_says_so(repo: Repository) -> None:
    old, _ = old_and_new(repo)
    attempts = [
        lambda: repo.ref(old),
        lambda: repo.ref("main~1"),
        lambda: repo.ref(old[:10]),
        lambda: repo.create_branch("again", source=old),
        lambda: repo.branch("main").reset(to=old),
        lambda: repo.tag("again", old),
    ]
    for attempt in attempts:
        with pytest.raises(CommitExpired) as raised:
            attempt()
        assert raised.value.commit_id == old
        assert old in str(raised.value) and WHEN.isoformat() in str(raised.value)
    assert [b.name for b in repo.branches()] == ["main"]
    assert repo.tags() == []


def test_live_refs_history_and_records_are_unaffected(repo: Repository) -> None:
    old, new = old_and_new(repo)
    assert repo.ref("main").read("a") == b"2"
    assert repo.ref(new).read("a") == b"2"
    assert repo.commit(old).message == "old"
    assert [c.id for c in repo.log("main")][:2] == [new, old]
    assert expired_at(repo.lake.graveler.kv, repo.record, new) is None
    assert expired_at(repo.lake.graveler.kv, repo.record, old) == WHEN.isoformat()


def test_recording_again_keeps_it_expired(repo: Repository) -> None:
    old, _ = old_and_new(repo)
    later = datetime(2026, 6, 1, tzinfo=UTC)
    record_expired(repo.lake.graveler.kv, repo.record, [old], later, "r2")
    assert expired_at(repo.lake.graveler.kv, repo.record, old) == later.isoformat()
