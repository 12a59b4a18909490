"""Where a GC job finds every committed address: each commit's metarange and the Parquet keys.

Commits are never deleted, so the set of committed addresses only grows: a job that has read
a range once knows its addresses for good, and later runs need only ranges new since then.
Ranges and metaranges are plain Parquet, so the job reads them with Spark or pyarrow straight
from storage instead of through the engine.
"""

from __future__ import annotations

from dataclasses import dataclass

from branchwater.engine.graveler.committed import EMPTY_METARANGE_ID
from branchwater.engine.graveler.committed.format import metarange_key, range_key
from branchwater.engine.graveler.graveler import Graveler
from branchwater.engine.graveler.model import RepositoryRecord

METARANGE_RANGE_COLUMN = "range_id"
RANGE_ADDRESS_COLUMN = "address"
RANGE_PATH_COLUMN = "path"


@dataclass(frozen=True)
class CommittedLayout:
    """Every commit's metarange in one repository, and how to find their Parquet files.

    `metaranges` maps each commit id to its metarange id; commits of an empty tree are left
    out (their metarange is never stored). Keys are relative to `storage_namespace`.
    """

    storage_namespace: str
    metaranges: dict[str, str]
    metarange_range_column: str = METARANGE_RANGE_COLUMN
    range_address_column: str = RANGE_ADDRESS_COLUMN
    range_path_column: str = RANGE_PATH_COLUMN

    def metarange_ids(self) -> list[str]:
        """Distinct metarange ids, sorted: many commits share one (a merge, a revert)."""
        return sorted(set(self.metaranges.values()))

    @staticmethod
    def metarange_key(metarange_id: str) -> str:
        return metarange_key(metarange_id)

    @staticmethod
    def range_key(range_id: str) -> str:
        return range_key(range_id)


def committed_layout(g: Graveler, repo: RepositoryRecord) -> CommittedLayout:
    """Read every commit record (one KV scan), reachable from a ref or not."""
    metaranges = {
        commit.id: commit.metarange_id
        for commit in g.refs.list_commits(repo)
        if commit.metarange_id != EMPTY_METARANGE_ID
    }
    return CommittedLayout(repo.storage_namespace, metaranges)
