"""The mark, slice by slice on the executors: list, combine with what was read, classify,
write the sets, and report only counts and file names to the driver.

Every address the run read (committed, uncommitted, carried, pending) goes, with the bit of
its set, to the partition of its slice, and so does the name of every slice to list: one
shuffle of the addresses read, packed by slice (see `packing`). A task lists its slices
itself, so the listed objects, the largest input, never leave the executor that listed
them. It combines them with the addresses of the same slices in Arrow (`plan.combine`),
writes its candidates and the next run's pending and carry sets as Parquet files of at most
`per_file` rows, and yields the counts, the reclaimable volume per slice, examples of
malformed inputs, and the files.

The task is shared by the two ways to run it (`mark_paths`): on the executors, or, for an
optimized run whose inputs are small, in the driver's process.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta

import pyarrow as pa
import pyarrow.compute as pc
from pyspark import TaskContext

from branchwater.engine.gc.runs import plan
from branchwater.engine.gc.runs.files import SliceVolume, Volume, part_name
from branchwater.engine.gc.runs.layout import slice_time
from branchwater.engine.gc.runs.storage import Namespace
from branchwater.spark_jobs.gc.frames import arrow_schema
from branchwater.spark_jobs.gc.listing import LISTED_SCHEMA, fill_metadata, list_slice
from branchwater.spark_jobs.gc.packing import unpacked

READ_DDL = "address string, sources int, size long, mtime timestamp"
READ_SCHEMA = arrow_schema(READ_DDL)
"""`READ_DDL` as the mark's tasks receive it."""
MARK_DDL = (
    "kind string, name string, address string, size long, mtime timestamp, slice string, "
    "number long"
)
TO_LIST = 0
"""The `sources` of a packed row naming a slice to list (every set read has a bit)."""
MALFORMED_EXAMPLES = 5
SET_DDL = "address string, size long, mtime timestamp, slice string"
"""The columns of the files of each of `plan.SETS`."""
SET_SCHEMA = arrow_schema(SET_DDL)
SET_COLUMNS = SET_SCHEMA.names
ADDRESSES = pa.schema([("address", pa.string())])


@dataclass
class Marked:
    """What the mark found: counts, reclaimable volume per slice, the files of each set
    (sorted), and up to a few malformed inputs with the bits of where they were read."""

    counts: dict[str, Volume]
    per_slice: list[SliceVolume]
    files: dict[str, list[str]]
    malformed: list[tuple[str | None, int]] = field(default_factory=list)


def arrow_addresses_read(table: pa.Table, bit: int) -> pa.Table:
    """Addresses of one input set (`address`, and `size` and `mtime` where it has them)
    with the bit of the set, as the mark reads them."""
    rows = table.num_rows

    def given(name: str) -> pa.ChunkedArray | pa.Array:
        kind = READ_SCHEMA.field(name).type
        return table.column(name).cast(kind) if name in table.column_names else pa.nulls(rows, kind)

    sources = pa.repeat(pa.scalar(bit, pa.int32()), rows)
    columns = [table.column("address").cast(pa.string()), sources, given("size"), given("mtime")]
    return pa.table(columns, schema=READ_SCHEMA)


def marked_from(rows: list[dict]) -> Marked:
    counts = {name: Volume() for name in plan.COUNTS}
    per_slice: dict[str, SliceVolume] = {}
    files: dict[str, list[str]] = {name: [] for name in plan.SETS}
    malformed: list[tuple[str | None, int]] = []
    for row in rows:
        kind = row["kind"]
        if kind == "count":
            volume = counts[row["name"]]
            volume.objects += row["number"]
            volume.bytes += row["size"]
        elif kind == "slice":
            per_slice[row["slice"]] = SliceVolume(row["slice"], row["number"], row["size"])
        elif kind == "file":
            files[row["name"]].append(row["address"])
        elif kind == "malformed":
            malformed.append((row["address"], row["number"]))
    return Marked(
        counts,
        sorted(per_slice.values(), key=lambda v: v.slice),
        {name: sorted(keys) for name, keys in files.items()},
        malformed[:MALFORMED_EXAMPLES],
    )


def mark_task(
    ns: Namespace,
    window: plan.Window,
    late: timedelta,
    prefixes: dict[str, str],
    per_file: int,
    batches: Iterator[pa.RecordBatch],
) -> Iterator[pa.RecordBatch]:
    slices: list[str] = []
    tables: list[pa.Table] = []
    for batch in batches:
        for name, bit, rows in unpacked(batch):
            if rows is None:
                slices.append(name)
            else:
                tables.append(arrow_addresses_read(rows, bit))
    if not slices and not tables:
        return
    yield from mark_slices(ns, window, late, prefixes, per_file, slices, tables)


def mark_slices(
    ns: Namespace,
    window: plan.Window,
    late: timedelta,
    prefixes: dict[str, str],
    per_file: int,
    slices: list[str],
    read: list[pa.Table],
) -> Iterator[pa.RecordBatch]:
    """The mark's task on the slices to list and the `arrow_addresses_read` tables read."""
    received = pa.concat_tables(read) if read else READ_SCHEMA.empty_table()
    found = plan.union_by_address(received)
    listed = _listed(ns, slices, window, late, found)
    rows = plan.combine(listed, found)
    context = TaskContext.get()
    number = context.partitionId() if context is not None else 0
    sets = plan.set_masks(rows, window.cutoff)
    yield from _files(ns, rows, sets, prefixes, per_file, number)
    yield from _counts(rows, window)
    yield _per_slice(rows.filter(sets["candidates"]))
    bad = rows.filter(plan.malformed_inputs(rows)).slice(0, MALFORMED_EXAMPLES)
    yield _mark_batch(
        "malformed", address=bad.column("address"), number=bad.column("sources").cast(pa.int64())
    )


def _listed(
    ns: Namespace, slices: list[str], window: plan.Window, late: timedelta, found: pa.Table
) -> pa.Table:
    """The objects of `slices` with their bits and their `position` in `found` (the
    addresses read, see `plan.combine`).

    In a slice settled before the window (see `settled_bound`) an object a commit or a
    branch references, by an entry that records its size, needs nothing from the store: it
    is no candidate, its size is the entry's, and the bound stands for its mtime (it is not
    newer, and either time gives the same bits). Every other object is stat-ed where the
    listing did not give its metadata."""
    tables, bounds = [], []
    for name in slices:
        bound = settled_bound(name, window, late)
        table = list_slice(ns, name, metadata=bound is None)
        tables.append(table)
        bounds.append(pa.repeat(pa.scalar(bound, plan.UTC_MICROS), table.num_rows))
    listed = pa.concat_tables(tables) if tables else LISTED_SCHEMA.empty_table()
    position = plan.lookup(listed.column("address"), found)
    bound_column = pa.chunked_array(bounds, plan.UTC_MICROS)
    matched = found.select(["sources", "size"]).take(position)
    known = pc.and_(plan.referenced(matched), pc.is_valid(matched.column("size")))
    settled = pc.and_(pc.is_valid(bound_column), pc.fill_null(known, False))
    wanted = pc.and_(
        pc.and_(pc.is_null(listed.column("mtime")), listed.column("well_formed")),
        pc.invert(settled),
    )
    listed = listed.append_column("bound", bound_column).append_column("position", position)
    listed = fill_metadata(ns, listed, wanted)
    mtime = pc.coalesce(listed.column("mtime"), listed.column("bound"))
    listed = listed.set_column(2, "mtime", mtime).drop_columns(["bound"])
    return listed.append_column("sources", plan.listed_sources(listed, window).cast(pa.int32()))


def settled_bound(name: str, window: plan.Window, late: timedelta) -> datetime | None:
    """A time no object of slice `name` is newer than, when that time leaves the slice's
    objects wholly inside or wholly before the window (so their mtimes change nothing);
    else None. Objects land in a slice while it is current or, through a link token, within
    `late` of its opening (as `layout.choose_slices` relies on too)."""
    created = slice_time(name)
    if created is None:
        return None
    bound = created + late
    if bound > window.cutoff or (window.after is not None and bound > window.after):
        return None
    return bound


def _files(
    ns: Namespace,
    rows: pa.Table,
    sets: dict[str, pa.ChunkedArray],
    prefixes: dict[str, str],
    per_file: int,
    number: int,
) -> Iterator[pa.RecordBatch]:
    for name, mask in sets.items():
        chosen = rows.filter(mask).select(SET_COLUMNS)
        for chunk in itertools.count():
            part = chosen.slice(chunk * per_file, per_file)
            if part.num_rows == 0:
                break
            key = f"{prefixes[name]}/{part_name(number, chunk)}"
            ns.write_parquet(key, part)
            yield _mark_batch("file", name=[name], address=[key], number=[part.num_rows])


def _counts(rows: pa.Table, window: plan.Window) -> Iterator[pa.RecordBatch]:
    names, objects, sizes = [], [], []
    size = pc.fill_null(rows.column("size"), 0)
    for name, mask in plan.count_masks(rows, window).items():
        names.append(name)
        objects.append(pc.sum(mask).as_py() or 0)
        if name in plan.ADDRESS_COUNTS:
            sizes.append(0)
        else:
            sizes.append(pc.sum(pc.if_else(mask, size, 0)).as_py() or 0)
    yield _mark_batch("count", name=names, size=sizes, number=objects)


def _per_slice(candidates: pa.Table) -> pa.RecordBatch:
    grouped = candidates.group_by("slice", use_threads=False).aggregate(
        [("address", "count"), ("size", "sum")]
    )
    return _mark_batch(
        "slice",
        slice=grouped.column("slice"),
        size=pc.fill_null(grouped.column("size_sum"), 0),
        number=grouped.column("address_count"),
    )


def _mark_batch(kind: str, **columns: object) -> pa.RecordBatch:
    """One kind of result rows; the columns it does not use are null."""
    length = len(next(iter(columns.values())))  # type: ignore[arg-type]
    types = {
        "name": pa.string(),
        "address": pa.string(),
        "size": pa.int64(),
        "mtime": plan.UTC_MICROS,
        "slice": pa.string(),
        "number": pa.int64(),
    }
    arrays = [pa.array([kind] * length, pa.string())]
    for name, kind_type in types.items():
        value = columns.get(name)
        if value is None:
            arrays.append(pa.nulls(length, kind_type))
        elif isinstance(value, pa.ChunkedArray):
            arrays.append(value.combine_chunks().cast(kind_type))
        else:
            arrays.append(pa.array(value, kind_type))
    return pa.record_batch(arrays, names=["kind", *types])


def probe(addresses: pa.ChunkedArray | pa.Array, wanted: pa.Array) -> pa.ChunkedArray | pa.Array:
    """The `addresses` that are `wanted`; the sets are probed against the candidates, the
    smaller side."""
    return addresses.filter(pc.is_in(addresses, wanted))
