"""Three-way merge of commits, and merge-with-retry that reuses its own work (seed 003).

A merge applies to the destination the changes that turn the merge base into the source:
`diff(base, source)` skips every range the source left alone, and `apply` references every
destination range no change falls into, so the cost follows the size of the change.

When the final `set_if` loses a race, the retry merges *the metarange this attempt produced*
(source') on the new destination HEAD, with the destination it merged against as base'. Then
`diff(base', source')` is only what this merge brought in, and the ranges it wrote are
reused. The seed's correctness table holds because deletion behaves like unique content.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Literal

from branchwater.engine.errors import (
    DirtyBranch,
    InvalidArgument,
    MergeConflict,
    MergeRaceLost,
    NoChanges,
    too_many_tries,
)
from branchwater.engine.graveler.committed import CommittedStore, Replacements
from branchwater.engine.graveler.graveler import Graveler
from branchwater.engine.graveler.history import find_merge_base
from branchwater.engine.graveler.model import BranchRecord, Change, Commit, Entry, RepositoryRecord

Strategy = Literal["source-wins", "dest-wins"]
STRATEGIES: tuple[str, ...] = ("source-wins", "dest-wins")
CONFLICTS_SHOWN = 20
RESOLVE_BATCH = 4096
"""Changes resolved together: bounds memory, and amortises each range lookup over many."""


@dataclass(frozen=True)
class MergeResult:
    commit: Commit
    attempts: int
    fast_forward: bool = False


@dataclass(frozen=True)
class _Attempt:
    """What one attempt produced: the merged metarange and the destination it merged onto."""

    metarange_id: str
    onto_commit_id: str

    @property
    def hint(self) -> str:
        return f"{self.metarange_id}@{self.onto_commit_id}"


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
) -> MergeResult:
    """Merge `source_ref` into the branch `destination`; see the module docstring."""
    if strategy is not None and strategy not in STRATEGIES:
        raise InvalidArgument(f"unknown merge strategy {strategy!r}: use one of {STRATEGIES}")
    source = g.refs.get_commit(repo, g.refs.resolve(repo, source_ref).commit_id)
    previous = _parse_hint(g, repo, hint) if hint else None
    for attempt in g.retry:
        branch, predicate = g.refs.get_branch(repo, destination)
        _check_clean(g, repo, destination, branch)
        head = g.refs.get_commit(repo, branch.commit_id)
        if previous is None:
            base = find_merge_base(g.refs, repo, head.id, source.id)
            if base.id == source.id:
                raise NoChanges(f"{destination!r} already contains {source_ref!r}")
            if base.id == head.id:
                forwarded = dataclasses.replace(branch, commit_id=source.id)
                if g.try_update_branch(repo, forwarded, predicate):
                    return MergeResult(source, attempt, fast_forward=True)
                continue
            base_mr, source_mr = base.metarange_id, source.metarange_id
        else:
            base_mr = g.refs.get_commit(repo, previous.onto_commit_id).metarange_id
            source_mr = previous.metarange_id
        merged = _merge_metaranges(
            g, repo, base_mr, source_mr, head, strategy, source_ref, destination
        )
        previous = _Attempt(merged, head.id)
        new_commit = _record(g, repo, head, source, merged, message, metadata, committer, strategy)
        updated = dataclasses.replace(branch, commit_id=new_commit.id)
        if g.try_update_branch(repo, updated, predicate):
            return MergeResult(new_commit, attempt)
    what = f"merge of {source_ref!r} into {destination!r} of {repo.name!r}"
    if previous is None:
        raise too_many_tries(what, g.retry.attempts)
    raise MergeRaceLost(what, g.retry.attempts, previous.hint)


def _check_clean(g: Graveler, repo: RepositoryRecord, name: str, branch: BranchRecord) -> None:
    if g.has_uncommitted(branch):
        raise DirtyBranch(
            f"branch {name!r} of {repo.name!r} has uncommitted changes: commit or reset it "
            "before merging into it"
        )


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
    head: Commit,
    strategy: str | None,
    source_ref: str,
    destination: str,
) -> str:
    conflicts = _Conflicts()
    committed = g.committed(repo)
    changes = _resolved_changes(g, repo, base_mr, source_mr, head.metarange_id, strategy, conflicts)
    replacements = Replacements.between(committed.ranges(base_mr), committed.ranges(source_mr))
    merged = committed.apply(head.metarange_id, _until_conflict(changes, conflicts), replacements)
    if conflicts.count:
        for _ in changes:
            pass
        raise MergeConflict(conflicts.paths, conflicts.count, source_ref, destination)
    return merged


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
    looked up range by range (`get_many`) rather than path by path.
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
            elif strategy != "dest-wins":
                conflicts.add(change.path)


def _base_entries(
    committed: CommittedStore, base_mr: str, batch: list[Change]
) -> list[Entry | None]:
    """The base side of each change: the diff carries it for removals, an addition had none,
    and a changed path's old entry is looked up."""
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
    metarange_id: str,
    message: str | None,
    metadata: dict[str, str] | None,
    committer: str,
    strategy: str | None,
) -> Commit:
    """The merge commit: on the destination's HEAD, then the source; the strategy recorded."""
    meta = dict(metadata or {})
    if strategy:
        meta["branchwater.merge.strategy"] = strategy
    message = message or f"Merge {source.id[:12]} into {head.id[:12]}"
    return g.refs.add_commit(repo, (head, source), metarange_id, message, meta, committer=committer)


def _parse_hint(g: Graveler, repo: RepositoryRecord, hint: str) -> _Attempt:
    metarange_id, sep, onto = hint.partition("@")
    if not sep or not metarange_id or not onto:
        raise InvalidArgument(f"merge hint {hint!r} is not of the form <metarange>@<commit>")
    g.refs.get_commit(repo, onto)
    g.committed(repo).ranges(metarange_id)
    return _Attempt(metarange_id, onto)
