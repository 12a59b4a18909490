"""`RefStore` records: how commits are made, and what listing branches costs."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from branchwater.engine import Lake
from branchwater.engine.graveler.refs import commit_id_for


@pytest.fixture
def lake() -> Lake:
    with Lake.connect("memory://") as lake:
        yield lake


@pytest.fixture
def repo(lake: Lake, tmp_path: Path):
    return lake.create_repository("sales", storage_namespace=f"file://{tmp_path}/sales")


def test_add_commit_derives_generation_and_id(lake: Lake, repo) -> None:
    refs, record = lake.graveler.refs, repo.record
    root = refs.get_commit(record, repo.branch("main").commit_id)
    assert root.generation == 1 and root.parents == ()
    side = refs.add_commit(record, (root,), root.metarange_id, "side", {"k": "v"})
    when = datetime(2026, 11, 1, tzinfo=timezone.utc)
    joined = refs.add_commit(
        record, (root, side), root.metarange_id, "join", committer="me", creation_date=when
    )
    assert side.generation == 2 and side.parents == (root.id,) and side.metadata == {"k": "v"}
    assert joined.generation == 3 and joined.parents == (root.id, side.id)
    assert joined.creation_date == when and joined.committer == "me"
    for commit in (side, joined):
        assert commit.id == commit_id_for(commit)
        assert refs.get_commit(record, commit.id) == commit
