"""Transactions on a branch: writes staged on a branch of their own, landed as one commit.

**Flow.** `begin` checks the commit's arguments and the branch's protection, then creates
`tx/<hex>` from the branch's HEAD (the *origin*); every write of the transaction stages
there, and reads there see them. `land` commits that branch (`transaction.before_commit`),
then lands its changes on the target through the merge's retry loop (`merge.land`,
`transaction.before_merge`): the changes from the origin to that commit, merged three-way
onto the target's HEAD as a cherry-pick is, in one commit whose only parent is that HEAD
(the transaction's own commit when HEAD is still the origin, so nothing is written twice).
Its metadata names the transaction (`branchwater.transaction`). `abort` deletes the branch.
Either way the transaction's branch is gone once it returns.

**Concurrent writers.** The target is never written before the landing's `set_if`. Commits
others land meanwhile are merged with: a path both changed differently raises
`MergeConflict` and nothing lands. Changes others staged on the target stay staged above
the new commit (`allow_dirty`, as an import keeps them); one at a path the transaction also
changed, to something else, would hide its change, so it is a `MergeConflict` too. That
check reads the target's staging before the `set_if`, which staged writes do not move: a
write staged at such a path while the landing runs stays above it, as a write staged just
after it would.

**GC.** Objects the transaction writes are staged on its branch, so GC protects them as any
staged object (prepare lists every branch's staging); once committed there they are held by
that branch's commit, and once landed by the target's, before the branch is deleted. An
upload not yet staged is younger than any GC cutoff, as every upload is. What lands is the
tree of the transaction's own commit, its branch's HEAD until then, so retention never
expires what the landing brings: unlike a merge of an old commit it needs no fence claim
(`fence.py`); the branch it starts from is claimed as any branch creation claims.

**A killed process.** Killed inside the block or before the landing's `set_if`, the target
is as it was and `tx/<hex>` is left, holding the writes (staged, or in its commit): read
them there, or delete the branch (`Repository.delete_branch`); until then GC keeps its
objects. Killed after the `set_if`, the target holds the landed commit (its metadata names
the branch) and deleting the leftover loses nothing. Running the transaction again starts
a new branch from the current HEAD, unaffected by a leftover: content already landed is no
change (an upload of it writes nothing), so a retried transaction lands only what is missing.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Mapping
from contextlib import suppress
from dataclasses import dataclass, field

from branchwater.engine import failpoints
from branchwater.engine.errors import (
    InvalidArgument,
    MergeConflict,
    NoChanges,
    NotFound,
    too_many_tries,
)
from branchwater.engine.graveler import branches, commit, protection
from branchwater.engine.graveler import merge as merge_ops
from branchwater.engine.graveler.graveler import Graveler
from branchwater.engine.graveler.merge import (
    CONFLICTS_SHOWN,
    Attempt,
    _same,
    merged_or_conflict,
    reuse_is_exact,
)
from branchwater.engine.graveler.model import (
    Change,
    Commit,
    RepositoryRecord,
    check_commit_arguments,
)
from branchwater.engine.graveler.reads import uncommitted_changes

PREFIX = "tx/"
"""Transactions' branches are `tx/<hex>`; one that outlives its process was left by a kill."""
TRANSACTION_KEY = "branchwater.transaction"
"""Landed commit metadata: the name of the transaction's branch."""
DEFAULT_MESSAGE = "Transaction"


@dataclass
class Transaction:
    """A started transaction: `branch` takes its writes; `message`, `metadata` and
    `committer` (checked again when it lands) describe the commit it lands."""

    repo: RepositoryRecord
    target: str
    branch: str
    origin: str
    message: str = DEFAULT_MESSAGE
    metadata: dict[str, str] = field(default_factory=dict)
    committer: str = ""


def begin(
    g: Graveler,
    repo: RepositoryRecord,
    target: str,
    message: str = DEFAULT_MESSAGE,
    metadata: Mapping[str, str] | None = None,
    committer: str = "",
) -> Transaction:
    """Start a transaction on `target`; refused before anything is written if its commit's
    arguments are bad or the branch's protection forbids direct commits."""
    meta = _arguments(message, metadata, committer)
    record, _ = g.refs.get_branch(repo, target)
    protection.check(repo, record, "commit", f"a transaction on {target!r}")
    name = f"{PREFIX}{uuid.uuid4().hex}"
    created = branches.create_branch(g, repo, name, record.commit_id)
    return Transaction(repo, target, name, created.commit_id, message, meta, committer)


def land(g: Graveler, tx: Transaction) -> Commit | None:
    """Land what the transaction staged as one commit on its target (None if that changes
    nothing there), then delete its branch; on any error the branch is deleted and the
    target is as it was (see the module docstring)."""
    try:
        meta = _arguments(tx.message, tx.metadata, tx.committer)
        meta[TRANSACTION_KEY] = tx.branch
        failpoints.hit("transaction.before_commit")
        try:
            own = commit.commit(g, tx.repo, tx.branch, tx.message, meta, committer=tx.committer)
        except NoChanges:
            return None
        failpoints.hit("transaction.before_merge")
        plan = _TransactionPlan(tx, own, meta)
        try:
            return merge_ops.land(g, tx.repo, tx.target, plan).commit
        except NoChanges:
            return None
        except MergeConflict as conflict:
            what = f"landing transaction {tx.branch!r} on {tx.target!r}"
            raise MergeConflict(
                conflict.paths, conflict.count, tx.branch, tx.target, operation=what
            ) from None
    finally:
        abort(g, tx)


def abort(g: Graveler, tx: Transaction) -> None:
    """Delete the transaction's branch: nothing it staged was ever on the target."""
    with suppress(NotFound):
        branches.delete_branch(g, tx.repo, tx.branch)


def _arguments(message: object, metadata: object, committer: object) -> dict[str, str]:
    meta = check_commit_arguments(message, metadata, committer)
    if not str(message).strip():
        raise InvalidArgument("a transaction needs a non-empty commit message")
    return meta


@dataclass(frozen=True)
class _TransactionPlan:
    """A transaction for `merge.land`: the changes from its origin to its own commit, merged
    onto HEAD in a commit on HEAD alone; changes staged on the target stay above it."""

    tx: Transaction
    own: Commit
    metadata: dict[str, str]
    strategy: str | None = None
    allow_dirty: bool = True
    verb: str = "a transaction lands on it"

    @property
    def sides(self) -> tuple[str, str]:
        return (self.tx.branch, self.tx.target)

    def first(self, g: Graveler, repo: RepositoryRecord, head: Commit) -> Attempt:
        if head.id == self.tx.origin:
            return Attempt(self.own.metarange_id, head.id, ())
        origin = g.refs.get_commit(repo, self.tx.origin)
        merged = merged_or_conflict(
            g, repo, origin.metarange_id, self.own.metarange_id, head, None, self.sides
        )
        return Attempt(merged, head.id, ())

    def reuses_exactly(
        self, g: Graveler, repo: RepositoryRecord, head: Commit, previous: Attempt
    ) -> bool:
        """Its changes (origin to its own commit) do not depend on HEAD: `reuse_is_exact`
        alone judges."""
        origin = g.refs.get_commit(repo, self.tx.origin)
        own = self.own.metarange_id
        return reuse_is_exact(g, repo, previous, head, origin.metarange_id, own)

    def record(self, g: Graveler, repo: RepositoryRecord, head: Commit, at: Attempt) -> Commit:
        """The transaction's own commit while HEAD is its origin, else a new one on HEAD;
        refused where a change staged on the target would hide one of the transaction's."""
        if at.metarange_id == head.metarange_id:
            raise NoChanges(f"{self.tx.target!r} already holds every change of {self.sides[0]!r}")
        origin = g.refs.get_commit(repo, self.tx.origin)
        ours = g.committed(repo).diff(origin.metarange_id, self.own.metarange_id)
        clashes = list(_clashes(ours, uncommitted_changes(g, repo, self.tx.target)))
        if clashes:
            raise MergeConflict(clashes[:CONFLICTS_SHOWN], len(clashes), *self.sides)
        if head.id == self.tx.origin:
            return self.own
        return g.refs.add_commit(
            repo,
            (head,),
            at.metarange_id,
            self.tx.message,
            self.metadata,
            committer=self.tx.committer,
        )

    def gave_up(
        self, g: Graveler, repo: RepositoryRecord, attempts: int, last: Attempt | None
    ) -> Exception:
        what = f"transaction {self.tx.branch!r} landing on {self.tx.target!r} of {repo.name!r}"
        return too_many_tries(what, attempts)


def _clashes(ours: Iterator[Change], theirs: Iterator[Change]) -> Iterator[str]:
    """Paths both change lists hold (each in path order) with different outcomes."""
    a, b = next(ours, None), next(theirs, None)
    while a is not None and b is not None:
        if a.path < b.path:
            a = next(ours, None)
        elif b.path < a.path:
            b = next(theirs, None)
        else:
            if not _same(a.new_entry, b.new_entry):
                yield a.path
            a, b = next(ours, None), next(theirs, None)
