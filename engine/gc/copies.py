"""Copies within a branch, and the records that keep shallow copies safe from GC (seed:
"Track copied objects in ref-store").

Copying an uncommitted object is shallow: the new entry shares the physical address. Copies
of committed objects are deep: the object is copied to a new address, which the copy's entry
alone keeps alive (a commit is never deleted, so its objects are never uncommitted garbage).
A copy of an imported object shares its external address: GC never collects such objects.

Why a shallow copy is safe against a GC run that started at any moment. The run scans every
branch, then reads the copy records, then every commit. A copy reads `src` (entry e, address
X), writes a record of X, reads `src` again and stages `dst` -> X only if `src` still shows e.

- The record was there when the run read records: X is in the run's uncommitted set.
- It was not: then the second read came after the run had scanned the branch, and still
  found e at `src`. Either e was in the branch's layers when the scan passed `src`, so the
  scan has X (or a commit or compaction took e before the scan got there: the commit is in
  the committed listing, the compacted metarange is followed), or e was staged after the
  scan passed it, by an operation made safe by the same argument, one step earlier.

Without the second read, a second client removing `src` between the copy's first read and
its record, with the run scanning and reading records in that gap, left `dst` -> X seen by
nothing: the race this module once had. A prepare run also scans a branch in path order, so
a copy to a path it already passed followed by deleting the source before the scan reaches
it would hide the object from the scan: the record covers that too, which is why prepare
reads records after all uncommitted entries. Records live for `copy_record_ttl`, longer than
any prepare run, then are swept in the background; a record of a copy that started over
only keeps an object longer. `docs/design/gc.md` ("What a GC run promises to clients that keep
working") holds the argument for every operation.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from branchwater.engine import failpoints
from branchwater.engine.errors import too_many_tries
from branchwater.engine.gc.records import ExpiringRecords, from_millis, to_millis
from branchwater.engine.gc.tokens import Clock, utc_now
from branchwater.engine.graveler import reads, writes
from branchwater.engine.graveler.external import is_external
from branchwater.engine.graveler.graveler import Graveler
from branchwater.engine.graveler.model import Entry, RepositoryRecord
from branchwater.engine.graveler.uploads import write_fresh
from branchwater.engine.kv import Store

if TYPE_CHECKING:
    from branchwater.engine.gc.context import GCContext

COPIES_PREFIX = b"gc/copies/"


@dataclass(frozen=True)
class CopyRecord:
    """A shallow copy of `address` on `branch` at `created`, kept for GC until `expires`."""

    address: str
    branch: str
    created: datetime
    expires: datetime


class CopyTracker:
    def __init__(
        self,
        kv: Store,
        ttl: timedelta,
        clock: Clock = utc_now,
        promising: Callable[[], None] = lambda: None,
    ) -> None:
        """`promising` runs before a record is written (`LakeLimits.cover`)."""
        self.ttl = ttl
        self.clock = clock
        self.promising = promising
        self.store = ExpiringRecords(kv, COPIES_PREFIX)

    def record(self, repo: RepositoryRecord, branch: str, address: str) -> CopyRecord:
        self.promising()
        created = from_millis(to_millis(self.clock()))
        record = CopyRecord(address, branch, created, created + self.ttl)
        value = {"address": address, "branch": branch, "created": to_millis(created)}
        self.store.put(repo, record.expires, uuid.uuid4().hex, json.dumps(value).encode())
        return record

    def records(self, repo: RepositoryRecord) -> Iterator[CopyRecord]:
        """Every stored record, expired ones included (keeping more is always safe)."""
        for stored in self.store.scan(repo):
            value = json.loads(stored.value)
            created = from_millis(value["created"])
            yield CopyRecord(value["address"], value["branch"], created, stored.expires)

    def sweep(self, repo: RepositoryRecord) -> int:
        return self.store.sweep(repo, self.clock())


def copy_entry(
    g: Graveler, gc: GCContext, repo: RepositoryRecord, branch_name: str, src: str, dst: str
) -> Entry:
    """Copy `src` to `dst` on one branch: shallow and recorded when `src` is uncommitted.

    A shallow copy records its address first, then reads `src` again and stages the copy
    only if `src` still shows the entry it copies; otherwise it starts over from what `src`
    shows now (`NotFound` once it shows nothing), as if it had come after that change. The
    second read is what makes the copy safe against a GC run and a second client removing
    `src` (module docstring). A stale record only keeps an object longer. Whether HEAD holds
    the same object at `src` is read apart from the entry itself; a commit in between only
    changes which of two safe kinds of copy is made. Where `dst` already shows `src`'s
    content nothing is copied or staged, as with an upload.
    """
    for _ in range(g.retry.attempts):
        source = reads.get_branch_entry(g, repo, branch_name, src)
        failpoints.hit("copy.after_read")
        current = writes.shown_entry(g, repo, branch_name, dst, source)
        if current is not None:
            return current
        if is_external(source.address):
            copied = source._replace(path=dst)
        elif _is_uncommitted(g, repo, branch_name, source):
            record = gc.copies.record(repo, branch_name, source.address)
            failpoints.hit("copy.after_record")
            if not _still_shown(g, repo, branch_name, source):
                continue
            copied = source._replace(path=dst, mtime=record.created)
        else:
            copied = _deep_copy(g, repo, source, dst, gc.addresses.next_address)
        failpoints.hit("copy.before_stage")
        writes.stage_entry(g, repo, branch_name, copied)
        gc.sweep_later(repo)
        return copied
    raise too_many_tries(
        f"copy of {src!r} to {dst!r} on branch {branch_name!r} of {repo.name!r} "
        f"({src!r} kept changing)",
        g.retry.attempts,
    )


def _still_shown(g: Graveler, repo: RepositoryRecord, branch_name: str, source: Entry) -> bool:
    """Whether the branch still shows `source` at its path, read after its copy record."""
    now = reads.find_branch_entry(g, repo, branch_name, source.path)
    return now is not None and (now.address, now.identity()) == (
        source.address,
        source.identity(),
    )


def _is_uncommitted(g: Graveler, repo: RepositoryRecord, branch_name: str, entry: Entry) -> bool:
    head = g.refs.get_commit(repo, g.read_branch(repo, branch_name).commit_id)
    committed = reads.committed_lookup(g, repo, head.metarange_id, entry.path)
    return committed is None or committed.address != entry.address


def _deep_copy(
    g: Graveler,
    repo: RepositoryRecord,
    source: Entry,
    dst: str,
    next_address: Callable[[], str],
) -> Entry:
    """Stream the object to a new address through its checksum check, so an object larger
    than memory copies and a corrupted one copies nothing; as an upload (`write_fresh`), a
    copy that took long is moved to a fresh stamp before it is staged, and one whose reply
    was lost is `Unavailable`, nothing staged."""
    store = g.objects(repo.storage_namespace)
    with reads.open_object(g, repo, source) as f:
        address, info = write_fresh(
            store,
            f,
            next_address,
            size=source.size,
            writing=f"copying {source.path!r} to {dst!r}",
            again="copy it again",
        )
    return source._replace(path=dst, address=address, mtime=info.mtime)
