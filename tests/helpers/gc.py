"""Uncommitted GC: clocks, prepare runs read back, garbage, and the GC job run in-process."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from branchwater.engine.api import Branch, Lake, Repository
from branchwater.engine.gc.addresses import newest_first_id
from branchwater.engine.gc.context import GCContext
from branchwater.engine.gc.prepare import MANIFEST, RETENTION_PREFIX, PreparedRun, read_run
from branchwater.engine.gc.runs import files, statuses
from branchwater.engine.gc.runs.config import CLEAN
from branchwater.engine.gc.runs.files import RunSummary
from branchwater.engine.gc.runs.pruning import PRUNED_SETS
from branchwater.engine.gc.runs.storage import Namespace
from branchwater.engine.gc.settings import GCSettings
from branchwater.engine.graveler.fence import (
    FENCE_PREFIX,
    OPERATION_MARGIN,
    Claim,
    FenceRecord,
    fence_key,
)
from branchwater.engine.graveler.model import RepositoryRecord
from branchwater.engine.kv import Store
from branchwater.engine.objects import ObjectInfo, ObjectStore

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


class FakeClock:
    """Wall time that moves only when a test says so."""

    def __init__(self, now: datetime = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta) -> None:
        self.now += delta


def run_summary(**fields: Any) -> RunSummary:
    """A finished clean dry run's summary of repository `sales`, as the GC job saves one;
    `fields` replace what a test is about."""
    now = "2026-03-01T12:00:00+00:00"
    defaults: dict[str, Any] = {
        "run_id": "18f2a9c3b7d1-a1b2c3",
        "repository": "sales",
        "repository_id": "0123456789abcdef",
        "storage_namespace": "file:///sales",
        "mode": CLEAN,
        "requested_mode": CLEAN,
        "dry_run": True,
        "started_at": now,
        "prepare_started_at": now,
        "cutoff": now,
        "min_age_seconds": 0.0,
        "default_min_age_seconds": 0.0,
    }
    return RunSummary(**{**defaults, **fields})


def saved_run(
    ns: Namespace,
    started: datetime,
    repository_id: str,
    status: str,
    repository_id_of_run: str | None = None,
    prepared: bool = True,
) -> str:
    """A run as the GC job leaves it: summary, report, its data sets and (`prepared`) its
    prepare output; `repository_id_of_run` gives it to another repository."""
    run_id = newest_first_id(started)
    prefix = files.run_prefix(run_id)
    data = {name: [f"{prefix}{name}/part-00000.parquet"] for name in PRUNED_SETS}
    for keys in data.values():
        ns.store.put(keys[0], b"rows")
    summary = run_summary(
        run_id=run_id,
        repository_id=repository_id_of_run or repository_id,
        status=status,
        gate_success=status != statuses.GATE_FAILED,
        considered_through=started.isoformat(),
        files={name: data[name] for name in (files.CANDIDATES, files.DELETED)},
    )
    files.write_summary(ns, summary)
    ns.store.put(prefix + files.REPORT, b"<html></html>")
    if prepared:
        save_prepared(ns, run_id)
    return run_id


def save_prepared(ns: Namespace, run_id: str, finished: bool = True) -> None:
    """A prepare run's output; `finished` writes its manifest."""
    prefix = f"{RETENTION_PREFIX}{run_id}/"
    ns.store.put(prefix + "part-00000.parquet", b"rows")
    if finished:
        ns.store.put(prefix + MANIFEST, b"{}")


def upload_to(branch: Branch, address: str, data: bytes) -> None:
    """Write `data` at `address` as another tool would before linking it."""
    repo = branch.repository
    repo.lake.graveler.objects(repo.storage_namespace).put(address, data)


def staged_paths(branch: Branch) -> list[str]:
    return [c.path for c in branch.uncommitted()]


def use_clock(lake: Lake, clock: FakeClock, settings: GCSettings | None = None) -> None:
    """Give the lake's GC a fake clock (and settings)."""
    lake.gc.close()
    lake.gc = GCContext(lake.graveler.kv, settings, clock=clock)


def compact(repo: Repository, branch_name: str) -> str | None:
    """Staging compaction through `Branch.compact()`; the compacted metarange, or None when
    nothing was staged (the branch is left as it was)."""
    result = repo.branch(branch_name).compact()
    assert result.outcome in ("compacted", "nothing-staged"), result
    return result.metarange_id


def run_table(repo: Repository, run: PreparedRun) -> pa.Table:
    return read_run(repo.lake.graveler.objects(repo.storage_namespace), run.run_id)


def run_rows(repo: Repository, run: PreparedRun) -> set[tuple[str, str, str]]:
    """(address, branch, source) of every row of a finished run."""
    table = run_table(repo, run)
    columns = [table.column(name).to_pylist() for name in ("address", "branch", "source")]
    return set(zip(*columns, strict=True))


def run_addresses(repo: Repository, run: PreparedRun) -> set[str]:
    return {address for address, _, _ in run_rows(repo, run)}


def put_garbage(lake: Lake, repo: Repository, count: int = 1) -> list[str]:
    """Objects written at fresh addresses that no entry will ever name."""
    objects = lake.graveler.objects(repo.storage_namespace)
    keys = [lake.addresses.next_address() for _ in range(count)]
    for key in keys:
        objects.put(key, b"garbage")
    return keys


def data_objects(lake: Lake, repo: Repository) -> dict[str, ObjectInfo]:
    """Every object under the repository's `data/`, by key."""
    objects = lake.graveler.objects(repo.storage_namespace)
    return {info.key: info for info in objects.list_objects("data/")}


@dataclasses.dataclass
class GCLake:
    """A lake on SQLite with one repository, and the job run on the test session's Spark.

    Runs default to a zero minimum age (objects written before the run count) and no bound
    on the candidates' share, since test histories are mostly garbage.
    """

    spark: SparkSession
    lake: Lake
    repo: Repository
    kv_url: str
    s3_options: dict[str, str]

    @property
    def objects(self) -> ObjectStore:
        return self.lake.graveler.objects(self.repo.storage_namespace)

    def run(self, events: Callable[[dict[str, Any]], None] | None = None, **settings: Any) -> Any:
        """Run the GC job in this process; returns its `RunSummary`."""
        from branchwater.engine.gc.runs.config import JobConfig
        from branchwater.spark_jobs.gc.job import GCJob

        settings.setdefault("min_age", timedelta(0))
        settings.setdefault("max_share", 1.0)
        config = JobConfig(self.kv_url, self.repo.name, s3_options=self.s3_options, **settings)
        return GCJob(self.spark, config, events).run()

    def data_objects(self) -> dict[str, ObjectInfo]:
        return data_objects(self.lake, self.repo)

    def put_garbage(self, count: int = 1) -> list[str]:
        return put_garbage(self.lake, self.repo, count)


ROWID_KV_TABLE = (
    "CREATE TABLE branchwater_kv (partition_key BLOB NOT NULL, key BLOB NOT NULL, "
    "value BLOB NOT NULL, PRIMARY KEY (partition_key, key))"
)
"""The SQLite table as stores made before the `WITHOUT ROWID` layout created it."""


def rowid_sqlite_file(path: Path) -> str:
    """A SQLite KV file in the older rowid layout; returns its URL."""
    import sqlite3

    with sqlite3.connect(path) as conn:
        conn.execute(ROWID_KV_TABLE)
    return f"sqlite:///{path}"


def record_expired(
    kv: Store, repo: RepositoryRecord, commit_ids: Iterable[str], when: datetime, run_id: str
) -> None:
    """Record `commit_ids` as expired by run `run_id` at `when`, whatever their keys hold, as
    a sweep leaves them (`expire_fenced`, which checks their fences first)."""
    value = FenceRecord(run_id, expired=when.isoformat()).encode()
    for commit_id in commit_ids:
        kv.set(repo.partition, fence_key(commit_id), value)


def dropped_file_history(repo: Repository, ago: timedelta) -> tuple[str, str]:
    """root (t/a) ← old (adds t/b) ← new (drops t/b, adds t/c) on main, `ago` back: under
    30 days' retention `old` is the one commit expired and t/b's object the one candidate.
    Returns `old` and t/b's address; the refs' clock is the real one again after."""
    refs = repo.lake.graveler.refs
    clock = FakeClock(datetime.now(UTC) - ago)
    refs.clock = clock
    main = repo.branch("main")
    main.upload("t/a", b"a")
    main.commit("root")
    clock.advance(timedelta(days=1))
    t_b = main.upload("t/b", b"b-old").address
    old = main.commit("old").id
    clock.advance(timedelta(days=1))
    main.delete("t/b")
    main.upload("t/c", b"c")
    main.commit("new")
    refs.clock = lambda: datetime.now(UTC)
    return old, t_b


def age_claims(repo: Repository) -> None:
    """Let the operation margin pass for every move's claim in the repository (a move's
    write, if it was going to make one, has landed by then)."""
    kv: Store = repo.lake.graveler.kv
    aged = Claim(datetime.now(UTC) - OPERATION_MARGIN).encode()
    for item in kv.scan(repo.record.partition, FENCE_PREFIX):
        if not item.key.startswith(FENCE_PREFIX):
            break
        if b"claimed" in item.value:
            kv.set_if(repo.record.partition, item.key, aged, item.value)


def hold_passes(repo: Repository) -> None:
    """What the repository's retention records look like once `EXPIRING_HOLD` has passed:
    every expiring record lapsed (its `until` just past); an expired one never lapses."""
    kv: Store = repo.lake.graveler.kv
    lapsed_at = datetime.now(UTC) - timedelta(seconds=1)
    for item in kv.scan(repo.record.partition, FENCE_PREFIX):
        if not item.key.startswith(FENCE_PREFIX):
            break
        if b"expiring" in item.value:
            record = FenceRecord.decode(item.value)
            lapsed = FenceRecord(record.run, until=lapsed_at).encode()
            kv.set_if(repo.record.partition, item.key, lapsed, item.value)


RUN_ID = "18f2a9c3b7d1-a1b2c3"
"""The run of `saved_mark`."""


def saved_mark(repo: Repository, min_age: timedelta, **fields: Any) -> Namespace:
    """A mark with nothing to delete, saved in `repo`'s namespace as the GC job saves one."""
    ns = Namespace.of(repo.storage_namespace)
    mark: dict[str, Any] = {
        "run_id": RUN_ID,
        "repository": repo.name,
        "repository_id": repo.record.unique_id,
        "storage_namespace": repo.storage_namespace,
        "dry_run": False,
        "gate_success": True,
        "min_age_seconds": min_age.total_seconds(),
    }
    summary = run_summary(**{**mark, **fields})
    files.write_summary(ns, summary)
    return ns
