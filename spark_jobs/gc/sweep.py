"""Sweeping a mark: deleting its candidates in bulk on the executors, and recording it.

Each task takes one candidates file, checks every address again (only `data/<slice>/<id>`,
so nothing outside the namespace's data or under `_branchwater/` can be deleted whatever
the file says), deletes with the object store's bulk delete (S3 DeleteObjects, 1,000 keys a
call), then writes `deleted/<same file name>`. A file already recorded is skipped, so a
sweep killed midway is finished by running it again with the same mark id.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import partial

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import SparkSession
from pyspark.sql import functions as F

from branchwater.engine import InvalidAddress, InvalidArgument
from branchwater.engine.gc.runs.files import CANDIDATES, DELETED, SliceVolume, run_prefix
from branchwater.engine.gc.runs.layout import ADDRESS_PATTERN, JVM_ADDRESS_PATTERN
from branchwater.engine.gc.runs.storage import Namespace
from branchwater.spark_jobs.gc.frames import executor_errors, map_shares, read_parquet

SWEPT_DDL = "key string, slice string, objects long, bytes long"
_ADDRESS = re.compile(ADDRESS_PATTERN)


def deleted_key(candidates_key: str) -> str:
    """`<run>/candidates/part-N.parquet` → `<run>/deleted/part-N.parquet`."""
    head, _, name = candidates_key.rpartition(f"/{CANDIDATES}/")
    return f"{head}/{DELETED}/{name}"


def check_addresses(addresses: list[str], where: str) -> None:
    """Refuse the whole file when one address is not of the data-address form."""
    bad = [a for a in addresses if not isinstance(a, str) or not _ADDRESS.fullmatch(a)]
    if bad:
        raise InvalidAddress(
            f"{where} holds {len(bad)} address(es) that are not data/<slice>/<object id> "
            f"in the namespace (first: {bad[0]!r}); GC deletes nothing from it"
        )


def sweep(
    spark: SparkSession, ns: Namespace, run_id: str, candidate_keys: list[str]
) -> tuple[list[str], list[SliceVolume]]:
    """Delete every candidate; returns the deleted-record keys and the volume per slice."""
    prefix = run_prefix(run_id)
    for key in candidate_keys:
        if not key.startswith(f"{prefix}{CANDIDATES}/"):
            raise InvalidArgument(f"{key!r} is not a candidates file of GC run {run_id!r}")
    with executor_errors(f"sweep of GC run {run_id}"):
        _refuse_malformed(spark, ns, candidate_keys)
        rows = map_shares(spark, candidate_keys, partial(_sweep_files, ns), SWEPT_DDL).collect()
    per_slice: dict[str, SliceVolume] = {}
    for row in rows:
        volume = per_slice.setdefault(row.slice, SliceVolume(row.slice, 0, 0))
        volume.objects += row.objects
        volume.bytes += row.bytes
    recorded = sorted({deleted_key(key) for key in candidate_keys})
    return recorded, sorted(per_slice.values(), key=lambda v: v.slice)


def _refuse_malformed(spark: SparkSession, ns: Namespace, keys: list[str]) -> None:
    """Check the whole mark before the first delete (each task checks its file again)."""
    candidates = read_parquet(spark, ns, keys, "address string", len(keys))
    bad = candidates.filter(
        F.col("address").isNull() | ~F.col("address").rlike(JVM_ADDRESS_PATTERN)
    ).limit(3)
    check_addresses([row.address for row in bad.collect()], "the mark")


def _sweep_files(ns: Namespace, keys: list[str]) -> Iterator[pa.RecordBatch]:
    for key in keys:
        yield _volumes(key, _sweep_file(ns, key))


def _sweep_file(ns: Namespace, key: str) -> pa.Table:
    record = deleted_key(key)
    if ns.exists(record):
        return ns.read_parquet(record, ["address", "size", "slice"])
    table = ns.read_parquet(key, ["address", "size", "slice"])
    addresses = table.column("address").to_pylist()
    check_addresses(addresses, f"candidates file {key!r}")
    ns.store.delete(addresses)
    ns.write_parquet(record, table)
    return table


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
