"""The metarange writer: sorted rows and reusable ranges in, content-defined ranges out.

Where a range ends depends only on the rows (see `RangePolicy`), so whatever mix of new
entries, rewritten ranges and ranges reused by id a writer is given, it stores the ranges a
from-scratch write of the same entries gives. That is what keeps apply and merge ids equal
to a full rewrite's while they touch only the ranges that change.
"""

from __future__ import annotations

import operator
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from concurrent.futures import Future
from itertools import islice

import pyarrow as pa
import pyarrow.compute as pc

from branchwater.engine.errors import InvalidArgument
from branchwater.engine.graveler.committed.format import (
    RangeInfo,
    RangePolicy,
    boundary_indexes,
    boundary_rows,
    build_range,
    count_below,
    entry_sizes,
    identities_differ,
    path_at,
)
from branchwater.engine.graveler.committed.storage import RangeStorage
from branchwater.engine.graveler.model import Entry

ChangeItem = tuple[str, Entry | None]
"""A change to apply: the path and its new entry, or `None` to delete it."""

_BATCH = 8192
"""Entries converted to Arrow at once: enough to amortise a conversion, far below a range."""


class MetarangeWriter:
    """Streams sorted rows (and reusable ranges) into ranges of `storage`, then one metarange.

    Pending rows are Arrow slices, at most one range of them. Rows come from entries
    (`add_entries`), from a stored range with changes applied (`add_changed_range`), or whole
    ranges by id (`try_reuse`); whatever the mix, the ranges are those a from-scratch write
    of the same entries gives. A writer that raised must be discarded.

    Full ranges are stored on a background thread (see `_RangeStores`) while the next is
    built; `close` waits for them before it stores the metarange that names them.
    """

    def __init__(self, storage: RangeStorage, policy: RangePolicy) -> None:
        self._storage = storage
        self._policy = policy
        self._stores = _RangeStores(storage)
        self._rows: list[RangeInfo | Future[RangeInfo]] = []
        self._chunks: list[pa.Table] = []
        self._count = 0
        self._size = 0
        self._last = ""
        self._closed = False
        self._final = False
        self.ranges_written = 0
        """Ranges this writer stored (a range already in storage is not stored again)."""
        self.ranges_reused = 0
        """Ranges appended by id, without being read or rebuilt."""

    def add_entries(self, entries: Iterable[Entry]) -> None:
        """Append entries in strictly increasing path order, a batch at a time."""
        self._check_open()
        iterator = iter(entries)
        while batch := list(islice(iterator, _BATCH)):
            paths = [entry[0] for entry in batch]
            _check_increasing(paths)
            self._add_rows(build_range(batch), boundary_indexes(paths, self._policy.target_entries))

    def add_rows(self, rows: pa.Table) -> None:
        """Append range rows whose paths strictly increase (the caller checked) and follow
        everything added so far."""
        self._check_open()
        self._add_rows(rows, boundary_rows(rows.column("path"), self._policy.target_entries))

    def add_changed_range(
        self, table: pa.Table, changes: pa.Table, *, keep_equal: bool = True
    ) -> None:
        """Append a range stored under this policy with sorted change rows inside its bounds
        applied (`format.CHANGE_SCHEMA`), in one vectorised pass: a rewrite costs about the
        same for one change as for thousands. A change to an entry of the same identity keeps
        the stored row (unless `keep_equal` is false): rewriting equal content is no change,
        so the range id stays too.

        No row of a stored range but its last can satisfy the hash rule (it would have ended
        the range), so only that one and the new entries are hashed. A range with no change
        inside (the last one, where a commit appends past it: the commonest commit) is
        carried over as it stands, with neither a filter nor a sort.
        """
        self._check_open()
        kept, added = _surviving(table, changes, keep_equal)
        if not kept.num_rows and not added.num_rows:
            return
        hits = [kept.num_rows - 1] if kept.num_rows and self._ends_range(table, kept) else []
        new_hits = boundary_rows(added.column("path"), self._policy.target_entries)
        hits += [kept.num_rows + hit for hit in new_hits]
        if kept.num_rows and added.num_rows and not path_at(added, 0) > path_at(kept, -1):
            rows, hits = _merged(kept, added, hits)
        else:
            rows = pa.concat_tables([kept, added])
        self._add_rows(rows, hits)

    def _ends_range(self, table: pa.Table, kept: pa.Table) -> bool:
        """Whether the stored range's last row survived and satisfies the hash rule."""
        last = path_at(table, table.num_rows - 1)
        return path_at(kept, kept.num_rows - 1) == last and self._policy.is_boundary(last)

    def can_reuse(self, info: RangeInfo, *, final: bool = False) -> bool:
        """Whether `try_reuse(info, final=final)` would append the range."""
        self._check_open()
        if self._count or info.min_key <= self._last:
            return False
        return final or self._policy.closes(info)

    def try_reuse(self, info: RangeInfo, *, final: bool = False) -> bool:
        """Append an existing range by id if that equals writing its entries; else False and
        the caller must add the range's rows instead.

        `final` promises nothing follows: then a range need not end on a policy boundary
        (the last range of a metarange usually does not), because input ending there cuts it
        just the same. The writer refuses anything added after a final range.
        """
        if not self.can_reuse(info, final=final):
            return False
        self._rows.append(info)
        self._last = info.max_key
        self._final = final
        self.ranges_reused += 1
        return True

    def close(self) -> str:
        """Store the last range and the metarange; return the metarange id."""
        if self._closed:
            raise InvalidArgument("this MetarangeWriter is closed already")
        if self._count:
            self._flush()
        self._closed = True
        self.ranges_written = self._stores.close()
        rows = [row if isinstance(row, RangeInfo) else row.result() for row in self._rows]
        return self._storage.put_metarange(rows)

    def _add_rows(self, table: pa.Table, hits: Sequence[int]) -> None:
        """Append sorted rows; `hits` are the row indexes that satisfy the hash rule."""
        first = path_at(table, 0)
        if not first > self._last:
            raise order_error(first, self._last)
        self._last = path_at(table, table.num_rows - 1)
        sizes = entry_sizes(table)
        pending_hits = deque(hits)
        start = 0
        while start < table.num_rows:
            while pending_hits and pending_hits[0] < start:
                pending_hits.popleft()
            cut = self._next_cut(sizes, start, pending_hits[0] if pending_hits else None)
            stop = table.num_rows if cut is None else cut + 1
            self._chunks.append(table.slice(start, stop - start))
            self._count += stop - start
            self._size += pc.sum(sizes.slice(start, stop - start)).as_py()
            if cut is not None:
                self._flush()
            start = stop

    def _next_cut(self, sizes: pa.Array, start: int, hit: int | None) -> int | None:
        """The first row from `start` after which the policy ends the pending range, if any:
        the next hash hit, the entry cap, or the byte cap, whichever comes first."""
        by_count = start + self._policy.max_entries - self._count - 1
        rules = [i for i in (hit, by_count) if i is not None and i < len(sizes)]
        limit = min(rules, default=len(sizes) - 1)
        running = pc.cumulative_sum(sizes.slice(start, limit - start + 1))
        room = self._policy.max_bytes - self._size
        over = pc.index(pc.greater_equal(running, room), True).as_py()
        if over >= 0:
            return start + over
        return limit if rules else None

    def _flush(self) -> None:
        table = pa.concat_tables(self._chunks).combine_chunks()
        self._rows.append(self._stores.put(table, self._count, self._size))
        self._chunks.clear()
        self._count = self._size = 0

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidArgument("this MetarangeWriter is closed; start a new one")
        if self._final:
            raise InvalidArgument("nothing can follow a range reused as final")


class _RangeStores:
    """Stores a writer's ranges on its storage's background threads, at most `_IN_FLIGHT`
    waiting.

    Hashing a range (SHA-256 of large buffers), encoding and compressing its Parquet file and
    writing it out all release the GIL, so they overlap with building the next range; on S3
    each range also waits on its conditional PUT, and those overlap one another.
    """

    def __init__(self, storage: RangeStorage) -> None:
        self._storage = storage
        self._pending: deque[Future[RangeInfo]] = deque()
        self._written = 0
        self._counting = threading.Lock()

    def put(self, table: pa.Table, count: int, size: int) -> Future[RangeInfo]:
        """Store the range in the background; its `RangeInfo` once it is stored."""
        while len(self._pending) >= _IN_FLIGHT:
            self._settled(self._pending.popleft())
        stored = self._storage.storing.submit(self._store, table, count, size)
        self._pending.append(stored)
        return stored

    def close(self) -> int:
        """Wait for every range; return how many were written (not stored already)."""
        while self._pending:
            self._settled(self._pending.popleft())
        return self._written

    def _settled(self, stored: Future[RangeInfo]) -> RangeInfo:
        """The range once stored; if storing failed, the ranges queued after it are
        cancelled, since the writer is discarded."""
        try:
            return stored.result()
        except BaseException:
            for queued in self._pending:
                queued.cancel()
            raise

    def _store(self, table: pa.Table, count: int, size: int) -> RangeInfo:
        range_id, written = self._storage.put_range(table)
        with self._counting:
            self._written += written
        first, last = path_at(table, 0), path_at(table, table.num_rows - 1)
        return RangeInfo(range_id, first, last, count, size)


_IN_FLIGHT = 4
"""Ranges stored in the background at once: the writer runs ahead of storage by at most
this many ranges of memory."""


def _surviving(stored: pa.Table, changes: pa.Table, keep_equal: bool) -> tuple[pa.Table, pa.Table]:
    """The stored rows no change touches and the changes' new rows, less the rewrites of
    equal content where `keep_equal`."""
    added = live_rows(changes).cast(stored.schema)
    if not changes.num_rows:
        return stored, added
    touched = changes.column("path")
    rewritten = _rewritten_paths(stored, added) if keep_equal else pa.array([], pa.string())
    if len(rewritten):
        touched = touched.filter(pc.invert(pc.is_in(touched, value_set=rewritten)))
        added = added.filter(pc.invert(pc.is_in(added.column("path"), value_set=rewritten)))
    gone = pc.is_in(stored.column("path"), value_set=touched)
    if not pc.any(gone).as_py():
        return stored, added
    return stored.filter(pc.invert(gone)), added


def _merged(kept: pa.Table, added: pa.Table, hits: list[int]) -> tuple[pa.Table, list[int]]:
    """`kept` and `added` (each in path order, no path in both) as one table in path order,
    with the `hits` row indexes (of the two concatenated) carried to their new places.

    New rows go in as blocks, each the run of them between two neighbouring kept rows: appends
    under a few prefixes inside the range (writers' own prefixes on one branch) are a block a
    prefix, found in two vectorised passes each. New rows scattered among the kept ones are
    sorted in instead, once blocks would cost more passes than the sort."""
    paths, new_paths = kept.column("path"), added.column("path")
    blocks: list[tuple[int, int, int]] = []
    start = 0
    while start < added.num_rows:
        if len(blocks) == _MAX_BLOCKS:
            return _sorted(pa.concat_tables([kept, added]), hits)
        at = count_below(paths, path_at(added, start))
        stop = added.num_rows if at == kept.num_rows else count_below(new_paths, path_at(kept, at))
        blocks.append((at, start, stop))
        start = stop
    pieces, previous = [], 0
    for at, first, stop in blocks:
        pieces += [kept.slice(previous, at - previous), added.slice(first, stop - first)]
        previous = at
    pieces.append(kept.slice(previous))
    return pa.concat_tables(pieces), sorted(_moved(hit, kept.num_rows, blocks) for hit in hits)


def _moved(hit: int, size: int, blocks: list[tuple[int, int, int]]) -> int:
    """Where row `hit` of `kept` + `added` (`size` kept rows) lands among the blocks: a kept
    row after the new rows inserted at or before it, a new row after the kept rows before
    its block and the new rows before it."""
    if hit >= size:
        new = hit - size
        return next(at + new for at, first, stop in blocks if first <= new < stop)
    return hit + sum(stop - first for at, first, stop in blocks if at <= hit)


_MAX_BLOCKS = 16
"""Blocks of new rows worth finding one by one (two passes over the range each) before a
sort of the whole range is cheaper."""


def _sorted(rows: pa.Table, hits: list[int]) -> tuple[pa.Table, list[int]]:
    """`rows` in path order, with the `hits` row indexes carried to their new places."""
    flags = [False] * rows.num_rows
    for hit in hits:
        flags[hit] = True
    rows = rows.append_column("hit", pa.array(flags, pa.bool_()))
    rows = rows.take(pc.sort_indices(rows.column("path")))
    return rows.drop_columns(["hit"]), pc.indices_nonzero(rows.column("hit")).to_pylist()


def _rewritten_paths(stored: pa.Table, new_rows: pa.Table) -> pa.Array:
    """Paths whose new row has the identity of the stored row, found in one probe of the
    stored paths against the (smaller) set of new ones."""
    if not new_rows.num_rows or not stored.num_rows:
        return pa.array([], pa.string())
    position = pc.index_in(stored.column("path"), value_set=new_rows.column("path"))
    present = pc.is_valid(position)
    old = stored.filter(present)
    new = new_rows.take(position.filter(present))
    same = pc.invert(identities_differ(old, new))
    return old.column("path").filter(same).combine_chunks()


def live_rows(changes: pa.Table) -> pa.Table:
    """The range rows of change rows that are not deletes."""
    return changes.filter(pc.invert(changes.column("deleted"))).drop_columns(["deleted"])


def order_error(path: str, last: str) -> InvalidArgument:
    """The error for a path that does not follow `last` in strictly increasing order."""
    if not isinstance(path, str) or not path:
        return InvalidArgument(f"entry path must be a non-empty string, not {path!r}")
    return InvalidArgument(f"entries must be sorted by path, no repeats: {path!r} after {last!r}")


def _check_increasing(paths: list[str]) -> None:
    """Within a batch; `_add_rows` checks the seam with what came before."""
    try:
        if all(map(operator.lt, paths, islice(paths, 1, None))):
            return
    except TypeError:
        pass
    bad = next(i for i in range(1, len(paths)) if not _is_above(paths[i], paths[i - 1]))
    raise order_error(paths[bad], paths[bad - 1])


def _is_above(path: object, previous: object) -> bool:
    return isinstance(path, str) and isinstance(previous, str) and path > previous
