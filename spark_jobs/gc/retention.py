"""The committed part of a GC run (retention): objects only expired commits hold.

Unlike the uncommitted part, it lists nothing: the addresses it may delete are those of the
ranges only expired commits' metaranges list, less every address of the active commits'
ranges and of the prepare output, less what is not a data address of this namespace, less
what may be younger than the minimum age (the slice an address names was opened late enough
for an object in it to be younger: objects land in a slice while it is current, or within
`late_writes` through a link token). Ranges an active commit also lists are never read on the
expired side: content-defined ranges make unchanged files share them, so most of an expired
commit's ranges are skipped whole. Both sides' ranges are read by Spark tasks into address
frames (each task merges its batch of ranges by address), and the expired-only addresses are
the expired side `left_anti` joined with the active side and with the prepare output, in
Spark: no address set is shipped to the tasks or held on the driver while they read, so the
active set (about 1 GB at 20 M addresses) never has to fit in a task's closure. The commit
sets and range ids are small and stay on the driver (`engine/gc/runs/retention.py`).

The candidates are written as candidates files of the run (`candidates/expired-*.parquet`,
swept with the others), after the re-check under the run's lease took out the addresses of
commits that became active or were recorded meanwhile. The gate validates them in a suite of
their own (`gc-expired`): among the expectations, the flag "referenced by an active commit",
computed by joining the written files with the active addresses read again, must be false.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from branchwater.engine import CommittedLayout, Repository
from branchwater.engine.gc.runs.explain import EXPIRED_FILE_PREFIX
from branchwater.engine.gc.runs.files import CANDIDATES, Volume, part_name, run_prefix
from branchwater.engine.gc.runs.layout import JVM_ADDRESS_PATTERN, external_mask, slice_time
from branchwater.engine.gc.runs.retention import (
    RetentionInput,
    commits_holding,
    metaranges_now_held,
    settle_expiring,
)
from branchwater.engine.gc.runs.storage import Namespace
from branchwater.spark_jobs.gc.frames import map_shares

EXPIRED_DDL = "address string, size long, newest int, ranges array<int>"
"""An address of the expired-only ranges a task read: its size, the newest expired
metarange holding it and the ranges holding it among those the task read, both as
positions in `Owners` (numbers, not ids: a row carries no 64-character id through the
shuffle, and the newest of a few metaranges is a `max`)."""
ACTIVE_DDL = "address string"
RANGES_PER_BATCH = 512
"""Ranges a task reads before it merges their rows by address: a rewritten file's address is
in every later version of its range until the file is rewritten again, so a batch of
ranges holds each address many times; merged in Arrow, far fewer rows reach Spark."""
CANDIDATE_SCHEMA = pa.schema(
    [
        ("address", pa.string()),
        ("size", pa.int64()),
        ("slice", pa.string()),
        ("old_since", pa.timestamp("us", tz="UTC")),
        ("commit", pa.string()),
        ("month", pa.string()),
        ("branch", pa.string()),
    ]
)
"""An expired candidate: what the sweep reads (address, size, slice), the lower bound of the
object's age (`old_since`: its slice's opening plus the late-writes allowance) and the
expired commit, month and branch the report attributes it to."""
FILES_PER_TASK = 64


@dataclass
class ExpiredMark:
    """What the committed part marked: its candidates files, volumes and what it dropped."""

    keys: list[str]
    volume: Volume
    by_branch: dict[str, Volume] = field(default_factory=dict)
    by_month: dict[str, Volume] = field(default_factory=dict)
    dropped: int = 0
    young: int = 0
    expiring: list[str] = field(default_factory=list)
    """The commits the sweep records as expired (`CommitExpired` from then on)."""

    def to_json(self) -> dict[str, object]:
        return {
            "candidates": vars(self.volume),
            "by_branch": {k: vars(v) for k, v in sorted(self.by_branch.items())},
            "by_month": {k: vars(v) for k, v in sorted(self.by_month.items())},
            "dropped_by_recheck": self.dropped,
            "too_young": self.young,
        }


@dataclass(frozen=True)
class Owners:
    """Who holds each expired-only range, by position: `metaranges` are the expired-only
    metaranges oldest first (by their newest expired commit's date, then id), `ranges` the
    expired-only ranges, and `of` maps a range's key to its position in `ranges` and the
    position of the newest metarange listing it."""

    metaranges: list[str]
    ranges: list[str]
    of: dict[str, tuple[int, int]]


@dataclass(frozen=True)
class ExpiredCandidates:
    """The expired candidates (`rows`: address, size, `newest`, the newest expired-only
    metarange holding the address, and `ranges`, the expired-only ranges holding it, both
    positions in `owners`) and every expired-only metarange's ranges (`trees`), which say
    which commits hold a candidate."""

    rows: DataFrame
    trees: dict[str, set[str]]
    owners: Owners

    def ranges_in(self, rows: pa.Table) -> set[str]:
        """The ranges holding any of `rows`' addresses (rows of `self.rows`)."""
        if not rows.num_rows:
            return set()
        positions = pc.unique(pc.list_flatten(rows.column("ranges"))).to_pylist()
        return {self.owners.ranges[i] for i in positions}

    def metarange_ids(self, rows: pa.Table) -> list[str]:
        """The newest expired metarange holding each of `rows`' addresses."""
        return [self.owners.metaranges[i] for i in rows.column("newest").to_pylist()]


def expired_candidates(
    spark: SparkSession,
    ns: Namespace,
    layout: CommittedLayout,
    plan: RetentionInput,
    uncommitted: DataFrame,
    readers: int,
) -> ExpiredCandidates:
    """Every data address only expired commits hold and no prepare output names, one row per
    address (the newest expired metarange attributed, and the ranges holding it).

    Both sides are address frames read by Spark tasks; the active side is removed with a
    `left_anti` join before the expired side's rows are grouped by address (each task first
    merges its batch of ranges in Arrow, so far fewer rows than the ranges hold reach the
    shuffle; the grouping, with its lists of ranges, then runs on candidates' rows only).
    Nothing address-sized is shipped to a task or collected on the driver here."""
    active_side = _listed(ns, layout, sorted(plan.active_metaranges()))
    expired_metaranges = sorted(plan.expired_metaranges())
    active_ranges = pc.unique(active_side.column("range_id"))
    expired_only = _listed(ns, layout, expired_metaranges, active_ranges)
    trees: dict[str, set[str]] = {}
    positions, range_ids = (expired_only.column(i).to_pylist() for i in (0, 1))
    for position, range_id in zip(positions, range_ids, strict=True):
        trees.setdefault(expired_metaranges[position], set()).add(range_id)
    active = _addresses(spark, ns, layout, _by_start(active_side), readers)
    owners = _owners(layout, trees, plan, _by_start(expired_only))
    keys = list(owners.of)
    task = partial(_expired_addresses, ns, layout, owners.of)
    found = map_shares(spark, keys, task, EXPIRED_DDL, _tasks(keys, readers))
    candidates = found.join(active, "address", "left_anti")
    per_address = candidates.groupBy("address").agg(
        F.max("size").alias("size"),
        F.max("newest").alias("newest"),
        F.array_distinct(F.flatten(F.collect_list("ranges"))).alias("ranges"),
    )
    rows = per_address.filter(F.col("address").rlike(JVM_ADDRESS_PATTERN)).join(
        uncommitted.select("address"), "address", "left_anti"
    )
    return ExpiredCandidates(rows, trees, owners)


def _owners(
    layout: CommittedLayout, trees: dict[str, set[str]], plan: RetentionInput, ranges: list[str]
) -> Owners:
    """Each expired-only range (`ranges`, in the tasks' order) and the newest expired
    metarange listing it: the attribution of the range's addresses."""
    dates = {m: a.date for m, a in plan.attribution().items()}
    oldest = datetime.min.replace(tzinfo=UTC)
    metaranges = sorted(trees, key=lambda m: (dates.get(m, oldest), m))
    newest: dict[str, int] = {}
    for position, metarange in enumerate(metaranges):
        for range_id in trees[metarange]:
            newest[range_id] = position
    of = {layout.range_key(r): (i, newest[r]) for i, r in enumerate(ranges)}
    return Owners(metaranges, ranges, of)


def active_addresses(
    spark: SparkSession,
    ns: Namespace,
    layout: CommittedLayout,
    plan: RetentionInput,
    readers: int,
) -> DataFrame:
    """Every address an active commit holds (one column, `address`, not distinct)."""
    listed = _listed(ns, layout, sorted(plan.active_metaranges()))
    return _addresses(spark, ns, layout, _by_start(listed), readers)


def _addresses(
    spark: SparkSession, ns: Namespace, layout: CommittedLayout, ranges: list[str], readers: int
) -> DataFrame:
    keys = [layout.range_key(r) for r in ranges]
    task = partial(_range_addresses, ns, layout)
    return map_shares(spark, keys, task, ACTIVE_DDL, _tasks(keys, readers))


def mark_expired(
    spark: SparkSession,
    ns: Namespace,
    repo: Repository,
    layout: CommittedLayout,
    plan: RetentionInput,
    uncommitted: DataFrame,
    run_id: str,
    cutoff: datetime,
    late_writes: timedelta,
    readers: int,
    per_file: int,
) -> ExpiredMark:
    """Compute the expired candidates, re-check the refs, write the candidates files. Only
    the commits whose trees hold a candidate are fenced, and only those still holding one
    after the re-check's drops and the age filter are recorded as expired."""
    g, record = repo.lake.graveler, repo.record
    found = expired_candidates(spark, ns, layout, plan, uncommitted, readers)
    rows = found.rows.toArrow()
    holding = commits_holding(plan, found.trees, found.ranges_in(rows))
    held_now = metaranges_now_held(g, record, plan, run_id, holding)
    dropped_addresses = _addresses_of(ns, layout, held_now)
    if rows.num_rows:
        dropped_addresses |= staged_now(ns, repo)
    keep = pc.invert(
        pc.is_in(rows.column("address"), pa.array(sorted(dropped_addresses), pa.string()))
    )
    before = rows.num_rows
    rows = rows.filter(keep)
    dropped = before - rows.num_rows
    table, kept = _aged(rows, found.metarange_ids(rows), plan, cutoff, late_writes)
    keys = _write(ns, run_id, table, per_file)
    mark = ExpiredMark(
        keys,
        Volume(table.num_rows, _sum(table.column("size"))),
        dropped=dropped,
        young=rows.num_rows - table.num_rows,
    )
    holding = commits_holding(plan, found.trees, found.ranges_in(rows.filter(kept)))
    mark.expiring = settle_expiring(g, record, plan, held_now, run_id, holding)
    for name, target in (("branch", mark.by_branch), ("month", mark.by_month)):
        grouped = table.group_by(name).aggregate([("address", "count"), ("size", "sum")])
        for key, count, size in zip(
            *(grouped.column(i).to_pylist() for i in (name, "address_count", "size_sum")),
            strict=True,
        ):
            target[key] = Volume(count, size or 0)
    return mark


def staged_now(ns: Namespace, repo: Repository) -> set[str]:
    """Every uncommitted address now, from a second prepare run: a restore that staged an
    expired commit's entry after the run's first prepare."""
    run = repo.prepare_uncommitted_for_gc()
    keys = list(repo.uncommitted_gc_run(run.run_id).keys)
    table = ns.read_table(keys, pa.schema([("address", pa.string())]))
    return set(table.column("address").to_pylist())


def flagged(
    spark: SparkSession,
    ns: Namespace,
    keys: list[str],
    active: DataFrame,
    uncommitted: DataFrame,
    started: datetime,
) -> DataFrame:
    """The written candidates with the gate's columns: `referenced` (an active commit holds
    the address), `uncommitted` (the prepare output names it), `duplicate` (null unless the
    address is marked twice) and `age_seconds` (at least, at the run's start)."""
    schema = "address string, size long, old_since timestamp"
    if keys:
        read = map_shares(spark, keys, partial(_read_candidates, ns), schema)
    else:
        read = spark.createDataFrame([], schema)
    held = active.select("address").distinct().withColumn("held", F.lit(True))
    staged = uncommitted.select("address").distinct().withColumn("staged", F.lit(True))
    counts = read.groupBy("address").count()
    return (
        read.join(held, "address", "left")
        .join(staged, "address", "left")
        .join(counts, "address", "left")
        .select(
            "address",
            F.coalesce(F.col("held"), F.lit(False)).alias("referenced"),
            F.coalesce(F.col("staged"), F.lit(False)).alias("uncommitted"),
            F.when(F.col("count") > 1, F.lit(True)).alias("duplicate"),
            (F.lit(started).cast("double") - F.col("old_since").cast("double")).alias(
                "age_seconds"
            ),
        )
    )


def _read_candidates(ns: Namespace, keys: list[str]) -> Iterator[pa.RecordBatch]:
    for key in keys:
        yield from ns.read_parquet(key, ["address", "size", "old_since"]).to_batches()


def _aged(
    rows: pa.Table,
    metarange_ids: list[str],
    plan: RetentionInput,
    cutoff: datetime,
    late_writes: timedelta,
) -> tuple[pa.Table, pa.Array]:
    """Rows whose slice was opened `late_writes` before the cutoff, with their attribution
    (from the newest metarange holding each, `metarange_ids`); and the mask of `rows` they
    are (the rest may be too young)."""
    addresses = rows.column("address").to_pylist()
    slices = [a.split("/", 2)[1] for a in addresses]
    opened = {s: slice_time(s) for s in set(slices)}
    old_since = [_plus(opened[s], late_writes) for s in slices]
    keep = [t is not None and t <= cutoff for t in old_since]
    who = plan.attribution()
    attributed = [who.get(m) for m in metarange_ids]
    table = pa.table(
        {
            "address": addresses,
            "size": rows.column("size").to_pylist(),
            "slice": slices,
            "old_since": old_since,
            "commit": [a.commit_id if a else None for a in attributed],
            "month": [a.month if a else None for a in attributed],
            "branch": [a.branch if a else None for a in attributed],
        },
        schema=CANDIDATE_SCHEMA,
    )
    mask = pa.array(keep, pa.bool_())
    return table.filter(mask), mask


def _plus(opened: datetime | None, late_writes: timedelta) -> datetime | None:
    return None if opened is None else opened + late_writes


def _write(ns: Namespace, run_id: str, table: pa.Table, per_file: int) -> list[str]:
    keys = []
    for number, start in enumerate(range(0, table.num_rows, per_file)):
        key = f"{run_prefix(run_id)}{CANDIDATES}/{EXPIRED_FILE_PREFIX}{part_name(number)}"
        ns.write_parquet(key, table.slice(start, per_file))
        keys.append(key)
    return keys


LISTED_PER_READ = 1024
"""Metaranges read at once before their rows are reduced to what is kept."""
LISTED_SCHEMA = pa.schema(
    [("metarange", pa.int32()), ("range_id", pa.string()), ("start", pa.string())]
)


def _listed(
    ns: Namespace, layout: CommittedLayout, metaranges: list[str], known: pa.Array | None = None
) -> pa.Table:
    """A row per range each of `metaranges` lists (`LISTED_SCHEMA`: the metarange's position
    in `metaranges`, the range, its first path), less the ranges `known` names. Read on the
    driver: a metarange is one small file of range ids, and a Spark job to read them cost
    more than the reads (and a collect of its rows). Held in Arrow and reduced as it is read,
    `LISTED_PER_READ` metaranges at a time: a year of daily commits lists millions of pairs,
    nearly all of them ranges an active commit lists too."""
    columns = [layout.metarange_range_column, layout.metarange_min_key_column]
    parts = [LISTED_SCHEMA.empty_table()]
    for first in range(0, len(metaranges), LISTED_PER_READ):
        chunk = metaranges[first : first + LISTED_PER_READ]
        keys = [layout.metarange_key(m) for m in chunk]
        tables = list(ns.map_keys(keys, lambda key: ns.read_parquet(key, columns)))
        counts = [table.num_rows for table in tables]
        positions = np.arange(first, first + len(chunk), dtype=np.int32)
        rows = pa.table(
            [
                np.repeat(positions, counts),
                _column(tables, 0, pa.string()),
                _column(tables, 1, pa.string()),
            ],
            schema=LISTED_SCHEMA,
        )
        if known is not None:
            rows = rows.filter(pc.invert(pc.is_in(rows.column("range_id"), known)))
        parts.append(rows)
    return pa.concat_tables(parts)


def _by_start(rows: pa.Table) -> list[str]:
    """The distinct ranges of listing `rows`, by first path: the versions of one stretch of
    paths then sit together in a task's batch, so its merge by address folds the many rows
    an unchanged file has in them into one (in id order, a batch held few versions of each
    stretch, and the rows went on to the shuffle)."""
    distinct = rows.group_by(["range_id", "start"], use_threads=False).aggregate([])
    ordered = distinct.sort_by([("start", "ascending"), ("range_id", "ascending")])
    return ordered.column("range_id").to_pylist()


def _internal(ns: Namespace, table: pa.Table) -> pa.Table:
    """The rows of `table` whose first column is an address inside the namespace. Applied
    to a batch's merged rows, not to each range's: the check is per distinct address."""
    return table.filter(pc.invert(external_mask(table.column(0), ns.store.url)))


def _column(tables: list[pa.Table], index: int, kind: pa.DataType) -> pa.ChunkedArray:
    return pa.chunked_array(
        [chunk for table in tables for chunk in pc.cast(table.column(index), kind).chunks], kind
    )


def _range_addresses(
    ns: Namespace, layout: CommittedLayout, keys: list[str]
) -> Iterator[pa.RecordBatch]:
    """The ranges' internal addresses, distinct within each batch of ranges."""
    for start in range(0, len(keys), RANGES_PER_BATCH):
        batch = keys[start : start + RANGES_PER_BATCH]
        tables = [ns.read_parquet(key, [layout.range_address_column]) for key in batch]
        unique = pc.unique(_column(tables, 0, pa.string()))
        yield from _internal(ns, pa.table([unique], names=["address"])).to_batches()


def _expired_addresses(
    ns: Namespace,
    layout: CommittedLayout,
    owners: dict[str, tuple[int, int]],
    keys: list[str],
) -> Iterator[pa.RecordBatch]:
    """Each batch of ranges' internal addresses, one row per address (`EXPIRED_DDL`):
    `owners` gives each range key's position and its newest metarange's (`Owners.of`).
    A batch's ranges may list an address twice only where one range holds it at two paths;
    the grouping in Spark makes each address's ranges distinct. The active side is taken
    out afterwards by the anti-join in Spark."""
    columns = [layout.range_address_column, layout.range_size_column]
    for start in range(0, len(keys), RANGES_PER_BATCH):
        batch = keys[start : start + RANGES_PER_BATCH]
        tables = [ns.read_parquet(key, columns) for key in batch]
        counts = [table.num_rows for table in tables]
        if not sum(counts):
            continue
        held = np.array([owners[key] for key in batch], np.int32)
        rows = pa.table(
            {
                "address": _column(tables, 0, pa.string()),
                "size": _column(tables, 1, pa.int64()),
                "range": np.repeat(held[:, 0], counts),
                "newest": np.repeat(held[:, 1], counts),
            }
        )
        merged = rows.group_by("address", use_threads=False).aggregate(
            [("size", "max"), ("newest", "max"), ("range", "list")]
        )
        names = ["address", "size_max", "newest_max", "range_list"]
        yield from _internal(
            ns,
            pa.table(
                [merged.column(name) for name in names],
                names=["address", "size", "newest", "ranges"],
            ),
        ).to_batches()


def _addresses_of(ns: Namespace, layout: CommittedLayout, metaranges: set[str]) -> set[str]:
    """Every address of `metaranges`, read on the driver: the re-check's few commits."""
    found: set[str] = set()
    for metarange in sorted(metaranges):
        ranges = ns.read_parquet(layout.metarange_key(metarange), [layout.metarange_range_column])
        for range_id in set(ranges.column(0).to_pylist()):
            table = ns.read_parquet(layout.range_key(range_id), [layout.range_address_column])
            found.update(table.column(0).to_pylist())
    return found


def _tasks(keys: list[str], readers: int) -> int:
    return max(1, min(readers, -(-len(keys) // FILES_PER_TASK)))


def _sum(column: pa.ChunkedArray) -> int:
    total = pc.sum(column).as_py()
    return int(total or 0)
