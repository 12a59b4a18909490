"""Fixtures for uncommitted-GC tests: a lake with a clock the test moves, and helpers."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pytest

from branchwater.engine import Lake
from branchwater.engine.api import Repository
from branchwater.engine.gc.context import GCContext
from branchwater.engine.gc.prepare import PreparedRun, read_run
from branchwater.engine.gc.settings import GCSettings
from branchwater.engine.graveler import commit as commit_ops
from branchwater.engine.graveler.committed import RangePolicy
from branchwater.engine.graveler.iterators import combine

START = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


class FakeClock:
    """Wall time that moves only when a test says so."""

    def __init__(self, now: datetime = START) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta) -> None:
        self.now += delta


def use_clock(lake: Lake, clock: FakeClock, settings: GCSettings | None = None) -> None:
    """Give the lake's GC a fake clock (and settings)."""
    lake.gc.close()
    lake.gc = GCContext(lake.graveler.kv, settings, clock=clock)


@pytest.fixture
def lake() -> Iterator[Lake]:
    with Lake.connect(
        "memory://", range_policy=RangePolicy(target_entries=8, max_entries=32)
    ) as lake:
        yield lake


@pytest.fixture
def repo(lake: Lake, tmp_path: Path) -> Repository:
    return lake.create_repository("sales", storage_namespace=f"file://{tmp_path}/sales")


def compact(repo: Repository, branch_name: str) -> str:
    """Staging compaction by hand, as issue 11's compactor leaves a branch: sealed tokens
    applied on the base, the result in `compacted_metarange_id`, no sealed tokens left."""
    g, record = repo.lake.graveler, repo.record
    commit_ops.seal(g, record, branch_name, allow_empty=True)
    branch, predicate = g.refs.get_branch(record, branch_name)
    base = g.base_metarange(record, branch)
    changes = combine([g.staging.scan(token) for token in branch.sealed_tokens])
    metarange_id = g.committed(record).apply(base, changes)
    compacted = dataclasses.replace(branch, sealed_tokens=(), compacted_metarange_id=metarange_id)
    assert g.try_update_branch(record, compacted, predicate)
    g.drop_tokens_later(branch.sealed_tokens)
    return metarange_id


def run_table(repo: Repository, run: PreparedRun) -> pa.Table:
    return read_run(repo.lake.graveler.objects(repo.storage_namespace), run.run_id)


def rows(repo: Repository, run: PreparedRun) -> set[tuple[str, str, str]]:
    """(address, branch, source) of every row of a finished run."""
    table = run_table(repo, run)
    return set(
        zip(
            table.column("address").to_pylist(),
            table.column("branch").to_pylist(),
            table.column("source").to_pylist(),
            strict=True,
        )
    )


def addresses(repo: Repository, run: PreparedRun) -> set[str]:
    return {address for address, _, _ in rows(repo, run)}
