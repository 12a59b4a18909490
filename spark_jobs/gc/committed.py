"""Committed addresses, read from the Parquet ranges of every commit, each range once.

Commits share ranges (unchanged ones keep their id), so the job first reads the distinct
metaranges, then the distinct ranges they list; an optimized run subtracts the metaranges and
ranges its base run read, which hold the same addresses as they did then. The tasks that
read the ranges also write the addresses they send on to scratch files, which the gate reads
back rather than Spark caching them. An optimized run reads its handful of new files on the
driver instead: that costs less than a Spark job's start.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession

from branchwater.engine import CommittedLayout
from branchwater.engine.gc.runs.layout import external_mask
from branchwater.engine.gc.runs.plan import NEW_COMMITTED
from branchwater.engine.gc.runs.storage import Namespace
from branchwater.spark_jobs.gc.frames import ShareTask, map_shares
from branchwater.spark_jobs.gc.packing import PACKED_DDL, pack, packed_files


@dataclass
class CommittedInput:
    """What the committed listing produced: every metarange and range id known now (sorted),
    how many of each were new since the base run, and the addresses (and recorded sizes) of
    the new ranges (all ranges without a base), also written under the `copy_prefix` given
    to `read_committed`, for the gate: `packed()` makes the frame that reads them packed for
    a mark on the executors (see `packing`), and `on_driver` holds them when the driver read
    them (a mark on the driver then needs no frame, whose making costs a tenth of its
    time)."""

    metarange_ids: list[str]
    range_ids: list[str]
    new_metaranges: int
    new_ranges: int
    packed: Callable[[], DataFrame]
    on_driver: pa.Table | None = None


FILES_PER_TASK = 64
"""The fewest files a reading task is given (unless there are fewer): an optimized run reads
a handful, and a task's start would cost more than its reads."""
RANGE_ROWS = pa.schema([("range_id", pa.string()), ("min_key", pa.string())])
ADDRESS_ROWS = pa.schema([("address", pa.string()), ("size", pa.int64())])


def read_committed(
    spark: SparkSession,
    ns: Namespace,
    layout: CommittedLayout,
    known_metaranges: set[str],
    known_ranges: set[str],
    readers: int,
    copy_prefix: str,
    on_driver: bool = False,
) -> CommittedInput:
    """Metaranges and ranges are read by pyarrow on the executors: they are many small files,
    for which Spark's own reader would first stat every path (and run a listing job). With
    `on_driver`, up to a task's share of either is read on the driver instead.

    At most `readers` tasks read either kind (one per core): Arrow's threads read a task's
    files side by side, and a task more costs its start, sends on the addresses that two
    tasks share twice, and adds a scratch file (`gc-clean` measures it).

    The new ranges are handed to tasks in key order, so the versions of one key range
    (commits rewrite the ranges they change, and keep the id of the others) mostly meet in
    one task, which sends each address on once. Each task also writes its addresses to a
    file of its own under `copy_prefix`: the gate checks the candidates against them, where
    caching them in Spark (which the mark reads once) would cost more than the file."""
    all_metaranges = layout.metarange_ids()
    new_metaranges = [m for m in all_metaranges if m not in known_metaranges]
    driver_files = FILES_PER_TASK if on_driver else 0
    first_keys = _listed_ranges(spark, ns, layout, new_metaranges, readers, driver_files)
    found = set(first_keys)
    new_ranges = sorted(found - known_ranges, key=lambda r: (first_keys[r], r))
    range_keys = [layout.range_key(r) for r in new_ranges]
    columns = [layout.range_address_column, layout.range_size_column]
    read_here = None
    if on_driver and len(range_keys) <= FILES_PER_TASK:
        read_here = _written_addresses(ns, columns, copy_prefix, range_keys)
        copies = [_copy_key(copy_prefix, range_keys)] if range_keys else []
        packed = partial(packed_files, spark, ns, copies, ADDRESS_ROWS, NEW_COMMITTED, readers)
    else:
        task = partial(_distinct_addresses, ns, columns, copy_prefix)
        packed = partial(_read_shares, spark, range_keys, task, PACKED_DDL, readers)
    return CommittedInput(
        sorted(set(all_metaranges) | known_metaranges),
        sorted(found | known_ranges),
        len(new_metaranges),
        len(new_ranges),
        packed,
        read_here,
    )


def _listed_ranges(
    spark: SparkSession,
    ns: Namespace,
    layout: CommittedLayout,
    metaranges: list[str],
    readers: int,
    driver_files: int,
) -> dict[str, str]:
    """The ranges `metaranges` list, with each one's first key; no Spark job for none (an
    optimized run after no new commit)."""
    keys = [layout.metarange_key(m) for m in metaranges]
    columns = [layout.metarange_range_column, layout.metarange_min_key_column]
    if len(keys) <= driver_files:
        rows = _distinct(ns, columns, RANGE_ROWS, "min", keys)
        return dict(zip(rows.column(0).to_pylist(), rows.column(1).to_pylist(), strict=True))
    task = partial(_distinct_ranges, ns, columns)
    listed = _read_shares(spark, keys, task, "range_id string, min_key string", readers)
    return {row[0]: row[1] for row in listed.collect()}


def _read_shares(
    spark: SparkSession, keys: list[str], task: ShareTask, ddl: str, readers: int
) -> DataFrame:
    tasks = min(readers, math.ceil(len(keys) / FILES_PER_TASK))
    return map_shares(spark, keys, task, ddl, max(1, tasks))


def _distinct_ranges(
    ns: Namespace, columns: list[str], keys: list[str]
) -> Iterator[pa.RecordBatch]:
    yield from _distinct(ns, columns, RANGE_ROWS, "min", keys).to_batches()


def _distinct_addresses(
    ns: Namespace, columns: list[str], copy_prefix: str, keys: list[str]
) -> Iterator[pa.RecordBatch]:
    yield from pack(_written_addresses(ns, columns, copy_prefix, keys), NEW_COMMITTED)


def _written_addresses(
    ns: Namespace, columns: list[str], copy_prefix: str, keys: list[str]
) -> pa.Table:
    """Each address of the ranges `keys` once, with the size its entries record (what the
    summary counts for a committed object the listing did not stat), imported objects'
    addresses outside the namespace left out (GC never collects them); written first to a
    file named after the first range (a retried task writes the same file again)."""
    rows = _distinct(ns, columns, ADDRESS_ROWS, "max", keys)
    rows = rows.filter(pc.invert(external_mask(rows.column("address"), ns.store.url)))
    if keys:
        ns.write_parquet(_copy_key(copy_prefix, keys), rows)
    return rows


def _copy_key(copy_prefix: str, keys: list[str]) -> str:
    return f"{copy_prefix}/{keys[0].rsplit('/', 1)[-1]}.parquet"


def _distinct(
    ns: Namespace, columns: list[str], schema: pa.Schema, how: str, keys: list[str]
) -> pa.Table:
    """The rows of the files `keys`, named as `schema`, one per value of its first column,
    the second aggregated by `how`: commits share most ranges, and ranges most addresses, so
    far fewer rows leave the task than it read."""
    read = list(ns.read_parquet_files(keys, columns))
    if not read:
        return schema.empty_table()
    key, value = schema.names
    rows = pa.Table.from_batches(read).rename_columns(schema.names)
    distinct = rows.group_by(key, use_threads=False).aggregate([(value, how)])
    return distinct.rename_columns(schema.names).cast(schema)
