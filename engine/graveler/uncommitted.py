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
from itertools import repeat

import pyarrow as pa
import pyarrow.compute as pc

from branchwater.engine.graveler.committed.format import (
    decode_entries,
    identities_differ,
    staged_rows,
)
from branchwater.engine.graveler.committed.writer import live_rows
from branchwater.engine.graveler.graveler import Graveler
from branchwater.engine.graveler.model import BranchRecord, Change, ChangeType, RepositoryRecord

BATCH = 4096
"""Staged rows joined with HEAD at once: one vectorised pass per HEAD range they touch."""


def uncommitted_from(
    g: Graveler, repo: RepositoryRecord, branch: BranchRecord, after: str = ""
) -> Iterator[Change]:
    """The branch's changes against HEAD with path > `after`, in path order, lazily."""
    committed = g.committed(repo)
    head = g.refs.get_commit(repo, branch.commit_id).metarange_id
    tokens = (branch.staging_token, *branch.sealed_tokens)
    staged = g.staging.batches(tokens, BATCH, after)
    compacted = branch.compacted_metarange_id
    settled = _Settled(committed.diff(head, compacted, after=after) if compacted else iter(()))
    while True:
        batch = next(staged, [])
        changes: list[Change] = []
        paths: list[str] = []
        if batch:
            rows = staged_rows(batch)
            paths = rows.column("path").to_pylist()
            changes = _staged_changes(committed.rows_at(head, paths), rows)
        last = len(batch) < BATCH
        changes += settled.take(None if last else paths[-1], paths)
        changes.sort(key=_path)
        yield from changes
        if last:
            return


class _Settled:
    """The changes compaction already applied, taken in step with the staged batches."""

    def __init__(self, changes: Iterator[Change]) -> None:
        self._changes = changes
        self._head = next(changes, None)

    def take(self, through: str | None, staged: list[str]) -> list[Change]:
        """The changes up to path `through` (all if None) that no `staged` path hides."""
        taken = []
        while self._head is not None and (through is None or self._head.path <= through):
            taken.append(self._head)
            self._head = next(self._changes, None)
        if taken and staged:
            hidden = set(staged)
            taken = [change for change in taken if change.path not in hidden]
        return taken


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
    """Changes of one kind, built in C like the entries they carry."""
    paths = rows.column("path").to_pylist()
    changes = zip(paths, repeat(kind, len(paths)), decode_entries(rows), strict=True)
    return list(map(tuple.__new__, repeat(Change), changes))


def _path(change: Change) -> str:
    return change.path
