"""Revert and cherry-pick: one commit's changes against a parent, undone or applied again on
a branch, as git does.

Both are a three-way merge onto the branch's HEAD through `merge.land` (its retry loop,
lost-race reuse and `set_if`): a revert merges the parent's tree with the reverted commit as
base, a cherry-pick the commit's tree with the parent as base. So later unrelated changes
survive, a path both sides changed differently conflicts, and entries are read from commits
only (never from a branch's uncommitted layers), which keeps them in GC's merge row.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from branchwater.engine.errors import InvalidArgument, MergeConflict, NoChanges, too_many_tries
from branchwater.engine.graveler import protection
from branchwater.engine.graveler.committed import EMPTY_METARANGE_ID
from branchwater.engine.graveler.fence import claim
from branchwater.engine.graveler.graveler import Graveler
from branchwater.engine.graveler.merge import (
    Attempt,
    MergeResult,
    land,
    merged_or_conflict,
    reuse_is_exact,
)
from branchwater.engine.graveler.model import (
    BranchRecord,
    Commit,
    RepositoryRecord,
    check_commit_arguments,
)

Kind = Literal["revert", "cherry-pick"]
REVERT_KEY = "branchwater.revert"
"""Revert commit metadata: the id of the commit reverted."""
CHERRY_PICK_KEY = "branchwater.cherry_pick"
"""Cherry-pick commit metadata: the id of the commit picked."""
PARENT_KEY = "branchwater.parent"
"""Set beside either key for a merge commit: the parent number (1 or 2) changes were taken
against, as git's `-m`."""
_KEYS: dict[Kind, str] = {"revert": REVERT_KEY, "cherry-pick": CHERRY_PICK_KEY}


def pick(
    g: Graveler,
    repo: RepositoryRecord,
    kind: Kind,
    branch: str,
    commit_ref: str,
    *,
    parent: int | None = None,
    message: str | None = None,
    metadata: dict[str, str] | None = None,
    committer: str = "",
    allow_dirty: bool = False,
) -> MergeResult:
    """Revert or cherry-pick the commit `commit_ref` names onto the branch `branch`."""
    meta = check_commit_arguments(message or "", metadata, committer)
    commit = g.refs.get_commit(repo, g.refs.resolve(repo, commit_ref).commit_id)
    taken_against = _parent(g, repo, commit, parent)
    parent_tree = EMPTY_METARANGE_ID if taken_against is None else taken_against.metarange_id
    if kind == "revert":
        base, theirs = commit.metarange_id, parent_tree
        default = f"Revert {commit.id[:12]}: {_first_line(commit.message)}"
        sources = (commit.id,) if taken_against is None else (commit.id, taken_against.id)
    else:
        base, theirs = parent_tree, commit.metarange_id
        default = f"{_first_line(commit.message)} (cherry picked from {commit.id[:12]})"
        sources = (commit.id,)
    meta[_KEYS[kind]] = commit.id
    if parent is not None:
        meta[PARENT_KEY] = str(parent)
    plan = _PickPlan(
        kind,
        (commit_ref, branch),
        base,
        theirs,
        sources,
        message or default,
        meta,
        committer,
        allow_dirty,
    )
    try:
        return land(g, repo, branch, plan)
    except MergeConflict as conflict:
        doing = "reverting" if kind == "revert" else "cherry-picking"
        what = f"{doing} {commit_ref!r} on {branch!r}"
        raise MergeConflict(
            conflict.paths, conflict.count, commit_ref, branch, operation=what
        ) from None


def _parent(
    g: Graveler, repo: RepositoryRecord, commit: Commit, parent: int | None
) -> Commit | None:
    """The parent changes are taken against: a merge commit's needs naming (1 or 2, as git's
    `-m`); a first commit has none (its changes are taken against the empty tree). A commit
    of one parent takes `parent=1` too, as git 2.21 does, so a script may always pass it."""
    count = len(commit.parents)
    if count > 1 and parent is None:
        raise InvalidArgument(
            f"commit {commit.id[:12]} is a merge of {count} parents: pass parent=1..{count} "
            "to say which side's changes to take"
        )
    if (count == 0 and parent is not None) or (count == 1 and parent not in (None, 1)):
        raise InvalidArgument(
            f"commit {commit.id[:12]} is not a merge: pass no parent, or 1 for its own "
            f"(got parent={parent!r})"
        )
    if parent is None:
        if not commit.parents:
            return None
        return g.refs.get_commit(repo, commit.parents[0])
    if isinstance(parent, bool) or not isinstance(parent, int) or not 1 <= parent <= count:
        raise InvalidArgument(f"parent must be a number from 1 to {count}, not {parent!r}")
    return g.refs.get_commit(repo, commit.parents[parent - 1])


def _first_line(message: str) -> str:
    return (message.splitlines() or [""])[0]


@dataclass(frozen=True)
class _PickPlan:
    """A revert or cherry-pick for `land`: never a fast-forward, a commit on HEAD alone."""

    kind: Kind
    sides: tuple[str, str]
    base: str
    theirs: str
    sources: tuple[str, ...]
    """The commits whose entries the result may take, claimed before it is recorded: a
    revert's parent (whose tree it brings back) as well as the commit reverted."""
    message: str
    metadata: dict[str, str]
    committer: str
    allow_dirty: bool
    strategy: str | None = None

    @property
    def verb(self) -> str:
        return f"a {self.kind} onto it (or allow_dirty)"

    def guard(self, g: Graveler, repo: RepositoryRecord, branch: BranchRecord) -> None:
        """A revert or cherry-pick is a direct commit: a protected branch takes it only
        through a merge (revert on another branch, then merge it in), as lakeFS's revert
        bypassing protection (its issues 8617, 10029) showed it must."""
        what = f"{self.kind} of {self.sides[0]!r} on {self.sides[1]!r}"
        protection.check(repo, branch, "commit", what)

    def first(self, g: Graveler, repo: RepositoryRecord, head: Commit) -> Attempt:
        merged = merged_or_conflict(g, repo, self.base, self.theirs, head, None, self.sides)
        return Attempt(merged, head.id, ())

    def reuses_exactly(
        self, g: Graveler, repo: RepositoryRecord, head: Commit, previous: Attempt
    ) -> bool:
        """Its base and source trees do not depend on HEAD: `reuse_is_exact` alone judges."""
        return reuse_is_exact(g, repo, previous, head, self.base, self.theirs)

    def record(self, g: Graveler, repo: RepositoryRecord, head: Commit, at: Attempt) -> Commit:
        """The commit on HEAD; `NoChanges` when HEAD already holds the result (the changes
        were undone, or picked, before)."""
        if at.metarange_id == head.metarange_id:
            raise NoChanges(
                f"{self.kind} of {self.sides[0]!r} changes nothing on {self.sides[1]!r}"
            )
        claim(g, repo, *self.sources)
        return g.refs.add_commit(
            repo, (head,), at.metarange_id, self.message, self.metadata, committer=self.committer
        )

    def gave_up(
        self, g: Graveler, repo: RepositoryRecord, attempts: int, last: Attempt | None
    ) -> Exception:
        what = f"{self.kind} of {self.sides[0]!r} onto {self.sides[1]!r} of {repo.name!r}"
        return too_many_tries(what, attempts)
