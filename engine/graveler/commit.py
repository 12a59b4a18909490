"""The lock-free committer of the metadata-KV design.

1. `set_if` the branch: seal its staging token, open a new one. Writers move on at once.
   A commit that finds another commit's seal under way waits for it first
   (`RetryPolicy.commit_wait`): of two commits building on one base only one can land on
   it, and every seal makes the writes in flight write again. If another waiter seals
   meanwhile, it seals this call's writes too, and once its commit lands they are recorded:
   `AlreadyRecorded` (a `NoChanges` naming the commit that holds them), as for a commit
   whose tokens a concurrent commit absorbed.
2. Apply the sealed tokens (newest wins) on the branch's base: its compacted metarange, else
   HEAD's. This is the slow part and holds no lock.
3. `set_if` the branch to the new commit, removing the tokens it absorbed.

When step 3 loses a race, the branch is re-read. Our tokens still sealed there are what is
left to commit; the others were absorbed by a concurrent commit or compaction, whose result is
the new base. If base and tokens are unchanged, the metarange and the commit record already
written are reused, so a retry costs a read and a `set_if`, not a rebuild. If only a compacted
metarange is left, it is committed as it stands; if nothing is, a concurrent commit took it
all: `AlreadyRecorded`, unless HEAD is still the one the seal was made on or does not descend
from it: `NoChanges`. A branch whose incarnation (`BranchRecord.incarnation`) is no longer the
sealed one was reset or re-created meanwhile, which dropped the tokens: `NoChanges` whatever
HEAD is, as a commit before the reset may or may not have recorded them.

A commit that fails after its seal releases it (`releasing`), so the next commit need not
wait for it; one whose process died is waited for up to `commit_wait`, then sealed beside.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from branchwater.engine import failpoints
from branchwater.engine.errors import AlreadyRecorded, ChangesDropped, NoChanges, too_many_tries
from branchwater.engine.graveler import history, protection
from branchwater.engine.graveler.committed.format import staged_rows
from branchwater.engine.graveler.graveler import Graveler
from branchwater.engine.graveler.iterators import reporting
from branchwater.engine.graveler.model import (
    BranchRecord,
    Commit,
    RepositoryRecord,
    check_commit_arguments,
)
from branchwater.engine.graveler.staging import RELEASE_MARK, new_staging_token, opened_by_commit

log = logging.getLogger(__name__)

Progress = Callable[[int], None]
"""Called with the number of staged entries applied so far."""
PROGRESS_EVERY = 10_000


def commit(
    g: Graveler,
    repo: RepositoryRecord,
    branch_name: str,
    message: str,
    metadata: Mapping[str, str] | None = None,
    *,
    committer: str = "",
    allow_empty: bool = False,
    progress: Progress | None = None,
) -> Commit:
    meta = check_commit_arguments(message, metadata, committer)
    sealed = seal(g, repo, branch_name, allow_empty=allow_empty)
    with releasing(g, repo, branch_name) as opened:
        opened.append(sealed.opened)
        failpoints.hit("commit.after_seal")
        return _finish(
            g, repo, branch_name, sealed, message, meta, committer, allow_empty, progress=progress
        )


JOIN_POLL = 0.1
"""The longest pause between two reads of the branch while a commit waits. The pauses start
short and double, so a waiter behind a quick commit goes on soon after it lands; behind a
slow one (many writers sharing the server's cores) each waiter's reads are statements the
server runs instead of writes: polling every 20 ms cost the writers sharing a branch a
noticeable share of their writes."""


@dataclass(frozen=True)
class Seal:
    """What a commit's seal took: every token the commit is to absorb, newest first, and the
    HEAD they were staged on."""

    tokens: tuple[str, ...]
    commit_id: str
    opened: str
    """The staging token the seal opened: while it is the branch's, the seal is the newest."""
    incarnation: str
    """The branch's incarnation sealed: another one means a reset or re-creation dropped
    the tokens."""


def seal(
    g: Graveler, repo: RepositoryRecord, branch_name: str, *, allow_empty: bool = False
) -> Seal:
    """Seal the staging token (see `Seal`).

    Waits first for a commit under way (`_await_commit`). A call that found one and, once it
    landed, nothing left to commit raises `AlreadyRecorded`: what was written before the
    call is in that commit. `allow_empty` asks for a commit record of its own, so it never
    waits."""
    deadline = time.monotonic() + g.retry.commit_wait
    found: BranchRecord | None = None
    for _ in g.retry:
        branch, predicate = g.refs.get_branch(repo, branch_name)
        protection.check(repo, branch, "commit", "commit")
        if not allow_empty:
            found = found or branch
            branch, predicate = _await_commit(g, repo, branch, predicate, found, deadline)
            protection.check(repo, branch, "commit", "commit")
            if not g.has_uncommitted(branch):
                if _commit_under_way(found) and branch.commit_id != found.commit_id:
                    raise _left(g, repo, branch, found.commit_id, found.incarnation)
                raise NoChanges(f"nothing to commit on branch {branch_name!r} of {repo.name!r}")
        sealed = sealing(repo, branch)
        if g.try_update_branch(repo, sealed, predicate):
            return Seal(
                sealed.sealed_tokens, sealed.commit_id, sealed.staging_token, sealed.incarnation
            )
    raise too_many_tries(f"commit on branch {branch_name!r} of {repo.name!r}", g.retry.attempts)


def _await_commit(
    g: Graveler,
    repo: RepositoryRecord,
    branch: BranchRecord,
    predicate: bytes,
    found: BranchRecord,
    deadline: float,
) -> tuple[BranchRecord, bytes]:
    """The branch once no commit's seal is under way on it, or as it is at `deadline`.

    `found` is the branch as the commit call first read it: every write acknowledged before
    the call is in its staging token or in a token sealed before it. Once another commit
    sealed that token and then landed, taking it and every token below, those writes are
    recorded: `AlreadyRecorded`, unless a reset dropped the token (`_left`). A
    compaction that took it leaves its metarange to commit, so that one is no reason to
    stop; nor is a compaction's seal one to wait for, since compaction gives way to commits.
    """
    pause = g.retry.base_delay
    while True:
        if _recorded(branch, found):
            raise _left(g, repo, branch, found.commit_id, found.incarnation)
        if not _commit_under_way(branch) or time.monotonic() >= deadline:
            return branch, predicate
        failpoints.hit("commit.awaiting")
        time.sleep(max(0.0, min(pause, deadline - time.monotonic())))
        pause = min(2 * pause, JOIN_POLL)
        branch, predicate = g.refs.get_branch(repo, branch.name)


def _commit_under_way(branch: BranchRecord) -> bool:
    """Whether the newest seal is a commit's: a seal is made by whoever opened the token
    above it, here the staging token."""
    return bool(branch.sealed_tokens) and opened_by_commit(branch.staging_token)


@contextmanager
def releasing(g: Graveler, repo: RepositoryRecord, branch_name: str) -> Iterator[list[str]]:
    """Around an operation that seals `branch_name` (a commit; a merge or publish readying
    its destination), which appends to the list yielded the staging token each of its seals
    opened. If it fails (a store error, a conflict, its retries spent), its newest seal is
    released: sealed once more, opening a token marked `RELEASE_MARK`, so the next commit on
    the branch seals at once instead of waiting `commit_wait` for an operation that will never
    land. The tokens stay sealed for that commit to absorb. Only while the failed seal is
    still the newest, and only by `set_if`: a seal made on top since is another commit's,
    which its waiters must wait for. Best effort: if the release fails too, the next commit
    waits as for a committer that died."""
    opened: list[str] = []
    try:
        yield opened
    except BaseException:
        if opened:
            _release(g, repo, branch_name, opened[-1])
        raise


def _release(g: Graveler, repo: RepositoryRecord, branch_name: str, opened: str) -> None:
    try:
        branch, predicate = g.refs.get_branch(repo, branch_name)
        if branch.staging_token == opened and branch.sealed_tokens:
            g.try_update_branch(repo, sealing(repo, branch, mark=RELEASE_MARK), predicate)
    except Exception:
        log.warning("could not release a failed operation's seal on %r", branch_name)


def _recorded(branch: BranchRecord, found: BranchRecord) -> bool:
    """Whether the staging token of `found` left the branch by a commit: neither staging nor
    sealed, no compacted metarange left that could hold it, and a new HEAD."""
    token = found.staging_token
    return (
        token != branch.staging_token
        and token not in branch.sealed_tokens
        and not branch.compacted_metarange_id
        and branch.commit_id != found.commit_id
    )


def _left(
    g: Graveler,
    repo: RepositoryRecord,
    branch: BranchRecord,
    staged_on: str,
    incarnation: str,
) -> NoChanges:
    """The error of a commit whose changes left the branch without it, staged on the commit
    `staged_on` of the branch's `incarnation`. A HEAD that does not descend from it was set
    by a reset to another commit (or a re-creation there), which dropped them: plain
    `NoChanges`. Another incarnation means a reset or re-creation came between, before or
    after any commit of them, so no commit can be named as holding them: plain `NoChanges`
    too. Else a commit that recorded them was made on top of it: `AlreadyRecorded`, naming
    HEAD."""
    moved = branch.commit_id != staged_on
    if moved and not history.is_ancestor(g.refs, repo, staged_on, branch.commit_id):
        return ChangesDropped(
            f"nothing left to commit on branch {branch.name!r} of {repo.name!r}: while this "
            f"commit was under way, the branch was reset to {branch.commit_id[:12]} (or "
            "deleted and re-created there), which dropped its changes"
        )
    if branch.incarnation != incarnation:
        return ChangesDropped(
            f"nothing left to commit on branch {branch.name!r} of {repo.name!r}: the branch "
            "was reset or deleted and re-created while this commit was under way, so its "
            "changes may have been dropped rather than committed; check what HEAD "
            f"({branch.commit_id[:12]}) holds before writing them again"
        )
    return AlreadyRecorded(
        f"nothing left to commit on branch {branch.name!r} of {repo.name!r}: a concurrent "
        f"commit already recorded these changes (HEAD {branch.commit_id} holds them)",
        branch.commit_id,
    )


def sealing(repo: RepositoryRecord, branch: BranchRecord, *, mark: str = "") -> BranchRecord:
    """`branch` with its staging token pushed onto the sealed tokens and a new one open
    (ending in `mark`, see `new_staging_token`): the first `set_if` of a commit and of a
    compaction."""
    return dataclasses.replace(
        branch,
        staging_token=new_staging_token(repo, branch.name, mark=mark),
        sealed_tokens=(branch.staging_token, *branch.sealed_tokens),
    )


@dataclass(frozen=True)
class Applied:
    """What applying sealed tokens on a base metarange produced, and what it took."""

    metarange_id: str
    entries: int
    """Staged entries written (new or replacing)."""
    tombstones: int
    """Staged deletes applied (each removes its path, or is a no-op where it is absent)."""
    ranges_written: int
    """Ranges of the result that the base did not have."""
    ranges_reused: int
    """Ranges of the base the result references unchanged."""


STAGED_BATCH = 8192
"""Staged rows turned into Arrow at once on their way to ranges."""


def apply_sealed(
    g: Graveler,
    repo: RepositoryRecord,
    base: str,
    head: str,
    tokens: tuple[str, ...],
    progress: Progress | None = None,
) -> Applied:
    """Apply staging tokens (newest first; the newest wins a path) on the metarange `base`,
    judging identity against HEAD's metarange `head` (see `CommittedStore.apply_rows`): the
    one path from staged rows to ranges, shared by commit and compaction. Staged values go
    to Arrow undecoded, a batch at a time, so no entry becomes a Python object."""
    rows = g.staging.batches(tokens, STAGED_BATCH)
    batches: Iterable[pa.Table] = map(staged_rows, rows)
    if progress is not None:
        batches = reporting(batches, progress, PROGRESS_EVERY, size=_rows)
    tally = _Tally()
    committed = g.committed(repo)
    metarange_id = committed.apply_rows(base, tally.count(batches), head)
    before = {info.range_id for info in committed.ranges(base)}
    after = [info.range_id for info in committed.ranges(metarange_id)]
    reused = sum(1 for range_id in after if range_id in before)
    return Applied(metarange_id, tally.entries, tally.tombstones, len(after) - reused, reused)


def _rows(batch: pa.Table) -> int:
    return batch.num_rows


class _Tally:
    """Counts entries and tombstones of change-row batches as `apply` consumes them."""

    def __init__(self) -> None:
        self.entries = 0
        self.tombstones = 0

    def count(self, batches: Iterable[pa.Table]) -> Iterator[pa.Table]:
        for batch in batches:
            deleted = pc.sum(batch.column("deleted")).as_py() or 0
            self.tombstones += deleted
            self.entries += batch.num_rows - deleted
            yield batch


@dataclass(frozen=True)
class _Reading:
    """One read of the branch at the final step: what a commit on it would absorb and where."""

    branch: BranchRecord
    predicate: bytes
    parent: Commit
    base: str
    remaining: tuple[str, ...]
    """The commit's tokens the branch still has sealed; a concurrent commit or compaction
    absorbed the others."""

    @property
    def plan(self) -> tuple[str, str, tuple[str, ...]]:
        """What the metarange to commit depends on: equal plans build equal metaranges."""
        return (self.base, self.parent.metarange_id, self.remaining)


def _finish(
    g: Graveler,
    repo: RepositoryRecord,
    branch_name: str,
    sealed: Seal,
    message: str,
    metadata: dict[str, str],
    committer: str,
    allow_empty: bool,
    *,
    progress: Progress | None = None,
) -> Commit:
    """Step 3, retried until the `set_if` wins. After a build (the slow part) the branch is
    read again, so the `set_if` is not judged on a read as old as the build: with cheap
    retries, that is what keeps a commit live among compactors that move the branch every few
    milliseconds."""
    built: tuple[tuple[str, str, tuple[str, ...]], str] | None = None
    recorded: Commit | None = None
    head: Commit | None = None
    for _ in g.retry:
        at = _read(g, repo, branch_name, sealed, head)
        if built is None or built[0] != at.plan:
            built = (at.plan, _build(g, repo, at, progress))
            failpoints.hit("commit.after_ranges")
            at = _read(g, repo, branch_name, sealed, at.parent)
        head = at.parent
        if at.plan != built[0]:
            continue
        metarange_id = built[1]
        rest = tuple(t for t in at.branch.sealed_tokens if t not in at.remaining)
        if metarange_id == at.parent.metarange_id and not allow_empty:
            if _clear(g, repo, at.branch, at.predicate, rest, at.remaining):
                raise NoChanges(f"nothing to commit on branch {branch_name!r} of {repo.name!r}")
            continue
        if recorded is None or (recorded.parents, recorded.metarange_id) != (
            (at.parent.id,),
            metarange_id,
        ):
            recorded = g.refs.add_commit(
                repo, (at.parent,), metarange_id, message, metadata, committer=committer
            )
        updated = at.branch.uncompacted(commit_id=recorded.id, sealed_tokens=rest)
        failpoints.hit("commit.before_set")
        if g.update_branch_dropping(repo, updated, at.predicate, at.remaining):
            failpoints.hit("commit.after_set")
            return recorded
    raise too_many_tries(f"commit on branch {branch_name!r} of {repo.name!r}", g.retry.attempts)


def _read(
    g: Graveler,
    repo: RepositoryRecord,
    branch_name: str,
    sealed: Seal,
    known: Commit | None = None,
) -> _Reading:
    """The branch as the final step sees it. Another incarnation than the sealed one means
    a reset or re-creation dropped the commit's tokens, and a compacted metarange on it holds
    other writes: `_left`. With none of the tokens left and no compacted metarange that could
    hold them (`_compaction_holds`), a concurrent commit recorded them (`_left`), unless HEAD
    is still the one they were staged on: then a concurrent commit found they changed
    nothing. `known` is a commit
    read before: commit records never change, so HEAD is not read again while it is that
    one."""
    branch, predicate = g.refs.get_branch(repo, branch_name)
    protection.check(repo, branch, "commit", "commit")
    if branch.incarnation != sealed.incarnation:
        raise _left(g, repo, branch, sealed.commit_id, sealed.incarnation)
    remaining = tuple(t for t in sealed.tokens if t in branch.sealed_tokens)
    if not remaining and not _compaction_holds(branch, sealed):
        if branch.commit_id == sealed.commit_id:
            raise NoChanges(
                f"nothing left to commit on branch {branch_name!r} of {repo.name!r}: while "
                "this commit was under way, a concurrent commit found they changed nothing"
            )
        raise _left(g, repo, branch, sealed.commit_id, sealed.incarnation)
    if known is None or known.id != branch.commit_id:
        known = g.refs.get_commit(repo, branch.commit_id)
    return _Reading(branch, predicate, known, branch.base(known.metarange_id), remaining)


def _compaction_holds(branch: BranchRecord, sealed: Seal) -> bool:
    """Whether the branch's compacted metarange may hold the sealed tokens: its lineage began
    with one of them or an older one (sealed before them, so in `sealed.tokens` too). One
    begun with a later token was begun after a commit recorded them (or found they changed
    nothing) and holds later writes only. Unknown lineage (a record from before
    `compacted_from`): assumed to."""
    if not branch.compacted_metarange_id:
        return False
    return branch.compacted_from is None or branch.compacted_from in sealed.tokens


def _build(g: Graveler, repo: RepositoryRecord, at: _Reading, progress: Progress | None) -> str:
    """The metarange to commit. With none of its tokens left, a compaction absorbed them all
    and its metarange is the commit's as it stands."""
    if not at.remaining:
        return at.base
    applied = apply_sealed(g, repo, at.base, at.parent.metarange_id, at.remaining, progress)
    return applied.metarange_id


def _clear(
    g: Graveler,
    repo: RepositoryRecord,
    branch: BranchRecord,
    predicate: bytes,
    rest: tuple[str, ...],
    absorbed: tuple[str, ...],
) -> bool:
    """Remove absorbed tokens that changed nothing; False if the branch moved meanwhile."""
    cleared = branch.uncompacted(sealed_tokens=rest)
    return g.update_branch_dropping(repo, cleared, predicate, absorbed)
