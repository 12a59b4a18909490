"""Which objects a run may delete: the clean run, the optimized run, and why the latter is safe.

**Clean run** (flow 1 of lakeFS's GC design). Prepare first, then read the committed
addresses: an object committed in between is then in the committed listing, while in the
other order it could be missed by both. List every slice opened before the cutoff (`prepare
start - minimum age`); of the objects listed, those modified after the cutoff are too young.
Candidates are the listed objects old enough that are neither committed (C) nor uncommitted
(U).

**Optimized run** (that design's flow 2, corrected). Write `C_j` for the committed addresses
when run `j` lists them (`|` is union, `-` difference). Commits are never deleted, so `C_j`
contains `C_{j-1}`, and `C_j = N_j | C_{j-1}` where `N_j` holds the addresses of the ranges
new since run `j-1` (the only ranges run `j` reads). Each run saves, besides the range and
metarange ids it knows:

- `through_j`, the newest cutoff any run of the chain used (runs consider objects by their
  modification time, each only those newer than `through_{j-1}`, so none twice);
- `P_j` (*pending*): objects it considered that were uncommitted but not committed, to be
  checked again;
- `T_j` (*carry*): committed addresses whose object it did not see with a modification time
  up to `through_j` (young objects, objects in slices it skipped, missing objects):
  `T_j = (N_j | T_{j-1}) - {listed objects modified at or before through_j}`.

*Invariant I*: every address of `C_j` is in `T_j` or is an object modified at or before
`through_j`. It holds after a clean run by construction; if it held for `j-1`, an address of
`C_j` is in `N_j` or in `C_{j-1}`, hence in `N_j | T_{j-1}` or old enough already, and it
leaves the carry only when seen old enough.

Run `j` deletes an object `x` only in two cases, and in both `x` is in neither `C_j` nor
`U_j` and is modified at or before the cutoff: the clean run's condition.

1. `x` is listed with `through_{j-1} < mtime(x) <= cutoff_j`, and is not in
   `N_j | T_{j-1} | U_j`. Were `x` in `C_j`, it would be in `N_j` or in `C_{j-1}`; by I, in
   `T_{j-1}` or modified at or before `through_{j-1}`: neither is the case.
2. `x` is in `P_{j-1}`, not in `N_j | U_j`, and `mtime(x) <= cutoff_j`. Objects enter `P`
   only when not committed (by case 1's argument) and leave it once committed, so `x` is not
   in `C_{j-1}`, nor in `N_j`, hence not in `C_j`.

That design's flow subtracts only the new commits' addresses from the previous uncommitted set.
An address both committed and uncommitted at the previous run (a shallow copy within a branch
made while a commit of its source ran, the copy deleted later) is then in neither the new
commits nor the current uncommitted set, and would be deleted although a commit holds it:
here it never enters `P`. The flow also reads only new commits for objects in new slices; an
object committed before the previous run but too young for it would be deleted: here it is
in `T`.

Which slices an optimized run lists affects only what it finds, never its safety: deleting
needs one of the two cases above. A run lists the slices opened after `through_{j-1}` minus
the late-write window (how long after a slice is opened objects may still land in it), so
when every run is swept, a clean run followed by optimized runs deletes exactly what clean
runs would. The base run must have passed its gate and finished its sweep; without one the
run is clean, and says so.

**With retention** (`engine/gc/runs/retention.py`) a run also has a committed part, which
deletes objects only expired commits hold. The argument above still holds, because its one
assumption is about commit *records*: retention never deletes a commit record, a range or a
metarange, so `C_j` still contains `C_{j-1}` and `N_j` is still what is new. Expired objects
deleted by run `j-1`'s committed part stay in `C_{j-1}` (their ranges still list them) and
in `T` wherever they were: an address in `C` or `T` is only ever subtracted, never a reason
to delete, so a deleted object there only keeps run `j` from deleting it a second time. The
counts (`namespace`) subtract what each sweep deleted, both parts' candidates alike. The
committed part reads its own inputs every run (every active commit's ranges, and the ranges
only expired commits list), never the chain's state, so an optimized base cannot make it
delete an address an active commit holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from branchwater.engine.gc.runs.layout import ADDRESS_PATTERN, named_slices
from branchwater.engine.graveler.committed.format import UTC_MICROS

LISTED = 1
WINDOW = 2
OBSERVED = 4
NEW_COMMITTED = 8
CARRIED = 16
UNCOMMITTED = 32
PENDING = 64
IGNORED = 128
_NAMES = {
    LISTED: "listed",
    NEW_COMMITTED: "committed",
    CARRIED: "carried committed",
    UNCOMMITTED: "uncommitted",
    PENDING: "pending",
    IGNORED: "ignored",
}
READ_BITS = (NEW_COMMITTED, CARRIED, UNCOMMITTED, PENDING)
"""The bits of the sets a run reads (the others describe listed objects)."""
SETS = ("candidates", "pending", "carry")
"""The sets a run writes, in order of precedence: an address is in the first it belongs to."""
COUNTS = (
    "listed",
    "young",
    "ignored",
    "new",
    "considered",
    "committed",
    "uncommitted",
    "candidates",
    "pending",
    "carry",
    "malformed",
    "committed_addresses",
    "uncommitted_addresses",
)
"""What the summary counts (`count_masks`), objects and bytes each; addresses read are
counted without bytes (`ADDRESS_COUNTS`)."""
ADDRESS_COUNTS = ("committed_addresses", "uncommitted_addresses")


@dataclass(frozen=True)
class Window:
    """The modification times a run considers: after `after` (None: all) up to `cutoff`."""

    cutoff: datetime
    after: datetime | None

    @property
    def through(self) -> datetime:
        return self.cutoff if self.after is None else max(self.cutoff, self.after)


def describe(sources: int) -> str:
    """The sets a bit set names, for messages."""
    return ", ".join(name for bit, name in _NAMES.items() if sources & bit) or "none"


def listed_sources(listed: pa.Table, window: Window) -> pa.Array:
    """The bits of listed objects: in the window, observed, or ignored (not an address)."""
    mtime = listed.column("mtime")
    in_window = pc.less_equal(mtime, _time(window.cutoff))
    if window.after is not None:
        in_window = pc.and_kleene(in_window, pc.greater(mtime, _time(window.after)))
    observed = pc.less_equal(mtime, _time(window.through))
    bits = pc.add(
        pc.add(pa.scalar(LISTED, pa.int32()), _bit(in_window, WINDOW)), _bit(observed, OBSERVED)
    )
    ignored = pa.scalar(IGNORED, pa.int32())
    return pc.if_else(pc.fill_null(listed.column("well_formed"), False), bits, ignored)


def combine(listed: pa.Table, found: pa.Table) -> pa.Table:
    """One row per address with the bit set of every set it was found in, the listed
    object's (or the pending entry's) size and mtime, its slice, and `well_formed`.

    `found` has the addresses read, one row each (`union_by_address`); `listed` the listed
    objects (address, sources, size, mtime, slice, well_formed) and `position`, the row of
    `found` with the same address (`lookup`): the listing, the larger side, is looked up in
    the addresses read once, not grouped with them."""
    position = listed.column("position")
    matched = found.take(position)
    zero = pa.scalar(0, pa.int64())
    on_listed = pa.table(
        {
            "address": listed.column("address"),
            "sources": pc.add(
                listed.column("sources").cast(pa.int64()),
                pc.fill_null(matched.column("sources"), zero),
            ),
            "size": pc.max_element_wise(listed.column("size"), matched.column("size")),
            "mtime": _later(listed.column("mtime"), matched.column("mtime")),
            "slice": listed.column("slice"),
            "well_formed": listed.column("well_formed"),
        }
    )
    hit = np.zeros(found.num_rows, dtype=bool)
    hit[position.drop_null().to_numpy()] = True
    unlisted = found.filter(pa.array(~hit))
    address = unlisted.column("address")
    named = named_slices(address)
    well_formed = pc.fill_null(pc.match_substring_regex(address, ADDRESS_PATTERN), False)
    unlisted = unlisted.append_column("slice", named).append_column("well_formed", well_formed)
    return pa.concat_tables([on_listed, unlisted.select(on_listed.column_names)])


def lookup(addresses: pa.ChunkedArray | pa.Array, found: pa.Table) -> pa.Array:
    """The row of `found` holding each address, null where none does."""
    return pc.index_in(addresses, value_set=found.column("address"))


def _later(left: pa.ChunkedArray, right: pa.ChunkedArray) -> pa.ChunkedArray:
    """The later of two times, row by row (Arrow has no element-wise max for them)."""
    later = pc.max_element_wise(left.cast(pa.int64()), right.cast(pa.int64()))
    return later.cast(UTC_MICROS)


def union_by_address(refs: pa.Table) -> pa.Table:
    """One row per address of `refs`, with the union of its bits (one grouping: whether any
    of its rows has each bit, so duplicates within a set count once)."""
    sources = refs.column("sources")
    flags = {
        f"bit{bit}": pc.not_equal(pc.bit_wise_and(sources, pa.scalar(bit, pa.int32())), 0)
        for bit in READ_BITS
    }
    table = pa.table({"address": refs.column("address"), **flags}).append_column(
        "size", refs.column("size")
    )
    table = table.append_column("mtime", refs.column("mtime"))
    grouped = table.group_by("address", use_threads=False).aggregate(
        [(name, "any") for name in flags] + [("size", "max"), ("mtime", "max")]
    )
    union = pa.repeat(pa.scalar(0, pa.int64()), grouped.num_rows)
    for bit in READ_BITS:
        union = pc.add(union, _bit(grouped.column(f"bit{bit}_any"), bit).cast(pa.int64()))
    return pa.table(
        {
            "address": grouped.column("address"),
            "sources": union,
            "size": grouped.column("size_max"),
            "mtime": grouped.column("mtime_max"),
        }
    )


def has(rows: pa.Table, bits: int) -> pa.ChunkedArray:
    """True where the address was found in any of the sets `bits` names."""
    return pc.not_equal(pc.bit_wise_and(rows.column("sources"), pa.scalar(bits, pa.int32())), 0)


def committed(rows: pa.Table) -> pa.ChunkedArray:
    return has(rows, NEW_COMMITTED | CARRIED)


def referenced(rows: pa.Table) -> pa.ChunkedArray:
    return has(rows, NEW_COMMITTED | CARRIED | UNCOMMITTED)


def old_enough(rows: pa.Table, cutoff: datetime) -> pa.ChunkedArray:
    """Modified at or before `cutoff` (null where the time is unknown)."""
    return pc.less_equal(rows.column("mtime"), _time(cutoff))


def candidate(rows: pa.Table, cutoff: datetime) -> pa.ChunkedArray:
    """Case 1 or case 2 of the module docstring."""
    considered = pc.or_kleene(
        has(rows, WINDOW), pc.and_kleene(has(rows, PENDING), old_enough(rows, cutoff))
    )
    return _true(pc.and_kleene(considered, pc.invert(referenced(rows))))


def pending(rows: pa.Table, cutoff: datetime) -> pa.ChunkedArray:
    """Considered now or before, not committed, and either uncommitted or (pending ones)
    still too young for this run's cutoff."""
    from_window = pc.and_(has(rows, WINDOW), has(rows, UNCOMMITTED))
    young = pc.invert(old_enough(rows, cutoff))
    from_pending = pc.and_kleene(has(rows, PENDING), pc.or_kleene(has(rows, UNCOMMITTED), young))
    return _true(pc.and_kleene(pc.or_kleene(from_window, from_pending), pc.invert(committed(rows))))


def carry(rows: pa.Table) -> pa.ChunkedArray:
    return pc.and_(committed(rows), pc.invert(has(rows, OBSERVED)))


def malformed_inputs(rows: pa.Table) -> pa.ChunkedArray:
    """An address the job read (not listed) that is not of the data-address form."""
    read = has(rows, sum(READ_BITS))
    return pc.and_(read, pc.invert(rows.column("well_formed")))


def set_masks(rows: pa.Table, cutoff: datetime) -> dict[str, pa.ChunkedArray]:
    """Each address in at most one of `SETS`, the first it belongs to."""
    masks: dict[str, pa.ChunkedArray] = {}
    taken = None
    for name, mask in (
        ("candidates", candidate(rows, cutoff)),
        ("pending", pending(rows, cutoff)),
        ("carry", carry(rows)),
    ):
        masks[name] = mask if taken is None else pc.and_(mask, pc.invert(taken))
        taken = mask if taken is None else pc.or_(taken, mask)
    return masks


def count_masks(rows: pa.Table, window: Window) -> dict[str, pa.ChunkedArray]:
    """`COUNTS`, each as a mask of the rows it counts."""
    young = _true(pc.invert(old_enough(rows, window.cutoff)))
    listed = has(rows, LISTED)
    not_committed = pc.invert(committed(rows))
    return {
        "listed": listed,
        "young": pc.and_(listed, young),
        "ignored": has(rows, IGNORED),
        "new": has(rows, WINDOW),
        "considered": pc.or_(
            has(rows, WINDOW), pc.and_(has(rows, PENDING), _true(old_enough(rows, window.cutoff)))
        ),
        "committed": pc.and_(listed, committed(rows)),
        "uncommitted": pc.and_(pc.and_(listed, has(rows, UNCOMMITTED)), not_committed),
        "candidates": candidate(rows, window.cutoff),
        "pending": pending(rows, window.cutoff),
        "carry": carry(rows),
        "malformed": malformed_inputs(rows),
        "committed_addresses": has(rows, NEW_COMMITTED),
        "uncommitted_addresses": has(rows, UNCOMMITTED),
    }


def _bit(mask: pa.ChunkedArray | pa.Array, bit: int) -> pa.ChunkedArray:
    zero = pa.scalar(0, pa.int32())
    return pc.if_else(pc.fill_null(mask, False), pa.scalar(bit, pa.int32()), zero)


def _true(mask: pa.ChunkedArray) -> pa.ChunkedArray:
    """SQL's reading of a condition: null is not true."""
    return pc.fill_null(mask, False)


def _time(value: datetime) -> pa.Scalar:
    return pa.scalar(value, UTC_MICROS)
