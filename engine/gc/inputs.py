"""What a GC job reads besides the namespace itself: every commit's metarange, and a finished
prepare run, both as keys of Parquet files it reads straight from storage.

Commits are never deleted, so the set of committed addresses only grows: a job that has read
a range once knows its addresses for good, and later runs need only ranges new since then.
Ranges, metaranges and prepare runs are plain Parquet, so the job reads them with Spark or
pyarrow instead of through the engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from branchwater.engine.gc.prepare import RETENTION_PREFIX, read_manifest
from branchwater.engine.graveler.committed import EMPTY_METARANGE_ID
from branchwater.engine.graveler.committed.format import metarange_key, range_key
from branchwater.engine.graveler.graveler import Graveler
from branchwater.engine.graveler.model import RepositoryRecord
from branchwater.engine.objects import ObjectStore

METARANGE_RANGE_COLUMN = "range_id"
METARANGE_MIN_KEY_COLUMN = "min_key"
RANGE_ADDRESS_COLUMN = "address"
RANGE_SIZE_COLUMN = "size"
UNCOMMITTED_ADDRESS_COLUMN = "address"


@dataclass(frozen=True)
class CommittedLayout:
    """Every commit's metarange in one repository, and how to find their Parquet files.

    `metaranges` maps each commit id to its metarange id; commits of an empty tree are left
    out (their metarange is never stored). Keys are relative to `storage_namespace`.
    """

    storage_namespace: str
    metaranges: dict[str, str]
    metarange_range_column: str = METARANGE_RANGE_COLUMN
    metarange_min_key_column: str = METARANGE_MIN_KEY_COLUMN
    range_address_column: str = RANGE_ADDRESS_COLUMN
    range_size_column: str = RANGE_SIZE_COLUMN

    def metarange_ids(self) -> list[str]:
        """Distinct metarange ids, sorted: many commits share one (a merge, a revert)."""
        return sorted(set(self.metaranges.values()))

    @staticmethod
    def metarange_key(metarange_id: str) -> str:
        return metarange_key(metarange_id)

    @staticmethod
    def range_key(range_id: str) -> str:
        return range_key(range_id)


@dataclass(frozen=True)
class UncommittedRun:
    """A finished prepare run: its start (what a GC job's cutoff is measured from), its
    Parquet files (keys in the namespace) and the lake's time limits it ran under."""

    run_id: str
    started_at: datetime
    keys: tuple[str, ...]
    token_expiry: timedelta
    default_min_age: timedelta
    address_column: str = UNCOMMITTED_ADDRESS_COLUMN


def committed_layout(g: Graveler, repo: RepositoryRecord) -> CommittedLayout:
    """Read every commit record (one KV scan), reachable from a ref or not."""
    metaranges = {
        commit.id: commit.metarange_id
        for commit in g.refs.list_commits(repo)
        if commit.metarange_id != EMPTY_METARANGE_ID
    }
    return CommittedLayout(repo.storage_namespace, metaranges)


def uncommitted_run(objects: ObjectStore, run_id: str, repository_id: str) -> UncommittedRun:
    """A finished prepare run of the repository, from its manifest; `NotFound` while it is
    unfinished."""
    manifest = read_manifest(objects, run_id, repository_id)
    return UncommittedRun(
        run_id,
        datetime.fromisoformat(manifest["started_at"]),
        tuple(f"{RETENTION_PREFIX}{run_id}/{name}" for name in manifest["files"]),
        timedelta(seconds=manifest["token_expiry_seconds"]),
        timedelta(seconds=manifest["min_age_seconds"]),
    )
