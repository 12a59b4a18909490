"""The shared context's own steps, on SQLite and PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest

from branchwater.engine import Lake, NotFound
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
