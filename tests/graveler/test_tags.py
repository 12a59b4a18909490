"""Tags, and the name a branch and a tag may not share: resolution would read one of them
and hide the other (a branch named `release` made every read of the tag `release` read the
branch). Run on SQLite and on the PostgreSQL server; creations at once, in processes."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from branchwater.engine import AlreadyExists, Lake
from branchwater.engine.api import Repository
from branchwater.engine.graveler.model import BranchRecord, Tag
from branchwater.engine.graveler.staging import new_staging_token
from tests.helpers.servers import forked_pool


@pytest.fixture
def repo(race_kv: str, tmp_path: Path) -> Iterator[Repository]:
    with Lake.connect(race_kv) as lake:
        created = lake.create_repository("sales", f"file://{tmp_path}/sales")
        main = created.branch("main")
        main.upload("f", b"v1")
        main.commit("v1")
        yield created


def test_a_branch_is_not_created_under_a_tags_name(repo: Repository) -> None:
    repo.tag("release", "main")
    with pytest.raises(AlreadyExists, match="a tag named 'release' exists"):
        repo.create_branch("release")
    assert [b.name for b in repo.branches()] == ["main"]
    assert repo.ref("release").read("f") == b"v1"


def test_a_tag_is_not_created_under_a_branchs_name(repo: Repository) -> None:
    with pytest.raises(AlreadyExists, match="a branch named 'main' exists"):
        repo.tag("main", "main")
    assert repo.tags() == []


def test_a_tag_meeting_a_branch_inserted_before_its_check_takes_itself_back(
    repo: Repository,
) -> None:
    """A branch creation between its insert and its own check: the tag sees it and goes."""
    g, record = repo._g, repo.record
    head = repo.branch("main").head().id
    g.refs.insert_branch(record, BranchRecord("v1", head, new_staging_token(record, "v1")))
    with pytest.raises(AlreadyExists, match="a branch named 'v1' exists"):
        repo.tag("v1", "main")
    assert repo.tags() == []


def test_a_branch_meeting_a_tag_inserted_before_its_check_takes_itself_back(
    repo: Repository,
) -> None:
    g, record = repo._g, repo.record
    g.refs.insert_tag(record, Tag("v1", repo.branch("main").head().id))
    with pytest.raises(AlreadyExists, match="a tag named 'v1' exists"):
        repo.create_branch("v1")
    assert [b.name for b in repo.branches()] == ["main"]


NAMES = 20


def _create(kv_url: str, kind: str, barrier) -> list[str]:
    """Create a `kind` of each name at once with the other process; the names it got."""
    won = []
    with Lake.connect(kv_url) as lake:
        repo = lake.repository("sales")
        for i in range(NAMES):
            barrier.wait(30)
            with contextlib.suppress(AlreadyExists):
                repo.create_branch(f"n{i}") if kind == "branch" else repo.tag(f"n{i}", "main")
                won.append(f"n{i}")
    return won


@pytest.mark.slow
def test_a_branch_and_a_tag_created_at_once_never_share_a_name(
    repo: Repository, race_kv: str
) -> None:
    with forked_pool(2) as (manager, pool):
        barrier = manager.Barrier(2)
        made = [pool.apply_async(_create, (race_kv, kind, barrier)) for kind in ("branch", "tag")]
        branches, tags = (set(result.get(240)) for result in made)
    assert not branches & tags
    assert branches == {b.name for b in repo.branches()} - {"main"}
    assert tags == {t.name for t in repo.tags()}
