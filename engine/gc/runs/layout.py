"""The namespace layout GC relies on: data objects at `data/<slice>/<object id>`.

Only keys of exactly that form are ever candidates; anything else under `data/` (a temporary
file of a write in progress, a folder another tool made) is counted and left alone, and an
address of any other form in an input the job reads is refused, except an imported object's
full URI outside the namespace (`external_mask`), which the job skips as it reads it.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc

from branchwater.engine.errors import InvalidArgument
from branchwater.engine.gc.addresses import DATA_ADDRESS_PATTERN, DATA_PREFIX, slice_created
from branchwater.engine.graveler.external import external_mask as external_mask

ADDRESS_PATTERN = DATA_ADDRESS_PATTERN
"""A well-formed data address, relative to the namespace (Java and Python regex alike)."""
JVM_ADDRESS_PATTERN = ADDRESS_PATTERN.removesuffix("$") + r"\z"
r"""The same for Java's regular expressions (Spark's `rlike`, GX's checks on Spark), whose `$`
also matches before a final newline, where `\z` ends the text (Python has no `\z`)."""
SLICE_NAMED = rf"^{DATA_PREFIX}(?P<slice>[^/]+)/"
"""The slice an address names, as the named group `slice` (Arrow's `extract_regex`)."""


def named_slices(addresses: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """The slice each address names (its folder under `data/`), null where it names none."""
    return pc.struct_field(pc.extract_regex(addresses, SLICE_NAMED), [0])


def slice_time(name: str) -> datetime | None:
    """When a slice was opened, or None when `name` is not a slice name."""
    try:
        return slice_created(name)
    except InvalidArgument:
        return None


def choose_slices(
    names: list[str],
    cutoff: datetime,
    considered_after: datetime | None,
    late_writes: timedelta,
    clock_skew: timedelta,
) -> tuple[list[str], dict[str, int]]:
    """The slices to list, newest first, and how many were skipped and why.

    A slice opened after the cutoff holds only objects younger than the minimum age; its name
    comes from its writer's clock and the objects' times from the store's, so only slices
    opened `clock_skew` after the cutoff are skipped, and the objects' own times decide the
    rest. With a previous run, a slice opened long enough before what that run considered
    can hold no object written since (objects land in a slice while it is current, or later
    through a link token, within `late_writes`): skipping it only ever leaves garbage for a
    clean run, never deletes anything.
    """
    chosen: list[str] = []
    skipped = {"young": 0, "old": 0, "malformed": 0}
    for name in sorted(names):
        created = slice_time(name)
        if created is None:
            skipped["malformed"] += 1
        elif created > cutoff + clock_skew:
            skipped["young"] += 1
        elif considered_after is not None and created <= considered_after - late_writes:
            skipped["old"] += 1
        else:
            chosen.append(name)
    return chosen, skipped
