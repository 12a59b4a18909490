"""The committed part of a GC run, on the driver: which metaranges hold active and expired
commits (`engine/gc/retention/expiry.py` states the rule and its proof), what the report
attributes an expired object to, and the re-check under the run's lease that drops what
became active while the run computed its candidates.

The re-check. The run holds the repository's GC lease from before it reads the refs until
its sweep ends. After the candidates are computed, it reads every branch and tag again and
the commit records again, and keeps out of the candidates every address held by a commit
that is now active and was not (a branch created from or reset to an old commit, a tag put
on one, a branch deleted and so rule 4's default retention applying) or that is new since
the first read (a merge or commit that committed old objects again, a revert or
cherry-pick). It also prepares the uncommitted entries again, which catches a restore that
staged an expired commit's entry. A move made after the re-check and before the sweep
deletes is refused instead: the run records its expiring commits in the KV before it
re-checks, and every move onto a commit claims that key before its first write
(`engine/graveler/fence.py` proves the order).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime

import pyarrow as pa

from branchwater.engine import failpoints
from branchwater.engine.gc.retention.expired import (
    expire_fenced,
    mark_expiring,
    release_expiring,
)
from branchwater.engine.gc.retention.expiry import (
    DANGLING,
    CommitNode,
    Retention,
    classify,
    read_heads,
)
from branchwater.engine.gc.retention.rules import GCRules, get_rules
from branchwater.engine.gc.runs import files
from branchwater.engine.gc.runs.storage import Namespace
from branchwater.engine.graveler.committed import EMPTY_METARANGE_ID
from branchwater.engine.graveler.graveler import Graveler
from branchwater.engine.graveler.model import RepositoryRecord

ONLY_UNCOMMITTED = "uncommitted"
ONLY_COMMITTED = "committed"
PARTS = (ONLY_UNCOMMITTED, ONLY_COMMITTED)
EXPIRED_COMMITS_SHOWN = 200
"""Expired commits a summary lists by id (the counts cover all of them)."""


@dataclass(frozen=True)
class Attribution:
    """Where an expired object's bytes are reported: the newest expired commit holding it,
    its month and the branch it was on."""

    commit_id: str
    month: str
    branch: str
    date: datetime


@dataclass(frozen=True)
class RetentionInput:
    """The committed part's input: the rules, every commit's class, and their metaranges."""

    rules: GCRules
    retention: Retention
    metaranges: Mapping[str, str]
    """Commit id → metarange id, for every commit whose tree is not empty."""

    def active_metaranges(self) -> set[str]:
        return {self.metaranges[c] for c in self.retention.active if c in self.metaranges}

    def expired_metaranges(self) -> set[str]:
        """Metaranges only expired commits hold (a metarange an active commit shares, as a
        revert back to an old tree does, holds only active addresses)."""
        expired = {self.metaranges[c] for c in self.retention.expired if c in self.metaranges}
        return expired - self.active_metaranges()

    def attribution(self) -> dict[str, Attribution]:
        """Expired metarange → the newest expired commit with it."""
        found: dict[str, Attribution] = {}
        for commit_id in self.retention.expired:
            metarange = self.metaranges.get(commit_id)
            if metarange is None:
                continue
            date = self.retention.dates[commit_id]
            known = found.get(metarange)
            if known is None or date > known.date:
                branch = self.retention.branch_of.get(commit_id, DANGLING)
                found[metarange] = Attribution(commit_id, date.strftime("%Y-%m"), branch, date)
        return found

    def summary(self) -> dict[str, object]:
        expired = sorted(self.retention.expired, key=lambda c: self.retention.dates[c])
        return {
            "rules": self.rules.to_json(),
            "now": self.retention.now.isoformat(),
            "active_commits": len(self.retention.active),
            "expired_commits": len(expired),
            "expired_shown": [
                {
                    "commit": c,
                    "date": self.retention.dates[c].isoformat(),
                    "branch": self.retention.branch_of.get(c, DANGLING),
                }
                for c in expired[-EXPIRED_COMMITS_SHOWN:]
            ],
        }


def retention_input(g: Graveler, repo: RepositoryRecord, now: datetime) -> RetentionInput | None:
    """The committed part's input now; None when the repository has no rules."""
    rules = get_rules(g.kv, repo)
    if rules is None:
        return None
    heads = read_heads(g, repo)
    commits = list(g.refs.list_commits(repo))
    retention = classify({c.id: CommitNode.of(c) for c in commits}, heads, rules, now)
    metaranges = {c.id: c.metarange_id for c in commits if c.metarange_id != EMPTY_METARANGE_ID}
    return RetentionInput(rules, retention, metaranges)


def commits_holding(
    plan: RetentionInput, trees: Mapping[str, Collection[str]], ranges: Collection[str]
) -> set[str]:
    """The expired commits whose tree lists one of `ranges` (the ranges holding a
    candidate); `trees` maps each expired-only metarange to its ranges."""
    hit = set(ranges)
    return {
        c
        for c in plan.retention.expired
        if (m := plan.metaranges.get(c)) is not None and not hit.isdisjoint(trees.get(m, ()))
    }


def metaranges_now_held(
    g: Graveler,
    repo: RepositoryRecord,
    first: RetentionInput,
    run_id: str,
    holding: Collection[str] | None = None,
) -> set[str]:
    """The re-check: metaranges of commits that are active now (by the run's rules, and by
    the rules stored now if they changed meanwhile: whichever keeps a commit keeps it, at
    the run's time) and of every commit recorded since `first`, less those `first` already
    counted as active. The commits the run may expire are fenced first: of them, those
    `holding` names (the commits whose trees hold a candidate) when given. One a move
    claimed within the operation margin is not fenced and counts as active: the move may
    still write, so this run keeps what it holds."""
    failpoints.hit("gc.retention.before_recheck")
    expiring = commits_expiring(first, set(), holding)
    claimed = set(expiring) - set(mark_expiring(g.kv, repo, expiring, run_id))
    heads = read_heads(g, repo)
    commits = list(g.refs.list_commits(repo))
    history = {c.id: CommitNode.of(c) for c in commits}
    active = set(classify(history, heads, first.rules, first.retention.now).active) | claimed
    rules = get_rules(g.kv, repo)
    if rules is not None and rules != first.rules:
        active |= classify(history, heads, rules, first.retention.now).active
    held = {c.metarange_id for c in commits if c.id in active or c.id not in first.metaranges}
    return (held - {EMPTY_METARANGE_ID}) - first.active_metaranges()


EXPIRED_COMMITS = "expired_commits"
"""The run's file set listing the commits its sweep expires (`summary.files`)."""


def commits_expiring(
    plan: RetentionInput, held_now: set[str], holding: Collection[str] | None = None
) -> list[str]:
    """The expired commits whose metarange only expired commits hold, less those the
    re-check found held again, and, when `holding` is given, less those whose trees hold no
    candidate: what the sweep records as expired (`expired.py` states what that covers)."""
    gone = plan.expired_metaranges() - held_now
    found = (c for c in plan.retention.expired if plan.metaranges.get(c) in gone)
    return sorted(found if holding is None else set(found) & set(holding))


def settle_expiring(
    g: Graveler,
    repo: RepositoryRecord,
    plan: RetentionInput,
    held_now: set[str],
    run_id: str,
    holding: Collection[str] | None = None,
) -> list[str]:
    """`commits_expiring`, after releasing the fence of every other commit fenced before
    the re-check (`holding`: the commits whose trees still hold a candidate after the
    re-check's drops and the age filter; a commit kept whole is released)."""
    expiring = commits_expiring(plan, held_now, holding)
    kept = set(commits_expiring(plan, set())) - set(expiring)
    release_expiring(g.kv, repo, sorted(kept), run_id)
    return expiring


def write_expiring(ns: Namespace, run_id: str, commit_ids: list[str]) -> list[str]:
    key = f"{files.set_prefix(run_id, EXPIRED_COMMITS)}/{files.part_name(0)}"
    ns.write_parquet(key, pa.table({"commit_id": pa.array(commit_ids, pa.string())}))
    return [key]


def expiring_ids(ns: Namespace, summary: files.RunSummary) -> list[str]:
    """The commits the run's sweep expires, as its mark wrote them."""
    keys = summary.files.get(EXPIRED_COMMITS, [])
    return [i for key in keys for i in ns.read_parquet(key).column(0).to_pylist()]


def expire_before_sweep(
    g: Graveler, repo: RepositoryRecord, ns: Namespace, summary: files.RunSummary
) -> int:
    """Before a sweep deletes: its expiring commits must still be fenced for its run
    (`StaleGCMark` otherwise, nothing recorded or deleted); they are then recorded as
    expired (`CommitExpired` from then on, for good), so no move reaches them however long
    the deletes take or however late a killed sweep is resumed. Returns how many were
    recorded now."""
    failpoints.hit("gc.retention.before_sweep")
    ids = expiring_ids(ns, summary)
    if not ids:
        return 0
    swept_before = bool(ns.folder_keys(f"{files.run_prefix(summary.run_id)}{files.DELETED}"))
    return expire_fenced(g.kv, repo, ids, summary.run_id, datetime.now(UTC), swept_before)


def release_unswept(
    g: Graveler, repo: RepositoryRecord, ns: Namespace, summary: files.RunSummary
) -> None:
    """A mark that can never be swept (its gate failed) stops fencing its commits."""
    release_expiring(g.kv, repo, expiring_ids(ns, summary), summary.run_id)
