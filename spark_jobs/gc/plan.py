"""Which objects a run may delete: the clean run, the optimized run, and why the latter is safe.

**Clean run** (seed flow 1). Prepare first, then read the committed addresses: an object
committed in between is then in the committed listing, while in the other order it could be
missed by both. List every slice opened before the cutoff (`prepare start - minimum age`);
of the objects listed, those modified after the cutoff are too young. Candidates are the
listed objects old enough that are neither committed (C) nor uncommitted (U).

**Optimized run** (seed flow 2, corrected). Write `C_j` for the committed addresses when run
`j` lists them (`|` is union, `-` difference). Commits are never deleted, so `C_j` contains
`C_{j-1}`, and `C_j = N_j | C_{j-1}` where `N_j` holds the addresses of the ranges new since
run `j-1` (the only ranges run `j` reads). Each run saves, besides the range and metarange
ids it knows:

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

The seed's flow subtracts only the new commits' addresses from the previous uncommitted set.
An address both committed and uncommitted at the previous run (a shallow copy within a branch
made while a commit of its source ran, the copy deleted later) is then in neither the new
commits nor the current uncommitted set, and would be deleted although a commit holds it:
here it never enters `P`. The seed also reads only new commits for objects in new slices; an
object committed before the previous run but too young for it would be deleted: here it is
in `T`.

Which slices an optimized run lists affects only what it finds, never its safety: deleting
needs one of the two cases above. A run lists the slices opened after `through_{j-1}` minus
the late-write window (how long after a slice is opened objects may still land in it), so
when every run is swept, a clean run followed by optimized runs deletes exactly what clean
runs would. The base run must have passed its gate and finished its sweep; without one the
run is clean, and says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from pyspark import StorageLevel
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from branchwater.spark_jobs.gc.layout import ADDRESS_PATTERN

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

_ROW = "address string, size long, mtime timestamp, slice string, sources int"


@dataclass(frozen=True)
class Window:
    """The modification times a run considers: after `after` (None: all) up to `cutoff`."""

    cutoff: datetime
    after: datetime | None

    @property
    def through(self) -> datetime:
        return self.cutoff if self.after is None else max(self.cutoff, self.after)


@dataclass
class Inputs:
    """The address sets one run combines; a clean run has no carry and no pending."""

    listed: DataFrame
    new_committed: DataFrame
    uncommitted: DataFrame
    carry: DataFrame | None
    pending: DataFrame | None


def has(bits: int) -> Column:
    """True where the address was found in any of the sets `bits` names."""
    return (F.col("sources").bitwiseAND(F.lit(bits))) != 0


def describe(sources: int) -> str:
    """The sets a bit set names, for messages."""
    return ", ".join(name for bit, name in _NAMES.items() if sources & bit) or "none"


def combine(inputs: Inputs, window: Window) -> DataFrame:
    """One row per address with the bit set of where it was found (one shuffle), the listed
    object's size, mtime and slice, and a `well_formed` flag; persisted. Listed keys that are
    not of the address form are only counted (`IGNORED`)."""
    mtime = F.col("mtime")
    in_window = mtime <= F.lit(window.cutoff)
    if window.after is not None:
        in_window = in_window & (mtime > F.lit(window.after))
    observed = mtime <= F.lit(window.through)
    listed = inputs.listed.select(
        "address",
        "size",
        "mtime",
        "slice",
        F.when(~F.col("well_formed"), IGNORED)
        .otherwise(
            F.lit(LISTED)
            + F.when(in_window, WINDOW).otherwise(0)
            + F.when(observed, OBSERVED).otherwise(0)
        )
        .alias("sources"),
    )
    parts = [
        listed,
        _addresses(inputs.new_committed, NEW_COMMITTED),
        _addresses(inputs.uncommitted, UNCOMMITTED),
    ]
    if inputs.carry is not None:
        parts.append(_addresses(inputs.carry, CARRIED))
    if inputs.pending is not None:
        parts.append(
            inputs.pending.select(
                "address", "size", "mtime", "slice", F.lit(PENDING).alias("sources")
            )
        )
    union = parts[0]
    for part in parts[1:]:
        union = union.unionByName(part)
    grouped = union.groupBy("address").agg(
        F.bit_or("sources").alias("sources"),
        F.max("size").alias("size"),
        F.max("mtime").alias("mtime"),
        F.max("slice").alias("slice"),
    )
    well_formed = F.col("address").isNotNull() & F.col("address").rlike(ADDRESS_PATTERN)
    return grouped.withColumn("well_formed", well_formed).persist(StorageLevel.MEMORY_AND_DISK)


def _addresses(frame: DataFrame, bit: int) -> DataFrame:
    return frame.select(
        F.col("address").cast("string"),
        F.lit(None).cast("long").alias("size"),
        F.lit(None).cast("timestamp").alias("mtime"),
        F.lit(None).cast("string").alias("slice"),
        F.lit(bit).alias("sources"),
    )


def committed() -> Column:
    return has(NEW_COMMITTED | CARRIED)


def referenced() -> Column:
    return has(NEW_COMMITTED | CARRIED | UNCOMMITTED)


def candidate(cutoff: datetime) -> Column:
    """Case 1 or case 2 of the module docstring."""
    old_enough = F.col("mtime") <= F.lit(cutoff)
    considered = has(WINDOW) | (has(PENDING) & old_enough)
    return considered & ~referenced()


def pending(cutoff: datetime) -> Column:
    """Considered now or before, not committed, and either uncommitted or (pending ones)
    still too young for this run's cutoff."""
    old_enough = F.col("mtime") <= F.lit(cutoff)
    from_window = has(WINDOW) & has(UNCOMMITTED)
    from_pending = has(PENDING) & (has(UNCOMMITTED) | ~old_enough)
    return (from_window | from_pending) & ~committed()


def carry() -> Column:
    return committed() & ~has(OBSERVED)


def malformed_inputs() -> Column:
    """An address the job read (not listed) that is not of the data-address form."""
    read = has(NEW_COMMITTED | CARRIED | UNCOMMITTED | PENDING)
    return read & ~F.col("well_formed")
