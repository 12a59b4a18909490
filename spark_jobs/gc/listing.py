"""Listing the namespace's data objects, slice by slice, on the executors.

The driver lists only `data/` one level deep (the slices); each executor lists the slices it
is given (see `marking`), one level deep again, so the work spreads as slices
intend. Keys that are not of the address form are marked `well_formed = false`: they are
counted, never collected.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from branchwater.engine.gc.runs.layout import ADDRESS_PATTERN, DATA_PREFIX
from branchwater.engine.gc.runs.plan import UTC_MICROS
from branchwater.engine.gc.runs.storage import Namespace

LISTED_SCHEMA = pa.schema(
    [
        pa.field("address", pa.string()),
        pa.field("size", pa.int64()),
        pa.field("mtime", UTC_MICROS),
        pa.field("slice", pa.string()),
        pa.field("well_formed", pa.bool_()),
    ]
)


def data_slices(ns: Namespace) -> list[str]:
    """Every folder directly under `data/` (slices, and whatever else is there)."""
    return ns.list_dir(DATA_PREFIX.rstrip("/")).directories


def list_slice(ns: Namespace, name: str, *, metadata: bool = True) -> pa.Table:
    """One slice as columns, built and checked in Arrow rather than object by object.
    Without `metadata`, a local listing leaves the files' size and mtime null (see
    `fill_metadata`)."""
    listing = ns.list_dir(f"{DATA_PREFIX}{name}", metadata=metadata)
    prefix = f"{DATA_PREFIX}{name}/"
    files = pc.binary_join_element_wise(pa.scalar(prefix), pa.array(listing.names, pa.string()), "")
    folders = len(listing.directories)
    addresses = pa.concat_arrays(
        [files, pa.array([prefix + d for d in listing.directories], pa.string())]
    )
    sizes, mtimes = _metadata(len(files), listing.sizes, listing.mtimes_ns)
    return pa.table(
        [
            addresses,
            pa.concat_arrays([sizes, pa.array([0] * folders, pa.int64())]),
            pa.concat_arrays([mtimes, pa.nulls(folders, UTC_MICROS)]),
            pa.repeat(pa.scalar(name), len(addresses)),
            pa.concat_arrays(
                [
                    pc.match_substring_regex(files, ADDRESS_PATTERN),
                    pa.array([False] * folders, pa.bool_()),
                ]
            ),
        ],
        schema=LISTED_SCHEMA,
    )


def fill_metadata(ns: Namespace, listed: pa.Table, wanted: pa.ChunkedArray) -> pa.Table:
    """`listed` with the size and mtime of the `wanted` rows read from the store; rows whose
    object is gone by then, or is no file, are dropped."""
    mask = pc.fill_null(wanted, False).combine_chunks()
    keys = listed.column("address").filter(mask).to_pylist()
    if not keys:
        return listed
    found_sizes, found_mtimes = ns.stat(keys)
    sizes = pa.array(found_sizes, pa.int64())
    listed = listed.set_column(
        1, "size", pc.replace_with_mask(listed.column("size").combine_chunks(), mask, sizes)
    ).set_column(
        2,
        "mtime",
        pc.replace_with_mask(
            listed.column("mtime").combine_chunks(),
            mask,
            _mtimes(pa.array(found_mtimes, pa.int64())),
        ),
    )
    return listed.filter(pc.invert(pc.and_(mask, pc.is_null(listed.column("size")))))


def _metadata(
    count: int, sizes: list[int] | None, mtimes_ns: list[int] | None
) -> tuple[pa.Array, pa.Array]:
    if sizes is None or mtimes_ns is None:
        return pa.nulls(count, pa.int64()), pa.nulls(count, UTC_MICROS)
    return pa.array(sizes, pa.int64()), _mtimes(pa.array(mtimes_ns, pa.int64()))


def _mtimes(nanoseconds: pa.Array) -> pa.Array:
    return pc.divide(nanoseconds, 1000).cast(UTC_MICROS)
