"""Sweeping a mark: deleting its candidates in bulk on the executors, and recording it.

The driver first reads the mark's addresses once, in Arrow, and refuses the whole mark if
one is not `data/<slice>/<id>` (nothing outside the namespace's data or under
`_branchwater/` can be deleted whatever the files say); it also lists the files already
recorded, in one request. Each task then takes its share of the candidates files (one share
per core), checks them again, deletes all their addresses as one stream of bulk deletes
(S3 DeleteObjects, 1,000 keys a call, several calls at once), so the batches are full and
the requests in flight never wait for one file to end, and then writes `deleted/<same file
name>` for each. A file already recorded is skipped, so a sweep killed midway is finished by
running it again with the same mark id (what a killed task had deleted but not recorded is
deleted again: deleting an absent key is no error).
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from itertools import chain

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession

from branchwater.engine import InvalidAddress, InvalidArgument
from branchwater.engine.gc.runs.files import CANDIDATES, DELETED, SliceVolume, run_prefix
from branchwater.engine.gc.runs.layout import ADDRESS_PATTERN
from branchwater.engine.gc.runs.storage import Namespace
from branchwater.spark_jobs.gc.frames import cores, executor_errors, map_shares

SWEPT_DDL = "key string, slice string, objects long, bytes long"
SWEPT_COLUMNS = ["address", "size", "slice"]
SHOWN = 5
"""Malformed addresses a refusal names."""


def deleted_key(candidates_key: str) -> str:
    """`<run>/candidates/part-N.parquet` → `<run>/deleted/part-N.parquet`."""
    head, _, name = candidates_key.rpartition(f"/{CANDIDATES}/")
    return f"{head}/{DELETED}/{name}"


def malformed(addresses: pa.Array | pa.ChunkedArray) -> pa.Array:
    """The addresses that are not of the data-address form (nulls included), in Arrow: RE2's
    `$` ends the text, so a trailing newline is malformed too."""
    wellformed = pc.fill_null(pc.match_substring_regex(addresses, ADDRESS_PATTERN), False)
    bad = addresses.filter(pc.invert(wellformed))
    return bad.combine_chunks() if isinstance(bad, pa.ChunkedArray) else bad


def check_addresses(addresses: pa.Array | pa.ChunkedArray, where: str) -> None:
    """Refuse the whole file when one address is not of the data-address form."""
    refuse_malformed([malformed(addresses)], where)


def refuse_malformed(bad: list[pa.Array], where: str) -> None:
    count = sum(len(b) for b in bad)
    if count:
        shown = [a for b in bad for a in b[:SHOWN].to_pylist()][:SHOWN]
        raise InvalidAddress(
            f"{where} holds {count} address(es) that are not data/<slice>/<object id> "
            f"in the namespace (first: {', '.join(map(repr, shown))}); GC deletes nothing "
            "from it"
        )


def sweep(
    spark: SparkSession, ns: Namespace, run_id: str, candidate_keys: list[str]
) -> tuple[list[str], list[SliceVolume]]:
    """Delete every candidate; returns the deleted-record keys and the volume per slice."""
    prefix = run_prefix(run_id)
    for key in candidate_keys:
        if not key.startswith(f"{prefix}{CANDIDATES}/"):
            raise InvalidArgument(f"{key!r} is not a candidates file of GC run {run_id!r}")
    recorded = set(ns.folder_keys(f"{prefix}{DELETED}"))
    unrecorded = [key for key in candidate_keys if deleted_key(key) not in recorded]
    _refuse_malformed(ns, unrecorded)
    task = partial(_sweep_files, ns, frozenset(recorded))
    with executor_errors(f"sweep of GC run {run_id}"):
        rows = map_shares(spark, candidate_keys, task, SWEPT_DDL, cores(spark)).collect()
    per_slice: dict[str, SliceVolume] = {}
    for row in rows:
        volume = per_slice.setdefault(row.slice, SliceVolume(row.slice, 0, 0))
        volume.objects += row.objects
        volume.bytes += row.bytes
    records = sorted({deleted_key(key) for key in candidate_keys})
    return records, sorted(per_slice.values(), key=lambda v: v.slice)


def _refuse_malformed(ns: Namespace, keys: list[str]) -> None:
    """Check the whole mark before the first delete (each task checks its files again),
    a batch at a time: the driver holds no more than the bad addresses."""
    bad = [malformed(batch.column(0)) for batch in ns.read_parquet_files(keys, ["address"])]
    refuse_malformed([b for b in bad if len(b)], "the mark")


def _sweep_files(
    ns: Namespace, recorded: frozenset[str], keys: list[str]
) -> Iterator[pa.RecordBatch]:
    done = [key for key in keys if deleted_key(key) in recorded]
    todo = [key for key in keys if deleted_key(key) not in recorded]
    for key, table in zip(done, _read_each(ns, [deleted_key(k) for k in done]), strict=True):
        yield _volumes(key, table)
    tables = list(_read_each(ns, todo))
    for key, table in zip(todo, tables, strict=True):
        check_addresses(table.column("address"), f"candidates file {key!r}")
    ns.store.delete(chain.from_iterable(t.column("address").to_pylist() for t in tables))
    for key, table in zip(todo, tables, strict=True):
        ns.write_parquet(deleted_key(key), table)
        yield _volumes(key, table)


def _read_each(ns: Namespace, keys: list[str]) -> Iterator[pa.Table]:
    """Each file's swept columns, several read at once."""
    return ns.map_keys(keys, lambda key: ns.read_parquet(key, SWEPT_COLUMNS))


def _volumes(key: str, table: pa.Table) -> pa.RecordBatch:
    grouped = table.group_by("slice").aggregate([("address", "count"), ("size", "sum")])
    return pa.record_batch(
        [
            pa.repeat(pa.scalar(key), grouped.num_rows),
            grouped.column("slice").combine_chunks(),
            pc.cast(grouped.column("address_count"), pa.int64()).combine_chunks(),
            pc.fill_null(pc.cast(grouped.column("size_sum"), pa.int64()), 0).combine_chunks(),
        ],
        names=["key", "slice", "objects", "bytes"],
    )
