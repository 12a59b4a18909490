"""Three-way merge of commits, and merge-with-retry that reuses its own work (after lakeFS's
design for contended merges).

A merge applies to the destination the changes that turn the merge base into the source:
`diff(base, source)` skips every range the source left alone, and `apply` references every
destination range no change falls into, so the cost follows the size of the change.

Entries compare by identity (content and metadata), so a side that rewrote equal content did
not change the path, and equal changes on both sides merge cleanly. Where the history
criss-crosses and has several best merge bases, they are merged first into a virtual base,
recursively, as git's recursive strategy does; the merge commit records the bases it used.

A destination that has not moved since the source branched from it is fast-forwarded, as
git does: it points at the source's commit and no merge commit is written. With
`fast_forward=False` (git's `--no-ff`, lakeFS's only behaviour) a merge commit is written
anyway, on the destination's HEAD then the source, holding the source's metarange, so the
merge's message and metadata (an Airflow task's identity, say) are recorded.

When the final `set_if` loses a race, the retry merges *the metarange this attempt produced*
(source') on the new destination HEAD, with the destination it merged against as base'. Then
`diff(base', source')` is only what this merge brought in, and the ranges it wrote are
reused. That design's correctness table misses one case: where the old HEAD had changed a
path the source changed too (say it took the source's change from another branch), the
attempt's merge hid the source's change there, and a new HEAD that changed the path again
wins it from base' where the merge of the parents conflicts (or brings the source's value
back). So a retry reuses its attempt only where that is provably the merge of the parents
(`_MergePlan.reuses_exactly`, proved in `reuse_is_exact`), else merges afresh from the new
merge base.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from itertools import islice
from typing import Literal, Protocol

from branchwater.engine import failpoints
from branchwater.engine.errors import (
    DirtyBranch,
    InvalidArgument,
    MergeConflict,
    MergeRaceLost,
    NoChanges,
    NotFound,
    too_many_tries,
)
from branchwater.engine.graveler import protection
from branchwater.engine.graveler.checks import check_merge
from branchwater.engine.graveler.commit import releasing, sealing
from branchwater.engine.graveler.committed import (
    EMPTY_METARANGE_ID,
    CommittedStore,
    Replacements,
)
from branchwater.engine.graveler.committed.diff import changed_ranges, spans_meet
from branchwater.engine.graveler.fence import claim
from branchwater.engine.graveler.graveler import Graveler
from branchwater.engine.graveler.history import find_merge_bases
from branchwater.engine.graveler.model import (
    BranchRecord,
    Change,
    Commit,
    Entry,
    RepositoryRecord,
    check_commit_arguments,
)
from branchwater.engine.graveler.reads import uncommitted_changes
from branchwater.engine.graveler.signing import lake_key, short_tag, tag_matches
from branchwater.engine.units import EPOCH

log = logging.getLogger(__name__)

Strategy = Literal["source-wins", "dest-wins"]
STRATEGIES: tuple[str, ...] = ("source-wins", "dest-wins")
VIRTUAL_BASE = "virtual-base"
"""The resolution of merges that build a virtual base: conflicts become entries of neither side."""
BASES_KEY = "branchwater.merge.bases"
"""Merge commit metadata: the ids of the merge bases used, comma-separated."""
PREVIEW_KEY = "branchwater.merge.preview"
"""Merge preview metadata: the branch the preview was built for (`publish` checks it)."""
STRATEGY_KEY = "branchwater.merge.strategy"
"""Merge commit metadata: the strategy given, if any (a lost publish's hint is signed for it)."""
CONFLICTS_SHOWN = 20
RESOLVE_BATCH = 4096
"""Changes resolved together: bounds memory, and amortises each range lookup over many."""
_NEITHER_PREFIX = "virtual-base:"
"""Checksums of virtual-base entries start so; no content checksum does (they are hex)."""


@dataclass(frozen=True)
class MergeResult:
    commit: Commit
    attempts: int
    fast_forward: bool = False


@dataclass(frozen=True)
class Attempt:
    """What one attempt produced: the merged metarange, the destination it merged onto, and
    the merge bases it used."""

    metarange_id: str
    onto_commit_id: str
    bases: tuple[str, ...]
    base_metarange_id: str | None = None
    """The tree of `bases` (a virtual base's, if several), once built: a retry judging its
    reuse (`reuse_is_exact`) needs it and should not merge the bases again."""


def merge_hint(
    g: Graveler, repo: RepositoryRecord, at: Attempt, source_id: str, strategy: str | None
) -> str:
    """`<metarange>@<commit>.<tag>`: the attempt's tree and the HEAD it merged onto, signed
    with the lake's key over the merge it is the work of (`_hint_text`). A retry lands the
    hinted tree as the merge's result, so only a hint this lake made for this very merge may
    be taken: any other tree would land on the branch unchecked."""
    text = _hint_text(repo, at.metarange_id, at.onto_commit_id, source_id, strategy)
    return f"{at.metarange_id}@{at.onto_commit_id}.{short_tag(lake_key(g.refs.kv), text)}"


SHOWN_HINT = 200
"""Characters of a hint a warning shows: a real one is about 150; a forged one may be huge."""


def split_hint(hint: str) -> tuple[str, str, str] | None:
    """The metarange, the commit it merged onto and the tag of text shaped as `merge_hint`
    makes it; None for text of any other shape, which no merge could have given."""
    metarange_id, sep, rest = hint.partition("@")
    onto, dot, tag = rest.rpartition(".")
    if not (metarange_id and sep and onto and dot and tag):
        return None
    return metarange_id, onto, tag


def _hint_text(
    repo: RepositoryRecord, metarange_id: str, onto: str, source_id: str, strategy: str | None
) -> str:
    return f"merge-hint/v1|{repo.unique_id}|{metarange_id}|{onto}|{source_id}|{strategy or ''}"


def merge(
    g: Graveler,
    repo: RepositoryRecord,
    source_ref: str,
    destination: str,
    *,
    strategy: str | None = None,
    message: str | None = None,
    metadata: dict[str, str] | None = None,
    committer: str = "",
    hint: str | None = None,
    fast_forward: bool = True,
    preview: bool = False,
) -> MergeResult:
    """Merge `source_ref` into the branch `destination`; see the module docstring. With
    `preview`, build the merge commit without moving the destination (`publish.py`)."""
    metadata = check_commit_arguments(message or "", metadata, committer)
    metadata.pop(PREVIEW_KEY, None)
    if preview:
        metadata[PREVIEW_KEY] = destination
    if strategy is not None and strategy not in STRATEGIES:
        raise InvalidArgument(f"unknown merge strategy {strategy!r}: use one of {STRATEGIES}")
    source = g.refs.get_commit(repo, g.refs.resolve(repo, source_ref).commit_id)
    previous = _parse_hint(g, repo, hint, source, strategy) if hint else None
    plan = _MergePlan(
        source_ref,
        destination,
        strategy,
        source,
        fast_forward and not preview,
        message,
        metadata,
        committer,
    )
    if preview:
        return _preview(g, repo, destination, plan, previous)
    return land(g, repo, destination, plan, previous)


def _preview(
    g: Graveler,
    repo: RepositoryRecord,
    destination: str,
    plan: _MergePlan,
    previous: Attempt | None,
) -> MergeResult:
    """The merge commit on the destination's HEAD, recorded but not landed: nothing of the
    branch is written, so a dirty destination is refused rather than sealed."""
    branch, _ = g.refs.get_branch(repo, destination)
    if g.has_uncommitted(branch):
        _check_clean(g, repo, branch, plan.verb)
    head = g.refs.get_commit(repo, branch.commit_id)
    if previous is not None and plan.reuses_exactly(g, repo, head, previous):
        attempt = _next_attempt(g, repo, head, previous, plan.strategy, plan.sides)
    else:
        first = plan.first(g, repo, head)
        assert isinstance(first, Attempt), "a preview never fast-forwards"
        attempt = first
    return MergeResult(plan.record(g, repo, head, attempt), 1)


class Plan(Protocol):
    """What `land` needs to know of one kind of three-way merge onto a branch (a merge, a
    revert, a cherry-pick): its first attempt, its commit record, and how it gives up."""

    @property
    def sides(self) -> tuple[str, str]:
        """(what is merged, the branch), for messages."""

    @property
    def strategy(self) -> str | None: ...

    @property
    def allow_dirty(self) -> bool:
        """Keep the branch's uncommitted changes above the new commit, rather than refuse."""

    @property
    def verb(self) -> str:
        """What `DirtyBranch` says the branch must be clean before."""

    def first(self, g: Graveler, repo: RepositoryRecord, head: Commit) -> Attempt | Commit:
        """The first attempt onto `head`, or the commit to fast-forward the branch to."""

    def reuses_exactly(
        self, g: Graveler, repo: RepositoryRecord, head: Commit, previous: Attempt
    ) -> bool:
        """Whether `previous` merged onto `head` (`_next_attempt`) is what `first` onto `head`
        would give, so a lost race may reuse its work."""

    def record(self, g: Graveler, repo: RepositoryRecord, head: Commit, at: Attempt) -> Commit:
        """The commit holding `at`'s metarange on `head`."""

    def gave_up(
        self, g: Graveler, repo: RepositoryRecord, attempts: int, last: Attempt | None
    ) -> Exception:
        """The error once every attempt lost its race."""


def land(
    g: Graveler,
    repo: RepositoryRecord,
    destination: str,
    plan: Plan,
    previous: Attempt | None = None,
) -> MergeResult:
    """The retry loop every three-way merge onto a branch shares: ready the destination,
    merge onto its HEAD (after a lost race, what the previous attempt merged, onto the new
    HEAD, where the plan finds that exact; else afresh), record the commit and `set_if` the
    branch to it."""
    with releasing(g, repo, destination) as opened:
        for attempt in g.retry:
            ready = ready_destination(g, repo, destination, plan.verb, opened, plan.allow_dirty)
            if ready is None:
                continue
            branch, predicate = ready
            _guard(g, repo, branch, plan)
            head = g.refs.get_commit(repo, branch.commit_id)
            if previous is not None and plan.reuses_exactly(g, repo, head, previous):
                previous = _next_attempt(g, repo, head, previous, plan.strategy, plan.sides)
            else:
                first = plan.first(g, repo, head)
                if isinstance(first, Commit):
                    claim(g, repo, first.id)
                    moved = moved_to(branch, first.id)
                    if g.update_branch_dropping(repo, moved, predicate, branch.sealed_tokens):
                        return MergeResult(first, attempt, fast_forward=True)
                    continue
                previous = first
            failpoints.hit("merge.after_ranges")
            new_commit = plan.record(g, repo, head, previous)
            dropped: tuple[str, ...] = ()
            if plan.allow_dirty:
                moved = _kept_above(g, repo, branch, head, new_commit)
            else:
                moved, dropped = moved_to(branch, new_commit.id), branch.sealed_tokens
            failpoints.hit("merge.before_set")
            if g.update_branch_dropping(repo, moved, predicate, dropped):
                return MergeResult(new_commit, attempt)
        raise plan.gave_up(g, repo, g.retry.attempts, previous)


def _guard(g: Graveler, repo: RepositoryRecord, branch: BranchRecord, plan: Plan) -> None:
    """Refuse what the branch's protection rules forbid, judged on the record the `set_if`
    is conditioned on (`graveler.protection`): a plan's own `guard` (a merge's checks), and
    for a plan without one (an import, say) the rule on direct commits."""
    guard = getattr(plan, "guard", None)
    if guard is not None:
        guard(g, repo, branch)
    else:
        protection.check(repo, branch, "commit", f"{plan.sides[0]!r} onto {plan.sides[1]!r}")


@dataclass(frozen=True)
class _MergePlan:
    source_ref: str
    destination: str
    strategy: str | None
    source: Commit
    fast_forward: bool
    message: str | None
    metadata: dict[str, str]
    committer: str
    allow_dirty: bool = False
    verb: str = "merging into it"

    @property
    def sides(self) -> tuple[str, str]:
        return (self.source_ref, self.destination)

    def guard(self, g: Graveler, repo: RepositoryRecord, branch: BranchRecord) -> None:
        """Merges pass `no_direct_writes`; required checks must be on the source commit."""
        what = f"merge of {self.source_ref!r} into {self.destination!r}"
        check_merge(g, repo, branch, (self.source.id,), what)

    def first(self, g: Graveler, repo: RepositoryRecord, head: Commit) -> Attempt | Commit:
        bases = _merge_bases(g, repo, head, self.source)
        if bases[0].id == self.source.id:
            raise NoChanges(f"{self.destination!r} already contains {self.source_ref!r}")
        if bases[0].id == head.id and self.fast_forward:
            return self.source
        return _first_attempt(g, repo, head, self.source, bases, self.strategy, self.sides)

    def reuses_exactly(
        self, g: Graveler, repo: RepositoryRecord, head: Commit, previous: Attempt
    ) -> bool:
        """Whether merging `previous` onto `head` from the HEAD it merged onto is the merge of
        `head` and the source: their merge bases are the ones `previous` merged from (so the
        same base tree), `head` is none of them (a fresh merge would fast-forward, find
        nothing to merge, or take the source's tree), and no path `head` changed is one
        where reuse differs (`reuse_is_exact`)."""
        bases = _merge_bases(g, repo, head, self.source)
        ids = {base.id for base in bases}
        if ids != set(previous.bases) or ids & {head.id, self.source.id}:
            return False
        base_mr = previous.base_metarange_id or base_metarange(g, repo, bases)
        return reuse_is_exact(g, repo, previous, head, base_mr, self.source.metarange_id)

    def record(self, g: Graveler, repo: RepositoryRecord, head: Commit, at: Attempt) -> Commit:
        return _record(
            g,
            repo,
            head,
            self.source,
            at,
            self.message,
            self.metadata,
            self.committer,
            self.strategy,
        )

    def gave_up(
        self, g: Graveler, repo: RepositoryRecord, attempts: int, last: Attempt | None
    ) -> Exception:
        what = f"merge of {self.source_ref!r} into {self.destination!r} of {repo.name!r}"
        if last is None:
            return too_many_tries(what, attempts)
        return MergeRaceLost(
            what, attempts, merge_hint(g, repo, last, self.source.id, self.strategy)
        )


def _first_attempt(
    g: Graveler,
    repo: RepositoryRecord,
    head: Commit,
    source: Commit,
    bases: list[Commit],
    strategy: str | None,
    sides: tuple[str, str],
) -> Attempt:
    """The source merged onto the destination's HEAD; when HEAD is the merge base (a merge
    that does not fast-forward), the merged tree is the source's own metarange."""
    if bases[0].id == head.id:
        return Attempt(source.metarange_id, head.id, (head.id,), head.metarange_id)
    base_mr = base_metarange(g, repo, bases)
    merged = merged_or_conflict(g, repo, base_mr, source.metarange_id, head, strategy, sides)
    return Attempt(merged, head.id, tuple(base.id for base in bases), base_mr)


def _next_attempt(
    g: Graveler,
    repo: RepositoryRecord,
    head: Commit,
    previous: Attempt,
    strategy: str | None,
    sides: tuple[str, str],
) -> Attempt:
    """What the previous attempt merged, merged again onto the destination's new HEAD with
    the commit it merged onto as base: only what this merge brought in is applied, and the
    ranges it wrote are reused by id. Exact only where `reuse_is_exact` holds."""
    base_mr = g.refs.get_commit(repo, previous.onto_commit_id).metarange_id
    merged = merged_or_conflict(g, repo, base_mr, previous.metarange_id, head, strategy, sides)
    return Attempt(merged, head.id, previous.bases, previous.base_metarange_id)


def reuse_is_exact(
    g: Graveler,
    repo: RepositoryRecord,
    previous: Attempt,
    head: Commit,
    base_mr: str,
    source_mr: str,
) -> bool:
    """Whether `_next_attempt` of `previous` onto `head` equals the three-way merge of
    `source_mr` onto `head` from `base_mr`, the base `previous` was merged from (the caller
    checks the base is unchanged). It does if no path `head` changed since the old HEAD is one
    the source changed (s != b) where the old HEAD differed from the base too (h1 != b); where
    one is, it may not (below), and the caller merges afresh.

    Proof, path by path, with m(b, s, d) the merge rule (d where s is b or d; s where d is b;
    else a conflict the strategy resolves, to s or d) and m1 = m(b, s, h1) the attempt
    (conflict-free, or it would have raised). The retry gives r = m(h1, m1, h2), the fresh
    merge f = m(b, s, h2).
    - h2 = h1 (HEAD left the path alone): r = m1, as m1 = h1 gives h1 and otherwise d is the
      base; f = m(b, s, h1) = m1. Neither conflicts there.
    - s = b: m1 = h1, so r = h2; f = h2.
    - h1 = b: m1 = m(b, s, b) = s, so r = m(b, s, h2) = f: the same rule on the same
      entries, so the same value, the same conflict, the same strategy's choice.
    Conflicts hence fall on the same paths; both walk their diffs in path order, so the same
    paths are named and counted. The excluded case does differ: s = h1 != b (HEAD took the
    source's change) and h2 != h1 gives m1 = h1, r = h2 cleanly, where f is s if h2 = b and
    else a conflict (seed 37 of the history checker); with `dest-wins` and h1 outside
    {b, s}, r = h2 where f = s if h2 = b.

    Where no range that changed from h1 to h2 meets, by its key bounds, a range the source
    changed from the base, no path is in both, and it holds without reading a range: the
    common case of merges racing in different parts of the tree, where reading what landed
    meanwhile costs a retry more than redoing its merge (with no range cache). Otherwise only
    the paths `diff(h1, h2)` names are read, in batches: the cost follows what landed
    meanwhile, as the reuse's does. The old HEAD's entry is looked up only where the source
    changed the path.
    """
    committed = g.committed(repo)
    onto_mr = g.refs.get_commit(repo, previous.onto_commit_id).metarange_id
    landed = changed_ranges(committed.ranges(onto_mr), committed.ranges(head.metarange_id))
    brought = changed_ranges(committed.ranges(base_mr), committed.ranges(source_mr))
    if not spans_meet(landed, brought):
        return True
    moved = committed.diff(onto_mr, head.metarange_id)
    while batch := list(islice(moved, RESOLVE_BATCH)):
        paths = [change.path for change in batch]
        sources = committed.get_many(source_mr, paths)
        bases = committed.get_many(base_mr, paths)
        taken = [
            (change, base)
            for change, ours, base in zip(batch, sources, bases, strict=True)
            if not _same(ours, base)
        ]
        olds = _base_entries(committed, onto_mr, [change for change, _ in taken])
        if any(not _same(old, base) for (_, base), old in zip(taken, olds, strict=True)):
            return False
    return True


def merged_or_conflict(
    g: Graveler,
    repo: RepositoryRecord,
    base_mr: str,
    source_mr: str,
    head: Commit,
    strategy: str | None,
    sides: tuple[str, str],
) -> str:
    """The metarange of `source_mr` merged onto `head`; `MergeConflict` naming the paths."""
    merged, conflicts = _merge_metaranges(g, repo, base_mr, source_mr, head.metarange_id, strategy)
    if conflicts.count:
        raise MergeConflict(conflicts.paths, conflicts.count, *sides)
    return merged


def _merge_bases(g: Graveler, repo: RepositoryRecord, head: Commit, source: Commit) -> list[Commit]:
    bases = find_merge_bases(g.refs, repo, (head.id,), (source.id,))
    if not bases:
        raise NotFound(
            f"commits {head.id[:12]} and {source.id[:12]} of {repo.name!r} share no ancestor"
        )
    return bases


def base_metarange(g: Graveler, repo: RepositoryRecord, bases: Sequence[Commit]) -> str:
    """The metarange of the merge base: the one best base's, else a virtual base.

    Bases are merged one by one, oldest first, on the bases of each pair, found and merged
    the same way, as git's recursive strategy does. Where two bases disagree the virtual base
    holds a value equal to neither (see `_neither`), so the outer merge sees both sides as
    changes there.
    """
    first, *rest = sorted(bases, key=_age)
    merged, merged_ids = first.metarange_id, [first.id]
    for other in rest:
        inner = find_merge_bases(g.refs, repo, merged_ids, (other.id,))
        inner_mr = base_metarange(g, repo, inner) if inner else EMPTY_METARANGE_ID
        merged, _ = _merge_metaranges(g, repo, inner_mr, other.metarange_id, merged, VIRTUAL_BASE)
        merged_ids.append(other.id)
    return merged


def _age(commit: Commit) -> tuple[datetime, str]:
    return commit.creation_date, commit.id


def ready_destination(
    g: Graveler,
    repo: RepositoryRecord,
    name: str,
    verb: str,
    opened: list[str],
    allow_dirty: bool = False,
) -> tuple[BranchRecord, bytes] | None:
    """The destination and its predicate once nothing is uncommitted on it; `None` if it
    moved meanwhile (try again).

    Staged rewrites of content HEAD holds already are no change, but left staged they would
    hide what the merge brings to their paths. So they are sealed, as a commit seals them,
    checked again (a write may have landed around the seal), and the merge drops them. The
    token the seal opens is appended to `opened` (`commit.releasing`): a merge that finds a
    real change then, or fails later, releases its seal.
    """
    branch, predicate = g.refs.get_branch(repo, name)
    if allow_dirty or not g.has_uncommitted(branch):
        return branch, predicate
    _check_clean(g, repo, branch, verb)
    if g.staging.is_empty(branch.staging_token):
        return branch, predicate
    sealed = sealing(repo, branch)
    if not g.try_update_branch(repo, sealed, predicate):
        return None
    opened.append(sealed.staging_token)
    failpoints.hit("merge.after_seal")
    _check_clean(g, repo, sealed, verb)
    current, predicate = g.refs.get_branch(repo, name)
    return (current, predicate) if current == sealed else None


def _check_clean(g: Graveler, repo: RepositoryRecord, branch: BranchRecord, verb: str) -> None:
    """`DirtyBranch` where the branch shows uncommitted changes; on a branch that takes no
    direct commits (writes acknowledged before it was protected), reset is the way out."""
    if next(iter(uncommitted_changes(g, repo, branch.name)), None) is None:
        return
    rule = protection.decode_stamp(branch.protection).first("no_direct_writes")
    way_out = (
        "commit or reset it"
        if rule is None
        else f"reset it (it takes no direct commits: protected by {rule.pattern!r})"
    )
    raise DirtyBranch(
        f"branch {branch.name!r} of {repo.name!r} has uncommitted changes: {way_out} before {verb}"
    )


def moved_to(branch: BranchRecord, commit_id: str) -> BranchRecord:
    """The destination on its new commit, without what `ready_destination` found to be no
    change (sealed rewrites, a compaction of them)."""
    if not branch.sealed_tokens and not branch.compacted_metarange_id:
        return dataclasses.replace(branch, commit_id=commit_id)
    return branch.uncompacted(commit_id=commit_id, sealed_tokens=())


def _kept_above(
    g: Graveler, repo: RepositoryRecord, branch: BranchRecord, head: Commit, commit: Commit
) -> BranchRecord:
    """The branch on `commit` with its uncommitted changes kept above it (`allow_dirty`): the
    staged tokens as they are, a compacted metarange rebased onto `commit`, its changes from
    the old HEAD winning as staged changes win."""
    compacted = branch.compacted_metarange_id
    if compacted:
        compacted, _ = _merge_metaranges(
            g, repo, head.metarange_id, compacted, commit.metarange_id, "source-wins"
        )
    return dataclasses.replace(branch, commit_id=commit.id, compacted_metarange_id=compacted)


class _Conflicts:
    """The first few conflicting paths and how many there are, in bounded memory."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.count = 0

    def add(self, path: str) -> None:
        self.count += 1
        if len(self.paths) < CONFLICTS_SHOWN:
            self.paths.append(path)


def _merge_metaranges(
    g: Graveler,
    repo: RepositoryRecord,
    base_mr: str,
    source_mr: str,
    dest_mr: str,
    strategy: str | None,
) -> tuple[str, _Conflicts]:
    """The merged metarange, and the conflicts (the metarange is meaningless if any)."""
    conflicts = _Conflicts()
    committed = g.committed(repo)
    changes = _resolved_changes(g, repo, base_mr, source_mr, dest_mr, strategy, conflicts)
    replacements = Replacements.between(committed.ranges(base_mr), committed.ranges(source_mr))
    merged = committed.apply(dest_mr, _until_conflict(changes, conflicts), replacements)
    if conflicts.count:
        for _ in changes:
            pass
    return merged, conflicts


def _resolved_changes(
    g: Graveler,
    repo: RepositoryRecord,
    base_mr: str,
    source_mr: str,
    dest_mr: str,
    strategy: str | None,
    conflicts: _Conflicts,
) -> Iterator[tuple[str, Entry | None]]:
    """Source's changes to apply on the destination; conflicting paths go to `conflicts`.

    Changes are resolved in batches, so the destination and base entries they need are
    looked up range by range (`get_many`) rather than path by path. The diff and `_same`
    compare identities, so a side that rewrote equal content changed nothing: it neither
    conflicts nor wins under a strategy.
    """
    committed = g.committed(repo)
    changes = committed.diff(base_mr, source_mr)
    while batch := list(islice(changes, RESOLVE_BATCH)):
        theirs = committed.get_many(dest_mr, [change.path for change in batch])
        bases = _base_entries(committed, base_mr, batch)
        for change, their, base in zip(batch, theirs, bases, strict=True):
            ours = change.new_entry
            if _same(their, ours):
                continue
            if _same(their, base) or strategy == "source-wins":
                yield change.path, ours
            elif strategy == VIRTUAL_BASE:
                yield change.path, _neither(change.path, base, ours, their)
            elif strategy != "dest-wins":
                conflicts.add(change.path)


def _neither(
    path: str, base: Entry | None, ours: Entry | None, theirs: Entry | None
) -> Entry | None:
    """What a virtual base holds where the merge bases disagree, as in git's recursive
    strategy: the older base's entry where one deleted the path, else an entry equal to
    neither side (git writes conflict markers into it) nor to any entry with content."""
    if ours is None or theirs is None:
        return base
    sides = json.dumps([ours.identity(), theirs.identity()]).encode()
    checksum = _NEITHER_PREFIX + hashlib.sha256(sides).hexdigest()
    return Entry(path, "", 0, checksum, EPOCH)


def _base_entries(
    committed: CommittedStore, base_mr: str, batch: list[Change]
) -> list[Entry | None]:
    """The old side of each change of a diff from `base_mr`: the diff carries it for
    removals, an addition had none, and a changed path's old entry is looked up."""
    changed = [change.path for change in batch if change.type == "changed"]
    old = dict(zip(changed, committed.get_many(base_mr, changed), strict=True))
    return [change.entry if change.type == "removed" else old.get(change.path) for change in batch]


def _until_conflict(
    changes: Iterator[tuple[str, Entry | None]], conflicts: _Conflicts
) -> Iterator[tuple[str, Entry | None]]:
    """Feed `apply` only while the merge can still succeed; after a conflict it is wasted."""
    for item in changes:
        if conflicts.count:
            return
        yield item


def _same(a: Entry | None, b: Entry | None) -> bool:
    if a is None or b is None:
        return a is b
    return a.identity() == b.identity()


def _record(
    g: Graveler,
    repo: RepositoryRecord,
    head: Commit,
    source: Commit,
    attempt: Attempt,
    message: str | None,
    metadata: dict[str, str] | None,
    committer: str,
    strategy: str | None,
) -> Commit:
    """The merge commit: on the destination's HEAD, then the source; the merge bases and the
    strategy recorded."""
    meta = dict(metadata or {})
    meta[BASES_KEY] = ",".join(attempt.bases)
    meta.pop(STRATEGY_KEY, None)
    if strategy:
        meta[STRATEGY_KEY] = strategy
    message = message or f"Merge {source.id[:12]} into {head.id[:12]}"
    claim(g, repo, source.id)
    return g.refs.add_commit(
        repo, (head, source), attempt.metarange_id, message, meta, committer=committer
    )


def _parse_hint(
    g: Graveler, repo: RepositoryRecord, hint: str, source: Commit, strategy: str | None
) -> Attempt | None:
    """The attempt a hint names, once its tag shows this lake made it for a merge of `source`
    with `strategy` (`merge_hint`); its bases are those of the source and the commit it
    merged onto, as that attempt found them. Any other hint (another merge's, one of an
    earlier version without a tag, a forged one) is ignored, with a warning: a hint only
    saves work, and the merge made afresh is the right one."""
    if not isinstance(hint, str):
        raise InvalidArgument(
            f"a merge hint is the text MergeRaceLost.hint gave, not {type(hint).__name__}"
        )
    metarange_id, onto, tag = split_hint(hint) or ("", "", "")
    text = _hint_text(repo, metarange_id, onto, source.id, strategy)
    if not (tag and tag_matches(lake_key(g.refs.kv), text, tag)):
        log.warning(
            "merge hint %r is not the work of this merge of commit %s (strategy %s) in "
            "repository %r: merging afresh",
            hint if len(hint) <= SHOWN_HINT else f"{hint[:SHOWN_HINT]}… ({len(hint):,} characters)",
            source.id[:12],
            strategy or "default",
            repo.name,
        )
        return None
    onto_commit = g.refs.get_commit(repo, onto)
    g.committed(repo).ranges(metarange_id)
    bases = find_merge_bases(g.refs, repo, (onto_commit.id,), (source.id,))
    return Attempt(metarange_id, onto_commit.id, tuple(base.id for base in bases))
