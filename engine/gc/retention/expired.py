"""Commits whose objects retention deleted, recorded in the KV when a sweep finishes, so
reading, branching from, resetting to or tagging one raises `CommitExpired` naming it and
when it expired, instead of a missing-object error deep in a read.

A record is written for every commit of the sweep's run whose metarange only expired commits
held (`engine/gc/runs/retention.py`): the run deleted what of its tree no active commit
shares. Records are written after the objects are deleted, so a client that checked a
commit just before reads an object that is gone at worst: the same outcome, later. The
commit records themselves stay (history, `repo.commit`, `log` and merge bases still work).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from datetime import datetime

from branchwater.engine.errors import CommitExpired, NotFound
from branchwater.engine.graveler.model import RepositoryRecord
from branchwater.engine.kv import Store

EXPIRED_PREFIX = b"gc/expired/"


def record_expired(
    kv: Store, repo: RepositoryRecord, commit_ids: Iterable[str], when: datetime, run_id: str
) -> int:
    """Record `commit_ids` as expired by run `run_id` at `when`; returns how many. Writing
    one again (a sweep resumed) keeps it expired, with the later time."""
    value = json.dumps({"expired": when.isoformat(), "run": run_id}).encode()
    count = 0
    for commit_id in commit_ids:
        kv.set(repo.partition, EXPIRED_PREFIX + commit_id.encode(), value)
        count += 1
    return count


def expired_at(kv: Store, repo: RepositoryRecord, commit_id: str) -> str | None:
    """When retention deleted the commit's objects, or None while they are kept."""
    try:
        value, _ = kv.get(repo.partition, EXPIRED_PREFIX + commit_id.encode())
    except NotFound:
        return None
    expired: str = json.loads(value)["expired"]
    return expired


def check_live(kv: Store, repo: RepositoryRecord, commit_id: str) -> str:
    """`commit_id`, or `CommitExpired` when retention deleted its objects."""
    expired = expired_at(kv, repo, commit_id)
    if expired is not None:
        raise CommitExpired(commit_id, expired)
    return commit_id
