"""Uncommitted changes at streaming speed: the staged layers merge-joined against HEAD.

The staged layers (newest first) and, on a compacted branch, the 2-way diff from HEAD to the
compacted metarange (ranges with equal ids skipped) are merged by path; a staged path hides
the diff's change for it. The staged rows are then joined with HEAD's a batch at a time, in
Arrow: HEAD ranges that hold none of a batch's paths are never opened, no row is decoded to
be compared, and only the changes found become `Change`s. A listing of changes costs a scan
of the staged rows plus the HEAD ranges they fall into, and a page costs about one batch.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice

import pyarrow as pa
import pyarrow.compute as pc

from branchwater.engine.graveler.committed import CommittedStore
from branchwater.engine.graveler.committed.diff import identities_differ
from branchwater.engine.graveler.committed.format import decode_entries, staged_rows
from branchwater.engine.graveler.committed.writer import live_rows
from branchwater.engine.graveler.graveler import Graveler
from branchwater.engine.graveler.iterators import combine, overlay
from branchwater.engine.graveler.model import BranchRecord, Change, ChangeType, RepositoryRecord

BATCH = 1024
"""Staged paths joined with HEAD at once: one vectorised pass per HEAD range they touch."""

_Item = tuple[str, bytes | None, Change | None]


def uncommitted_from(
    g: Graveler, repo: RepositoryRecord, branch: BranchRecord, after: str = ""
) -> Iterator[Change]:
    """The branch's changes against HEAD with path > `after`, in path order, lazily."""
    committed = g.committed(repo)
    head = g.refs.get_commit(repo, branch.commit_id).metarange_id
    tokens = (branch.staging_token, *branch.sealed_tokens)
    staged = combine([g.staging.scan_raw(token, after) for token in tokens])
    compacted = branch.compacted_metarange_id
    settled = committed.diff(head, compacted, after=after) if compacted else iter(())
    items = overlay(staged, settled)
    while batch := list(islice(items, BATCH)):
        yield from _join(committed, head, batch)


def _join(committed: CommittedStore, head: str, batch: list[_Item]) -> list[Change]:
    """The changes of one batch: settled ones as they are, staged ones against HEAD."""
    changes = [known for _, _, known in batch if known is not None]
    staged = [(path, value) for path, value, known in batch if value is not None]
    if staged:
        paths, values = zip(*staged, strict=True)
        changes += _staged_changes(committed.rows_at(head, paths), staged_rows(paths, values))
    changes.sort(key=_path)
    return changes


def _staged_changes(base: pa.Table, rows: pa.Table) -> list[Change]:
    """Staged change rows against HEAD's rows at their paths: deletes of what HEAD holds
    ("removed"), entries HEAD lacks ("added") or holds as another object ("changed")."""
    deleted = rows.column("deleted")
    gone = pc.is_in(base.column("path"), value_set=rows.filter(deleted).column("path"))
    changes = _changes("removed", base.filter(gone))
    written = live_rows(rows)
    at = pc.index_in(written.column("path"), value_set=base.column("path"))
    found = pc.is_valid(at)
    changes += _changes("added", written.filter(pc.invert(found)))
    before, after = base.take(at.filter(found)), written.filter(found)
    return changes + _changes("changed", after.filter(identities_differ(before, after)))


def _changes(kind: ChangeType, rows: pa.Table) -> list[Change]:
    return [Change(entry.path, kind, entry) for entry in decode_entries(rows)]


def _path(change: Change) -> str:
    return change.path
