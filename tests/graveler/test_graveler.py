"""The shared context's own steps, on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest

from branchwater.engine import Lake, LakeClosed, NotFound
from tests.helpers.committed import entry


def test_a_write_to_a_deleted_branch_leaves_no_row_in_its_token(
    race_kv: str, tmp_path: Path
) -> None:
    """A writer holding the branch's record from before another process deleted it writes
    to a token whose partition is dropped already: refused, and nothing of it stays."""
    with Lake.connect(race_kv) as lake, Lake.connect(race_kv) as other:
        repo = lake.create_repository("sales", storage_namespace=f"file://{tmp_path}/sales")
        repo.create_branch("late", source="main")
        g = lake.graveler
        token = g.read_branch(repo.record, "late").staging_token
        other.repository("sales").delete_branch("late")
        assert other.wait_for_cleanup(30)
        with pytest.raises(NotFound, match="branch 'late' not found"):
            g.stage(repo.record, "late", token, "late.txt", entry("late.txt"))
        assert list(g.kv.scan(token.encode())) == []


def test_a_namespace_opened_while_the_lake_closes_is_refused_and_the_kv_store_still_closes(
    tmp_path: Path,
) -> None:
    """Another thread's first read of a namespace while the lake closes gets `LakeClosed`
    (no store opens after the ones being closed were taken), and the KV store is closed
    even when closing one of the stores fails."""
    lake = Lake.connect(f"sqlite:///{tmp_path}/kv.db")
    repo = lake.create_repository("sales", storage_namespace=f"file://{tmp_path}/ns")
    g = lake.graveler
    committed = g.committed(repo.record)
    closing = committed.close

    def close_while_another_opens() -> None:
        with pytest.raises(LakeClosed):
            g.objects(f"file://{tmp_path}/other")
        closing()
        raise OSError("a store failed to close")

    committed.close = close_while_another_opens  # type: ignore[method-assign]
    with pytest.raises(OSError, match="failed to close"):
        lake.close()
    assert not g.kv._connections  # type: ignore[attr-defined]
