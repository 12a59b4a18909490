"""The writer flow of the metadata-KV design.

Write to the branch's staging token, then re-read the branch: if a commit sealed the token
meanwhile, write again to the new one. Writing the same entry twice is idempotent, so a write
that made it into the sealed token as well is harmless. No step waits on a commit.
"""

from __future__ import annotations

from collections.abc import Callable

from branchwater.engine.errors import NotFound, too_many_tries
from branchwater.engine.graveler.checksums import holds
from branchwater.engine.graveler.graveler import Graveler
from branchwater.engine.graveler.model import BranchRecord, Entry, Metadata, RepositoryRecord
from branchwater.engine.graveler.reads import find_branch_entry, lookup_below_staging


def unchanged_entry(
    g: Graveler,
    repo: RepositoryRecord,
    branch_name: str,
    path: str,
    data: bytes,
    checksum: str,
    metadata: Metadata,
) -> Entry | None:
    """The entry the branch shows at `path` if it already is `data` with `metadata`: then a
    write would change nothing, so a retried task writes no object and stages nothing."""
    current = find_branch_entry(g, repo, branch_name, path)
    if current is not None and holds(current, data, checksum, metadata):
        return current
    return None


def stage_entry(g: Graveler, repo: RepositoryRecord, branch_name: str, entry: Entry) -> None:
    """Stage `entry` at its path; acknowledged only once it is in the current token."""

    def write(branch: BranchRecord) -> None:
        g.staging.put(branch.staging_token, entry.path, entry)

    _write_validated(g, repo, branch_name, write, f"write of {entry.path!r}")


def stage_delete(g: Graveler, repo: RepositoryRecord, branch_name: str, path: str) -> None:
    """Delete `path`: a tombstone where a lower layer has it, else just drop the staged entry."""

    def write(branch: BranchRecord) -> None:
        below = lookup_below_staging(g, repo, branch, path)
        if below is not None:
            g.staging.put(branch.staging_token, path, None)
            return
        found, staged = g.staging.get(branch.staging_token, path)
        if not found or staged is None:
            raise NotFound(f"path {path!r} not found on branch {branch_name!r} of {repo.name!r}")
        g.staging.remove(branch.staging_token, path)

    _write_validated(g, repo, branch_name, write, f"delete of {path!r}")


def _write_validated(
    g: Graveler,
    repo: RepositoryRecord,
    branch_name: str,
    write: Callable[[BranchRecord], None],
    what: str,
) -> None:
    branch = g.read_branch(repo, branch_name, cached=True)
    for _ in range(g.retry.attempts):
        write(branch)
        current = g.read_branch(repo, branch_name)
        if current.staging_token == branch.staging_token:
            return
        branch = current
    raise too_many_tries(f"{what} on branch {branch_name!r} of {repo.name!r}", g.retry.attempts)
