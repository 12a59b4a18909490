"""`RefStore` records: how commits are made, and what listing branches costs."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timezone

import pytest

from branchwater.engine import Lake, NotFound
from branchwater.engine.graveler.graveler import Graveler
from branchwater.engine.graveler.refs import (
    GRAVELER_PARTITION,
    REPOS_PREFIX,
    TO_DELETE_PREFIX,
    commit_id_for,
)
from branchwater.engine.kv.memory import MemoryStore
from branchwater.engine.kv.store import DEFAULT_BATCH_SIZE, KeyValue, ValueWithPredicate

Call = tuple[str, bytes, bytes]
"""(method, partition, key or scan start)."""


class CountingStore(MemoryStore):
    """A memory store that records each call an operation makes: its cost in round trips."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[Call] = []

    def get(self, partition: bytes, key: bytes) -> ValueWithPredicate:
        self.calls.append(("get", partition, key))
        return super().get(partition, key)

    def set(self, partition: bytes, key: bytes, value: bytes) -> None:
        self.calls.append(("set", partition, key))
        super().set(partition, key, value)

    def delete(self, partition: bytes, key: bytes) -> None:
        self.calls.append(("delete", partition, key))
        super().delete(partition, key)

    def delete_guarded(
        self, partition: bytes, key: bytes, guard: tuple[bytes, bytes], expected: bytes
    ) -> bool:
        self.calls.append(("delete_guarded", partition, key))
        return super().delete_guarded(partition, key, guard, expected)

    def scan(
        self, partition: bytes, start: bytes = b"", batch_size: int = DEFAULT_BATCH_SIZE
    ) -> Iterator[KeyValue]:
        self.calls.append(("scan", partition, start))
        return super().scan(partition, start, batch_size)


@pytest.fixture
def kv() -> CountingStore:
    return CountingStore()


@pytest.fixture
def lake(kv: CountingStore) -> Lake:
    with Lake(Graveler(kv)) as lake:
        yield lake


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


def test_listing_branches_is_one_scan(lake: Lake, repo, kv: CountingStore) -> None:
    for name in ("a", "b", "c", "d"):
        repo.create_branch(name, source="main")
    heads = {name: repo.ref(name).commit_id for name in ("main", "a", "b", "c", "d")}
    kv.calls.clear()
    records = list(lake.graveler.refs.branches(repo.record))
    assert {b.name: b.commit_id for b in records} == heads
    assert [b.name for b in repo.branches()] == ["a", "b", "c", "d", "main"]
    partition = repo.record.partition
    assert kv.calls == [("scan", partition, b"branches/")] * 2


def test_branches_and_tags_page_by_name(repo) -> None:
    for name in ("a", "b", "c"):
        repo.create_branch(name, source="main")
        repo.tag(f"t{name}", "main")
    assert [b.name for b in repo.branches(limit=2)] == ["a", "b"]
    assert [b.name for b in repo.branches(after="b", limit=2)] == ["c", "main"]
    assert [b.name for b in repo.branches(after="bb")] == ["c", "main"]
    assert repo.branches(after="main") == []
    assert [t.name for t in repo.tags(after="ta", limit=1)] == ["tb"]
    assert [t.name for t in repo.tags(limit=0)] == []


def test_delete_repository_lists_its_partitions_once_before_the_record_goes(
    lake: Lake, repo, kv: CountingStore
) -> None:
    repo.create_branch("dev", source="main").upload("x", b"1")
    mark = TO_DELETE_PREFIX + b"repo/" + repo.record.partition
    kv.calls.clear()
    lake.delete_repository("sales")
    assert lake.wait_for_cleanup(timeout=30)
    marked = kv.calls.index(("set", GRAVELER_PARTITION, mark))
    removed = kv.calls.index(("delete_guarded", GRAVELER_PARTITION, REPOS_PREFIX + b"sales"))
    assert marked < removed
    assert [c for c in kv.calls if c[0] == "set" and c[1] == GRAVELER_PARTITION] == [
        ("set", GRAVELER_PARTITION, mark)
    ]
    assert list(lake.graveler.refs.partitions_to_delete()) == []


def test_a_delete_that_dies_before_dropping_is_finished_later(lake: Lake, repo, monkeypatch):
    """Killed after the record went: the repository is gone, the list still names its
    partitions, and the next collection drops them."""
    dev = repo.create_branch("dev", source="main")
    dev.upload("x", b"1")
    g = lake.graveler
    token = g.read_branch(repo.record, "dev").staging_token.encode()
    monkeypatch.setattr(g, "drop_listed_later", lambda mark, partitions: None)
    lake.delete_repository("sales")
    with pytest.raises(NotFound):
        lake.repository("sales")
    [listed] = g.refs.partitions_to_delete()
    assert {repo.record.partition, token} <= set(listed.partitions)
    assert g.collect_dropped_partitions() == 1
    assert list(g.kv.scan(repo.record.partition)) == [] and list(g.kv.scan(token)) == []
