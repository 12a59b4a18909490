"""branch.copy: shallow and recorded for uncommitted sources, a real copy for committed ones."""

from __future__ import annotations

import io
import os
import tracemalloc
from datetime import timedelta

import pytest

from branchwater.engine import CorruptedData, Lake, NotFound
from branchwater.engine.api import Repository
from branchwater.engine.gc.settings import GCSettings
from branchwater.engine.graveler import commit as commit_ops
from tests.helpers.gc import FakeClock, compact, data_objects, use_clock


def records(repo: Repository) -> list[tuple[str, str]]:
    return [(r.address, r.branch) for r in repo.lake.gc.copies.records(repo.record)]


def test_copying_a_staged_object_is_shallow_and_recorded(repo: Repository) -> None:
    main = repo.branch("main")
    source = main.upload("a/x", b"data", metadata={"k": "v"})
    copied = main.copy("a/x", "b/x")
    assert copied.address == source.address
    assert (copied.size, copied.checksum, copied.metadata) == (4, source.checksum, {"k": "v"})
    assert main.stat("b/x") == copied
    assert records(repo) == [(source.address, "main")]


def test_copying_a_committed_object_copies_it(repo: Repository) -> None:
    main = repo.branch("main")
    source = main.upload("a/x", b"data")
    main.commit("add")
    copied = main.copy("a/x", "b/x")
    assert copied.address != source.address
    assert copied.address.startswith("data/")
    assert main.read("b/x") == b"data"
    assert records(repo) == []


def test_copying_onto_the_same_content_copies_and_stages_nothing(repo: Repository) -> None:
    """A retried copy task: the destination already shows the source's content."""
    main = repo.branch("main")
    main.upload("a/x", b"data")
    main.upload("b/x", b"data")
    main.commit("both")
    before = main.stat("b/x")
    assert main.copy("a/x", "b/x") == before
    assert list(main.uncommitted()) == []
    assert records(repo) == []


def test_copying_a_sealed_object_is_shallow(repo: Repository) -> None:
    main = repo.branch("main")
    source = main.upload("a/x", b"data")
    commit_ops.seal(repo.lake.graveler, repo.record, "main")
    assert main.copy("a/x", "b/x").address == source.address
    assert records(repo) == [(source.address, "main")]


def test_copying_a_compacted_object_is_shallow_unless_head_has_it(repo: Repository) -> None:
    main = repo.branch("main")
    committed = main.upload("a/committed", b"c")
    main.commit("base")
    staged = main.upload("a/staged", b"s")
    compact(repo, "main")
    assert main.copy("a/staged", "b/staged").address == staged.address
    assert main.copy("a/committed", "b/committed").address != committed.address
    assert records(repo) == [(staged.address, "main")]


def test_copy_overwrites_the_destination(repo: Repository) -> None:
    main = repo.branch("main")
    main.upload("a", b"new")
    main.upload("b", b"old")
    main.copy("a", "b")
    assert main.read("b") == b"new"


def test_copying_a_missing_or_deleted_path_is_not_found(repo: Repository) -> None:
    main = repo.branch("main")
    with pytest.raises(NotFound):
        main.copy("nothing", "b")
    main.upload("a", b"x")
    main.commit("a")
    main.delete("a")
    with pytest.raises(NotFound):
        main.copy("a", "b")
    assert records(repo) == []


def test_copy_of_committed_data_that_is_missing_says_so(repo: Repository) -> None:
    main = repo.branch("main")
    entry = main.upload("a", b"x")
    main.commit("a")
    repo.lake.graveler.objects(repo.storage_namespace).delete([entry.address])
    with pytest.raises(NotFound, match="missing"):
        main.copy("a", "b")


def test_copy_records_expire_and_are_swept_in_the_background(lake: Lake, repo: Repository) -> None:
    clock = FakeClock()
    use_clock(lake, clock, GCSettings(copy_record_ttl=timedelta(hours=3)))
    main = repo.branch("main")
    main.upload("a", b"x")
    main.copy("a", "b")
    clock.advance(timedelta(hours=2))
    main.copy("a", "c")
    assert len(records(repo)) == 2
    clock.advance(timedelta(hours=1, seconds=1))
    lake.gc.housekeeper.interval = 0
    main.copy("a", "d")
    assert lake.gc.housekeeper.wait(10)
    remaining = list(lake.gc.copies.records(repo.record))
    assert len(remaining) == 2
    assert all(r.expires > clock.now for r in remaining)
    assert sorted(r.created for r in remaining) == [
        clock.now - timedelta(hours=1, seconds=1),
        clock.now,
    ]


def test_a_deep_copy_of_a_rewritten_object_refuses_rather_than_copy_it(repo: Repository) -> None:
    """A deep copy reads its source as a read does: bytes its entry does not describe are
    `CorruptedData`, never copied under the source's checksum."""
    main = repo.branch("main")
    source = main.upload("a/x", b"data")
    main.commit("add")
    repo.lake.graveler.objects(repo.storage_namespace).put(source.address, b"DATA")
    with pytest.raises(CorruptedData, match="a/x"):
        main.copy("a/x", "b/x")
    assert list(main.uncommitted()) == []
    assert list(data_objects(repo.lake, repo)) == [source.address]


def test_a_deep_copy_streams_an_object_larger_than_it_holds(repo: Repository) -> None:
    """Copying a committed object never holds it whole: one larger than memory copies."""
    size = 48 << 20
    main = repo.branch("main")
    main.upload("big", io.BytesIO(os.urandom(size)))
    main.commit("big")
    tracemalloc.start()
    try:
        copied = main.copy("big", "big-copy")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < size // 4
    assert copied.size == size
    assert main.read("big-copy") == main.read("big")
