"""The writer flow of the metadata-KV design.

Write to the branch's staging token, then re-read the branch: if a commit sealed the token
meanwhile, write again to the new one. Writing the same entry twice is idempotent, so a write
that made it into the sealed token as well is harmless. The row and the re-read are one KV
call (`Graveler.stage`, one statement on PostgreSQL). No step waits for a commit to finish
(but an exclusive creation's over a sealed tombstone, `create_entry`): on PostgreSQL a write
and a commit's seal wait at most for each other's one statement.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

from branchwater.engine import failpoints
from branchwater.engine.errors import (
    BranchProtected,
    NotFound,
    PathExists,
    PredicateFailed,
    too_many_tries,
)
from branchwater.engine.graveler import protection
from branchwater.engine.graveler.checksums import holds
from branchwater.engine.graveler.graveler import Graveler
from branchwater.engine.graveler.model import (
    BranchRecord,
    Entry,
    Metadata,
    RepositoryRecord,
    encode_entry,
)
from branchwater.engine.graveler.reads import Look, committed_lookup, find_branch_look, look_up


def unchanged_entry(
    g: Graveler,
    repo: RepositoryRecord,
    branch_name: str,
    path: str,
    size: int,
    checksum: str,
    metadata: Metadata,
    legacy_md5: Callable[[], str] | None = None,
) -> Entry | None:
    """The entry the branch shows at `path` if it already is that content (`size` bytes,
    `checksum`, see `holds`) with `metadata`: then a write would change nothing, so a retried
    task writes no object and stages nothing."""
    current = _kept_entry(g, repo, branch_name, path)
    if current is not None and holds(current, size, checksum, metadata, legacy_md5):
        return current
    return None


def shown_entry(
    g: Graveler, repo: RepositoryRecord, branch_name: str, path: str, entry: Entry
) -> Entry | None:
    """The entry the branch shows at `path` if it has `entry`'s identity: then staging
    `entry` (a link, a copy) would change nothing, so a retried task stages nothing."""
    current = _kept_entry(g, repo, branch_name, path)
    if current is not None and current.identity() == entry.identity():
        return current
    return None


def _kept_entry(g: Graveler, repo: RepositoryRecord, branch_name: str, path: str) -> Entry | None:
    """What the branch shows at `path` if the branch is sure to keep it: not a sealed token's
    row, which may be another writer's late write that the commit absorbing the token missed
    (a write skipped for it could then vanish with it)."""
    look = find_branch_look(g, repo, branch_name, path)
    return None if look.from_sealed_token else look.value


def stage_entry(g: Graveler, repo: RepositoryRecord, branch_name: str, entry: Entry) -> None:
    """Stage `entry` at its path; acknowledged only once it is in the current token. The
    staged value is encoded (and checked) by the write itself; only a take-back needs it."""

    def write(branch: BranchRecord) -> BranchRecord:
        return g.stage(repo, branch_name, branch.staging_token, entry.path, entry)

    def undo(token: str) -> None:
        _take_back(g, token, entry.path, encode_entry(entry))

    def shown() -> bool:
        look = find_branch_look(g, repo, branch_name, entry.path).value
        return look is not None and (look.address, look.identity()) == (
            entry.address,
            entry.identity(),
        )

    _write_validated(g, repo, branch_name, write, f"write of {entry.path!r}", _Undo(undo, shown))


def create_entry(g: Graveler, repo: RepositoryRecord, branch_name: str, entry: Entry) -> None:
    """Stage `entry` only where the branch shows nothing at its path: an exclusive creation
    (S3's `If-None-Match: *`); `PathExists` where it shows something.

    The branch is read, the path looked up in the layers that record names, and the row
    created in its staging token only while the record is still the one read and the token
    holds no row at the path but a tombstone (`Store.create_guarded`, one atomic step). A
    seal, commit, compaction or `protect` in between changes the record, and the look is
    made again. So of two creations of one path only one succeeds: the later look sees the
    earlier row, in the staging token or, sealed since, below it, or the later creation
    finds the row. A sealed token's row counts as shown even if it may be a late write: it
    may be another creation's. A sealed token's tombstone decides nothing until its commit
    lands (waited for up to `commit_wait`): it may be a late write of a delete still under
    way, which would then tombstone the created row, so the delete would have come both
    before and after the creation. Unpaced between lost races, as a lookup is."""
    what = f"creation of {entry.path!r}"
    guard = g.refs.branch_address(repo, branch_name)
    deadline = time.monotonic() + g.retry.commit_wait
    pause = g.retry.base_delay
    lost = 0
    while lost < g.retry.attempts:
        branch, predicate = g.refs.get_branch(repo, branch_name)
        protection.check(repo, branch, "write", what)
        look = look_up(g, repo, branch, entry.path)
        if look.value is not None:
            raise path_exists(repo, branch_name, entry.path)
        if look.from_sealed_token and time.monotonic() < deadline:
            failpoints.hit("write.awaiting_commit")
            time.sleep(pause)
            pause = min(2 * pause, SEALED_POLL)
            continue
        failpoints.hit("write.before_create")
        try:
            created = g.staging.create_guarded(
                branch.staging_token, entry.path, entry, guard, predicate
            )
        except PredicateFailed:
            lost += 1
            continue
        if not created:
            raise path_exists(repo, branch_name, entry.path)
        return
    raise too_many_tries(f"{what} on branch {branch_name!r} of {repo.name!r}", g.retry.attempts)


SEALED_POLL = 0.1
"""The longest pause between two looks of a creation waiting for a commit to land."""


def path_exists(repo: RepositoryRecord, branch_name: str, path: str) -> PathExists:
    return PathExists(
        f"path {path!r} exists on branch {branch_name!r} of {repo.name!r}: an exclusive "
        "creation (if_absent) writes only a path the branch does not show"
    )


def stage_delete(g: Graveler, repo: RepositoryRecord, branch_name: str, path: str) -> None:
    """Delete `path`: drop its staged row where nothing lies below it (`_drop_staged_only`),
    else write a tombstone to the current token.

    A sealed token's tombstone is not taken to mean the path is gone (`NotFound`): it may be
    a late write, of a delete stopped before its validating read, that the commit absorbing
    the token never read; this delete writes its own tombstone instead.
    """
    look = find_branch_look(g, repo, branch_name, path)
    if look.value is None and not look.from_sealed_token:
        raise NotFound(f"path {path!r} not found on branch {branch_name!r} of {repo.name!r}")
    if _drop_staged_only(g, repo, branch_name, path, look):
        return

    def write(branch: BranchRecord) -> BranchRecord:
        return g.stage(repo, branch_name, branch.staging_token, path, None)

    def undo(token: str) -> None:
        _take_back(g, token, path, b"")

    def shown() -> bool:
        return find_branch_look(g, repo, branch_name, path).value is None

    _write_validated(g, repo, branch_name, write, f"delete of {path!r}", _Undo(undo, shown))


def _drop_staged_only(
    g: Graveler, repo: RepositoryRecord, branch_name: str, path: str, look: Look
) -> bool:
    """Drop the current token's row of a path the branch's base lacks, on a branch with no
    sealed token: a tombstone there would hide the path from an import or a transaction
    landing it before the next commit, where git and lakeFS show it. The drop holds only
    while the branch record is the one read (`StagingArea.remove_guarded`, one atomic
    step): a commit's seal comes wholly before it, and nothing is dropped (the delete then
    writes its tombstone), or wholly after it, and the commit reads the token without the
    row. Dropped unguarded, a row the commit had read already could come back with it once
    a delete stopped before its retry (history seed 37). Whether it dropped the row; a
    path the look found below the current token costs no further read."""
    if look.base is not None or len(look.tokens) != 1:
        return False
    branch, predicate = g.refs.get_branch(repo, branch_name)
    if branch.sealed_tokens or look.tokens != (branch.staging_token,):
        return False
    protection.check(repo, branch, "write", f"delete of {path!r}")
    if committed_lookup(g, repo, g.base_metarange(repo, branch), path) is not None:
        return False
    guard = g.refs.branch_address(repo, branch_name)
    return g.staging.remove_guarded(branch.staging_token, path, guard, predicate)


class _Undo(NamedTuple):
    """How a staged write that raced a `protect` takes itself back: `take_back(token)` for
    each token it wrote to, then `shown()`: whether the branch shows its result anyway (a
    commit that landed before the protect absorbed it), which makes it a success."""

    take_back: Callable[[str], None]
    shown: Callable[[], bool]


def _take_back(g: Graveler, token: str, path: str, value: bytes) -> None:
    """Remove the staged row at `path` if it still holds `value`, what this write put there
    (a later writer's row is theirs: any such writer raced the protect too and takes back
    its own). A row this write replaced within the same token is not brought back: the path
    then shows what lies below the token."""
    try:
        current, _ = g.kv.get(token.encode(), path.encode())
    except NotFound:
        return
    if current == value:
        g.kv.delete(token.encode(), path.encode())


def _write_validated(
    g: Graveler,
    repo: RepositoryRecord,
    branch_name: str,
    write: Callable[[BranchRecord], BranchRecord],
    what: str,
    undo: _Undo,
) -> None:
    """Run `write` until it lands in the branch's current staging token; `write` returns the
    branch record as read once its row was in (`Graveler.stage`: the row and the read in
    one statement on PostgreSQL). Unpaced, as a lookup is: a pause before writing to the
    token just read would only give a commit longer to seal it.

    Protection rules are read from the same records, so a staged write costs no extra
    round trip: the first read (perhaps cached; a cached record that refuses is read again)
    refuses early, and the read that comes with the row decides. That read is the write's
    linearization point: a `protect` whose fence of the branch comes before it wins, and
    the write takes its rows back and raises `BranchProtected`."""
    branch = g.read_branch(repo, branch_name, cached=True)
    if branch.protection:
        branch = g.read_branch(repo, branch_name)
    protection.check(repo, branch, "write", what)
    failpoints.hit("write.before_stage")
    tokens: list[str] = []
    for _ in range(g.retry.attempts):
        current = write(branch)
        tokens.append(branch.staging_token)
        failpoints.hit("write.before_validate")
        try:
            protection.check(repo, current, "write", what)
        except BranchProtected:
            for token in tokens:
                undo.take_back(token)
            if current.staging_token != tokens[-1] and undo.shown():
                return
            raise
        if current.staging_token == branch.staging_token:
            return
        branch = current
    raise too_many_tries(f"{what} on branch {branch_name!r} of {repo.name!r}", g.retry.attempts)
