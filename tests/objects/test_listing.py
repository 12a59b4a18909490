"""What GC needs of every object store: one folder level with sizes and mtimes
(`list_folder`), `stat` of many keys at once (`stat_many`), and bulk deletes in parallel
batches; on local files and on SeaweedFS (with and without a key prefix)."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from branchwater.engine.errors import InvalidArgument
from branchwater.engine.objects import ObjectStore
from branchwater.engine.objects import s3 as s3_module
from branchwater.engine.objects.s3 import S3ObjectStore

SLACK_NS = int(timedelta(seconds=2) / timedelta(microseconds=1)) * 1000
"""S3 reports whole seconds."""


def now_ns() -> int:
    return (
        int((datetime.now(UTC) - datetime(1970, 1, 1, tzinfo=UTC)) / timedelta(microseconds=1))
        * 1000
    )


def seed(store: ObjectStore) -> None:
    for key in ("top", "data/s1/a", "data/s1/bb", "data/s1/deeper/c", "data/s2/d", "data-x"):
        store.put(key, key.encode())


def test_list_folder_gives_one_level_with_sizes_and_mtimes(store: ObjectStore) -> None:
    before = now_ns()
    seed(store)
    after = now_ns()

    level = store.list_folder("data/s1")

    assert level.sizes is not None and level.mtimes_ns is not None
    found = dict(zip(level.names, level.sizes, strict=True))
    assert found == {"a": len("data/s1/a"), "bb": len("data/s1/bb")}
    assert level.directories == ["deeper"]
    for mtime, name in zip(level.mtimes_ns, level.names, strict=True):
        assert before - SLACK_NS <= mtime <= after + SLACK_NS, name
    assert sorted(store.list_folder("data").directories) == ["s1", "s2"]
    assert store.list_folder("data").names == []


def test_list_folder_of_the_root_and_of_nothing(store: ObjectStore) -> None:
    seed(store)
    root = store.list_folder("")
    assert sorted(root.names) == ["data-x", "top"]
    assert root.directories == ["data"]
    empty = store.list_folder("no/such/folder")
    assert (empty.names, empty.directories) == ([], [])
    assert store.list_folder("top").names == []


def test_list_folder_without_metadata_still_names_everything(store: ObjectStore) -> None:
    seed(store)
    level = store.list_folder("data/s1", metadata=False)
    assert sorted(level.names) == ["a", "bb"]
    assert level.directories == ["deeper"]
    if level.sizes is not None:
        assert sorted(level.sizes) == [len("data/s1/a"), len("data/s1/bb")]


@pytest.mark.parametrize("folder", ["data/", "/data", "a//b", "../x", 3])
def test_list_folder_refuses_malformed_folders(store: ObjectStore, folder: object) -> None:
    with pytest.raises(InvalidArgument):
        store.list_folder(folder)  # type: ignore[arg-type]


def test_stat_many_gives_objects_sizes_and_none_for_the_rest(store: ObjectStore) -> None:
    seed(store)
    keys = ["data/s1/a", "data/s1", "missing", "data/s2/d", "data/s1/deeper/c"]

    found = store.stat_many(keys)

    assert found.sizes == [len("data/s1/a"), None, None, len("data/s2/d"), len("data/s1/deeper/c")]
    single = store.stat("data/s2/d").mtime
    mtime = found.mtimes_ns[3]
    assert mtime is not None
    assert abs(datetime.fromtimestamp(mtime / 1e9, UTC) - single) <= timedelta(seconds=2)
    assert [m is None for m in found.mtimes_ns] == [False, True, True, False, False]
    assert store.stat_many([]).sizes == []


def test_bulk_delete_of_many_keys_in_batches_keeps_the_rest(
    store: ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(s3_module, "DELETE_BATCH", 7)
    keys = [f"data/s/{i:03d}" for i in range(60)]
    for key in [*keys, "keep/a", "data/s-keep"]:
        store.put(key, b"v")
    store.delete(iter([*keys, "data/s/never-was"]))
    assert [i.key for i in store.list_objects()] == ["data/s-keep", "keep/a"]


@pytest.mark.s3
def test_s3_bulk_delete_sends_batches_in_parallel(
    s3_store: S3ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two batches are seen in flight at once: each waits for the other to start."""
    monkeypatch.setattr(s3_module, "DELETE_BATCH", 2)
    for i in range(4):
        s3_store.put(f"k{i}", b"v")
    started = threading.Barrier(2, timeout=30)
    real = s3_store._delete_batch

    def meeting(full_keys: list[str]) -> None:
        started.wait()
        real(full_keys)

    monkeypatch.setattr(s3_store, "_delete_batch", meeting)
    s3_store.delete([f"k{i}" for i in range(4)])
    assert list(s3_store.list_objects()) == []


@pytest.mark.s3
def test_s3_a_failed_batch_fails_the_delete_and_sends_no_more(
    s3_store: S3ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(s3_module, "DELETE_BATCH", 1)
    monkeypatch.setattr(s3_module, "REQUESTS_IN_FLIGHT", 1)
    for i in range(5):
        s3_store.put(f"k{i}", b"v")
    real = s3_store._delete_batch

    def failing(full_keys: list[str]) -> None:
        if full_keys == ["k1"]:
            raise s3_module.Unavailable("injected")
        real(full_keys)

    monkeypatch.setattr(s3_store, "_delete_batch", failing)
    with pytest.raises(s3_module.Unavailable, match="injected"):
        s3_store.delete([f"k{i}" for i in range(5)])
    assert [i.key for i in s3_store.list_objects()] == ["k1", "k2", "k3", "k4"]
