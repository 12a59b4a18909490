"""Listing the namespace's data objects, slice by slice, on the executors.

The driver lists only `data/` one level deep (the slices); each executor lists the slices it
is given (see `marking`), one level deep again, so the work spreads as the seed's slices
intend. Keys that are not of the address form are marked `well_formed = false`: they are
counted, never collected.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from branchwater.spark_jobs.gc.layout import ADDRESS_PATTERN, DATA_DIR
from branchwater.spark_jobs.gc.plan import MTIME_TYPE
from branchwater.spark_jobs.gc.storage import Namespace

LISTED_SCHEMA = pa.schema(
    [
        pa.field("address", pa.string()),
        pa.field("size", pa.int64()),
        pa.field("mtime", MTIME_TYPE),
        pa.field("slice", pa.string()),
        pa.field("well_formed", pa.bool_()),
    ]
)


def data_slices(ns: Namespace) -> list[str]:
    """Every folder directly under `data/` (slices, and whatever else is there)."""
    return ns.list_dir(DATA_DIR).directories


def list_slice(ns: Namespace, name: str) -> pa.Table:
    """One slice as columns, built and checked in Arrow rather than object by object."""
    listing = ns.list_dir(f"{DATA_DIR}/{name}")
    prefix = f"{DATA_DIR}/{name}/"
    files = pc.binary_join_element_wise(pa.scalar(prefix), pa.array(listing.names, pa.string()), "")
    folders = [prefix + d for d in listing.directories]
    addresses = pa.concat_arrays([files, pa.array(folders, pa.string())])
    mtimes = pc.divide(pa.array(listing.mtimes_ns, pa.int64()), 1000)
    count = len(addresses)
    return pa.table(
        [
            addresses,
            pa.array(listing.sizes + [0] * len(folders), pa.int64()),
            pa.concat_arrays([mtimes.cast(MTIME_TYPE), pa.nulls(len(folders), MTIME_TYPE)]),
            pa.repeat(pa.scalar(name), count),
            pa.concat_arrays(
                [
                    pc.match_substring_regex(files, ADDRESS_PATTERN),
                    pa.array([False] * len(folders), pa.bool_()),
                ]
            ),
        ],
        schema=LISTED_SCHEMA,
    )
