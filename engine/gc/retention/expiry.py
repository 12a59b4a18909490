"""Which commits retention expires, and which addresses that lets GC delete (lakeFS's
committed-GC semantics, Spark-free: the job computes the commit sets here, on the driver,
and only the address sets in Spark).

The rule. Given a repository's rules and a time `now`, with `cutoff(b) = now -
retention_days(b)` for a branch `b` and `cutoff_default = now - default_retention_days`:

1. A branch's HEAD is active.
2. A parent of an active commit reached from branch `b` is active, for `b`, when it was
   created after `cutoff(b)`: a commit is active when it is reachable from a branch's HEAD
   through commits all newer than that branch's retention.
2b. So is the commit that was `b`'s HEAD at `cutoff(b)`: the first one along the first-parent
   line from its HEAD not newer than `cutoff(b)`. An object deleted on `b` a day ago was
   last held by a commit that may be months old; keeping that commit keeps what `b` showed
   at any moment of its retention, which is lakeFS's promise ("retained for N days after it
   was deleted"). There is no record of when a branch moved, so HEAD at a time is read off
   commit dates, as lakeFS does: a fast-forward onto a commit made earlier elsewhere looks,
   to the rule, as if the branch had been there since that commit was made.
3. A tagged commit is active (tags keep what they point at, always). A tag matching
   `keep_tags` also keeps every ancestor of its commit.
4. A commit no branch HEAD or tag reaches at all (a deleted branch's, a merge's replaced
   attempt, a reset's abandoned one, an orphan record) is active while it is newer than
   `cutoff_default`: a commit being made, whose branch update has not landed yet, is one.
5. Every other commit is expired.

An address may be deleted only when it is in the namespace's `data/` (listing), older than
the run's cutoff (`now - min_age`), in no prepare output (staged, sealed, compacted: no
uncommitted entry and no tracked copy references it) and held by no active commit.

Why that never deletes what a reader may still reach. A reader reaches an object through a
branch (HEAD's tree or its staging), a tag, or a commit id. HEAD is active (1) and the
staging is in the prepare output, so a branch's view keeps its objects; a tag's commit is
active (3). A commit id a reader holds is only promised while it is active: an expired
commit's objects may go, and reading it afterwards raises `CommitExpired`. An address is
kept when *any* active commit holds it, so an object shared by an expired commit and an
active one (an unchanged file across many commits, the common case) stays: deletion works
on addresses, never on commits, and commit records themselves are never deleted. That is
also why the optimized run's incremental committed set stays sound: it may hold addresses
of commits that have since expired, which only keeps more.

The walk (2) keeps, per commit, the earliest cutoff any branch reached it with, and goes on
from a commit only when a branch reaches it with an earlier one: each commit is walked at
most once per distinct retention, so the cost is the history's size times the number of
distinct retentions, not times the number of branches.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from branchwater.engine.gc.retention.rules import GCRules
from branchwater.engine.graveler.graveler import Graveler
from branchwater.engine.graveler.model import Commit, RepositoryRecord

DANGLING = "(no branch)"
"""What an expired commit no branch reaches is attributed to, in reports."""


@dataclass(frozen=True)
class CommitNode:
    """What the rule needs of a commit."""

    id: str
    parents: tuple[str, ...]
    creation_date: datetime

    @classmethod
    def of(cls, commit: Commit) -> CommitNode:
        return cls(commit.id, commit.parents, commit.creation_date)


@dataclass(frozen=True)
class RefHeads:
    """Branch heads and tags, by name, as read at one moment."""

    branches: Mapping[str, str]
    tags: Mapping[str, str]


@dataclass(frozen=True)
class Retention:
    """A classification of every commit: `active` and `expired` ids partition the history;
    `branch_of` names, for an expired commit, the first branch (by name) that reaches it,
    else `DANGLING`; `now` is the time the cutoffs were measured from."""

    now: datetime
    active: frozenset[str]
    expired: frozenset[str]
    branch_of: Mapping[str, str] = field(default_factory=dict)
    dates: Mapping[str, datetime] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        return {
            "now": self.now.isoformat(),
            "active": sorted(self.active),
            "expired": sorted(self.expired),
            "branch_of": dict(sorted(self.branch_of.items())),
            "dates": {c: self.dates[c].isoformat() for c in sorted(self.expired)},
        }


def classify(
    commits: Mapping[str, CommitNode], heads: RefHeads, rules: GCRules, now: datetime
) -> Retention:
    """Split `commits` into active and expired by the rule above."""
    reached: dict[str, datetime] = {}
    opened: dict[tuple[str, datetime], str | None] = {}
    for name in sorted(heads.branches):
        head = heads.branches[name]
        cutoff = now - timedelta(days=rules.retention_days(name))
        _walk(commits, head, cutoff, reached)
        _head_at(commits, head, cutoff, opened)
    never = datetime.min.replace(tzinfo=now.tzinfo)
    for name in sorted(heads.tags):
        commit_id = heads.tags[name]
        if rules.keeps_history(name):
            _walk(commits, commit_id, never, reached)
        else:
            reached.setdefault(commit_id, now)
    active = (set(reached) | {c for c in opened.values() if c is not None}) & set(commits)
    branch_of = _first_branch(commits, heads)
    default_cutoff = now - timedelta(days=rules.default_retention_days)
    active |= {
        c.id for c in commits.values() if c.id not in branch_of and c.creation_date > default_cutoff
    }
    expired = frozenset(commits) - active
    return Retention(
        now,
        frozenset(active),
        expired,
        {c: branch_of.get(c, DANGLING) for c in expired},
        {c: commits[c].creation_date for c in expired},
    )


def _walk(
    commits: Mapping[str, CommitNode], start: str, cutoff: datetime, reached: dict[str, datetime]
) -> None:
    """Mark `start` and its ancestors newer than `cutoff` (through such ones) as reached,
    recording each commit's earliest cutoff; stop where an earlier one already passed."""
    if start not in commits or reached.get(start, cutoff + timedelta(1)) <= cutoff:
        return
    reached[start] = cutoff
    stack = [start]
    while stack:
        for parent in commits[stack.pop()].parents:
            node = commits.get(parent)
            if node is None or node.creation_date <= cutoff:
                continue
            if reached.get(parent, cutoff + timedelta(1)) <= cutoff:
                continue
            reached[parent] = cutoff
            stack.append(parent)


def _head_at(
    commits: Mapping[str, CommitNode],
    head: str,
    cutoff: datetime,
    opened: dict[tuple[str, datetime], str | None],
) -> None:
    """Record in `opened`, for `head` and each commit on its first-parent line newer than
    `cutoff`, the commit that line shows at `cutoff` (rule 2b), or None where the line ends
    first. A line another branch already followed with this cutoff is not followed again, so
    branches forked off one trunk share its walk."""
    line: list[str] = []
    at = head
    while at in commits and (at, cutoff) not in opened:
        if commits[at].creation_date <= cutoff:
            opened[(at, cutoff)] = at
            break
        line.append(at)
        at = next(iter(commits[at].parents), "")
    found = opened.get((at, cutoff))
    for commit_id in line:
        opened[(commit_id, cutoff)] = found


def _first_branch(commits: Mapping[str, CommitNode], heads: RefHeads) -> dict[str, str]:
    """Every commit a branch or tag reaches through any parents, mapped to the first branch
    by name that does (a tag-only commit to `DANGLING`'s stand-in: the tag's name)."""
    owner: dict[str, str] = {}
    starts = [(name, heads.branches[name]) for name in sorted(heads.branches)]
    starts += [(f"tag {name}", heads.tags[name]) for name in sorted(heads.tags)]
    for name, start in starts:
        stack = [start] if start in commits and start not in owner else []
        for commit_id in stack:
            owner[commit_id] = name
        while stack:
            for parent in commits[stack.pop()].parents:
                if parent in commits and parent not in owner:
                    owner[parent] = name
                    stack.append(parent)
    return owner


def read_history(g: Graveler, repo: RepositoryRecord) -> dict[str, CommitNode]:
    """Every commit record of the repository, reachable or not."""
    return {c.id: CommitNode.of(c) for c in g.refs.list_commits(repo)}


def read_heads(g: Graveler, repo: RepositoryRecord) -> RefHeads:
    """Branch heads, then tags, each from one scan."""
    branches = {b.name: b.commit_id for b in g.refs.branches(repo)}
    tags = {t.name: t.commit_id for t in g.refs.list_tags(repo)}
    return RefHeads(branches, tags)


def repository_retention(
    g: Graveler, repo: RepositoryRecord, rules: GCRules, now: datetime
) -> Retention:
    """The rule applied to the repository as stored now. Heads are read before the history,
    so every commit a head names is in it (commit records are written before any ref)."""
    heads = read_heads(g, repo)
    return classify(read_history(g, repo), heads, rules, now)


def newly_active(
    retention: Retention, commits: Mapping[str, CommitNode], heads: RefHeads, rules: GCRules
) -> frozenset[str]:
    """Of `retention`'s expired commits, those that the same rule at the same `now` makes
    active with `heads` read again: what a run must drop before it deletes."""
    again = classify(commits, heads, rules, retention.now)
    return retention.expired & again.active


def deletable(
    listed: Mapping[str, datetime],
    cutoff: datetime,
    uncommitted: Iterable[str],
    active_addresses: Iterable[str],
) -> set[str]:
    """The addresses a run may delete: listed under `data/` (the caller lists only there),
    modified at or before `cutoff`, in no prepare output and held by no active commit."""
    keep = set(uncommitted) | set(active_addresses)
    return {a for a, mtime in listed.items() if mtime <= cutoff and a not in keep}
