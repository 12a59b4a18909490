"""Which version a filesystem call reads, under the interleavings that made it read another:
a commit between DuckDB's `open` and its `size`, a repository deleted and created again
under its name, a commit that retention expired after the filesystem resolved it, and a
repository deleted between a listing's resolution and its pages. Each interleaving is
forced by hand (a wrapped call, the sweep's steps), never by timing."""

from __future__ import annotations

import io
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fsspec.utils import tokenize

from branchwater.engine import BranchwaterFileSystem, CommitExpired, Lake, NotFound, Ref
from branchwater.engine import filesystem as filesystem_module
from branchwater.engine.filesystem import Location
from branchwater.engine.graveler.graveler import Graveler
from tests.filesystem.conftest import FsLake
from tests.graveler.test_refs import CountingStore
from tests.helpers.gc import record_expired

ROWS = {"csv": (1000, 100), "parquet": (100, 1000)}
"""Rows of versions 1 and 2 of each file: the CSV shrinks, so the old one cut to the new
size parses (wrong rows); the Parquet grows, so reads run past the old one's end."""


def content(kind: str, version: int) -> bytes:
    rows = ROWS[kind][version - 1]
    if kind == "csv":
        return ("id,amount\n" + "".join(f"{i},{version}\n" for i in range(rows))).encode()
    out = io.BytesIO()
    pq.write_table(pa.table({"id": range(rows), "amount": [version] * rows}), out)
    return out.getvalue()


def summary(kind: str, version: int) -> tuple[int, int]:
    """(rows, sum of `amount`) of a version: what DuckDB returns reading that one alone."""
    rows = ROWS[kind][version - 1]
    return rows, rows * version


def duckdb_summary(fs_lake: FsLake, kind: str, url: str) -> list[tuple[Any, ...]]:
    con = duckdb.connect()
    try:
        con.execute("SET threads = 1")
        con.register_filesystem(fs_lake.fs)
        return con.sql(f"SELECT count(*), sum(amount) FROM read_{kind}('{url}')").fetchall()
    finally:
        con.close()


@pytest.mark.parametrize(("kind", "after"), [("csv", "last"), ("parquet", "first")])
def test_duckdb_at_a_commit_id_reads_one_version_when_a_commit_lands_between_open_and_size(
    fs_lake: FsLake, kind: str, after: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit replaces the file between one of DuckDB's opens of it and the `size` it asks
    next (a dry run counts the opens). Through the branch DuckDB would read the version it
    opened cut to the new one's size (wrong rows for a CSV, an `IOException` for Parquet);
    at the commit id every call answers for that commit, as the docs advise."""
    main, fs = fs_lake.repo.branch("main"), fs_lake.fs
    path = f"t/orders.{kind}"
    main.upload(path, content(kind, 1))
    url = fs_lake.url(main.commit("version 1").id, path)
    opens: list[int] = [0]
    committed: list[str] = []
    real_open, real_size = fs._open, fs.size

    def counted_open(*args: Any, **kwargs: Any) -> Any:
        opens[0] += 1
        return real_open(*args, **kwargs)

    monkeypatch.setattr(fs, "_open", counted_open)
    assert duckdb_summary(fs_lake, kind, url) == [summary(kind, 1)]
    last, opens[0] = opens[0], 0
    target = last if after == "last" else 1

    def commit_then_size(name: str) -> int | None:
        if opens[0] == target and not committed:
            main.upload(path, content(kind, 2))
            committed.append(main.commit("version 2").id)
        return real_size(name)

    monkeypatch.setattr(fs, "size", commit_then_size)
    got = duckdb_summary(fs_lake, kind, url)
    assert committed and opens[0] == last
    assert got == [summary(kind, 1)]


def test_calls_describe_what_the_ref_shows_now_whatever_handle_is_open(fs_lake: FsLake) -> None:
    """An open read handle keeps its own version (`f.size`, its bytes); `info`, `size`,
    `ukey` and `exists` answer for the path as the ref shows it at the call, after a write,
    inside a transaction and after a delete alike."""
    main, fs = fs_lake.repo.branch("main"), fs_lake.fs
    url = fs_lake.url("main", "a.csv")
    fs.pipe(url, b"version-one")
    with fs.open(url) as f:
        fs.pipe(url, b"version-two, longer")
        assert fs.info(url)["size"] == fs.size(url) == len(b"version-two, longer")
        assert fs.ukey(url) == tokenize(*main.stat("a.csv").identity())
        main.commit("version two")
        with fs.transaction:
            fs.pipe(url, b"in a transaction")
            assert fs.size(url) == len(b"in a transaction")
        fs.rm(url)
        assert not fs.exists(url)
        assert (f.size, f.read()) == (len(b"version-one"), b"version-one")


def test_a_repository_created_again_under_its_name_is_another_one(
    fs_lake: FsLake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seen once `REPOSITORY_SECONDS` passed since the name was last resolved (here at once)."""
    monkeypatch.setattr(filesystem_module, "REPOSITORY_SECONDS", 0)
    lake, fs = fs_lake.lake, fs_lake.fs
    main = fs_lake.repo.branch("main")
    main.upload("t/a.csv", b"deleted repository's bytes\n")
    old = main.commit("old").id
    assert fs.cat(f"sales/{old}/t/a.csv") == b"deleted repository's bytes\n"
    assert fs.ls(f"sales/{old}/t/", detail=False) == [f"sales/{old}/t/a.csv"]
    assert fs.find(f"sales/{old}") == [f"sales/{old}/t/a.csv"]
    namespace = fs_lake.repo.storage_namespace
    lake.delete_repository("sales")
    lake.wait_for_cleanup()
    again = lake.create_repository("sales", namespace)
    again.branch("main").upload("t/a.csv", b"new\n")
    again.branch("main").commit("new")
    calls: list[Callable[[], object]] = [
        lambda: fs.cat(f"sales/{old}/t/a.csv"),
        lambda: fs.open(f"sales/{old}/t/a.csv"),
        lambda: fs.info(f"sales/{old}/t/a.csv"),
        lambda: fs.ukey(f"sales/{old}/t/a.csv"),
        lambda: fs.ls(f"sales/{old}/t/"),
    ]
    for call in calls:
        with pytest.raises(FileNotFoundError, match="not found in repository 'sales'"):
            call()
    assert not fs.exists(f"sales/{old}/t/a.csv")
    assert fs.find(f"sales/{old}") == []
    assert fs.cat("sales/main/t/a.csv") == b"new\n"


def test_data_gone_with_a_repository_created_again_moments_ago_is_told_so(
    fs_lake: FsLake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Within `REPOSITORY_SECONDS` the deleted repository's commit is still read; once its
    data turns out missing, the name is resolved again, which tells what happened."""
    monkeypatch.setattr(filesystem_module, "REPOSITORY_SECONDS", 3600)
    main = fs_lake.repo.branch("main")
    entry = main.upload("t/a.csv", b"deleted repository's bytes\n")
    url = f"sales/{main.commit('old').id}/t/a.csv"
    assert fs_lake.fs.cat(url) == b"deleted repository's bytes\n"
    namespace = fs_lake.repo.storage_namespace
    fs_lake.lake.delete_repository("sales")
    fs_lake.lake.graveler.objects(namespace).delete([entry.address])
    fs_lake.lake.create_repository("sales", namespace)
    with pytest.raises(FileNotFoundError, match="not found in repository 'sales'"):
        fs_lake.fs.cat(url)


def test_reads_at_a_commit_id_resolved_moments_ago_make_no_kv_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Within `REPOSITORY_SECONDS` of resolving the repository's name (made long here, so a
    slow machine cannot end it), a commit id already resolved there is read without reading
    the repository's record again: no round trip per file (on PostgreSQL, a DuckDB query's
    every open and size)."""
    monkeypatch.setattr(filesystem_module, "REPOSITORY_SECONDS", 3600)
    kv = CountingStore()
    with Lake(Graveler(kv)) as lake:
        main = lake.create_repository("sales", f"file://{tmp_path}/sales").branch("main")
        for i in range(3):
            main.upload(f"p/{i}.csv", b"x" * 100)
        at = f"sales/{main.commit('three files').id}/p"
        fs = BranchwaterFileSystem(lake=lake, skip_instance_cache=True)
        assert len(fs.find(at)) == 3
        assert lake.wait_for_cleanup(timeout=60), "the commit's staging drop is still running"
        kv.calls.clear()
        for i in range(3):
            assert fs.cat_file(f"{at}/{i}.csv") == b"x" * 100
            assert fs.size(f"{at}/{i}.csv") == 100
        assert kv.calls == []


def test_resolved_commit_ids_are_remembered_up_to_a_bound_least_recently_used_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long-lived filesystem reading at many commits keeps `RESOLVED_COMMITS` of them
    (2 here): a read at one of those makes no KV call, a read at one dropped resolves it
    again."""
    monkeypatch.setattr(filesystem_module, "REPOSITORY_SECONDS", 3600)
    monkeypatch.setattr(filesystem_module, "RESOLVED_COMMITS", 2)
    kv = CountingStore()
    with Lake(Graveler(kv)) as lake:
        main = lake.create_repository("sales", f"file://{tmp_path}/sales").branch("main")
        commits = []
        for i in range(3):
            main.upload("a.csv", b"%d" % i)
            commits.append(main.commit(f"version {i}").id)
        assert lake.wait_for_cleanup(timeout=60), "the commits' staging drops are still running"
        fs = BranchwaterFileSystem(lake=lake, skip_instance_cache=True)

        def kv_calls_to_read(i: int) -> int:
            kv.calls.clear()
            assert fs.cat_file(f"sales/{commits[i]}/a.csv") == b"%d" % i
            return len(kv.calls)

        assert kv_calls_to_read(0) and kv_calls_to_read(1)
        assert kv_calls_to_read(0) == 0
        assert kv_calls_to_read(2)
        assert kv_calls_to_read(0) == kv_calls_to_read(2) == 0
        assert kv_calls_to_read(1)


@pytest.mark.parametrize("call", ["ls", "find", "info"])
def test_a_repository_deleted_under_a_listing_is_file_not_found(
    fs_lake: FsLake, call: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ref resolves, then the repository goes before the listing reads it."""
    fs = fs_lake.fs
    fs_lake.repo.branch("main").upload("t/a/b.csv", b"x")
    real_ref = fs._ref

    def resolve_then_delete(loc: Location) -> Ref:
        ref = real_ref(loc)
        fs_lake.lake.delete_repository("sales")
        return ref

    monkeypatch.setattr(fs, "_ref", resolve_then_delete)
    with pytest.raises(FileNotFoundError, match="not found") as raised:
        getattr(fs, call)("sales/main/t")
    assert raised.value.filename == "branchwater://sales/main/t"


def expire(fs_lake: FsLake, commit_id: str, path: str) -> None:
    """What retention's sweep does: delete what only the commit holds, record it expired."""
    repo = fs_lake.repo
    address = repo.ref(commit_id).stat(path).address
    fs_lake.lake.graveler.objects(repo.storage_namespace).delete([address])
    record_expired(fs_lake.lake.graveler.kv, repo.record, [commit_id], datetime.now(UTC), "run")


def test_a_commit_expired_after_the_filesystem_resolved_it_is_file_not_found(
    fs_lake: FsLake,
) -> None:
    main, fs = fs_lake.repo.branch("main"), fs_lake.fs
    main.upload("t/a.csv", b"old\n" * 100)
    old = main.commit("old").id
    main.upload("t/a.csv", b"new\n")
    main.commit("new")
    url = f"sales/{old}/t/a.csv"
    assert fs.cat(url) == b"old\n" * 100
    expire(fs_lake, old, "t/a.csv")
    fresh = BranchwaterFileSystem(lake=fs_lake.lake, skip_instance_cache=True)
    with pytest.raises(FileNotFoundError, match="expired") as resolved:
        fresh.cat(url)
    for call in (fs.cat, fs.open, lambda name: fs.cat_file(name, start=1)):
        with pytest.raises(FileNotFoundError) as raised:
            call(url)
        assert isinstance(raised.value.__cause__, CommitExpired)
        assert (raised.value.strerror, raised.value.filename) == (
            resolved.value.strerror,
            resolved.value.filename,
        )


def test_commit_expired_from_a_read_is_told_as_resolving_tells_it(
    fs_lake: FsLake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine's reads may raise `CommitExpired` themselves: it names the ref, as a fresh
    resolution of the expired commit does."""
    main, fs = fs_lake.repo.branch("main"), fs_lake.fs
    main.upload("t/a.csv", b"old\n")
    old = main.commit("old").id
    expired = CommitExpired(old, datetime.now(UTC).isoformat())

    def expired_read(*args: Any, **kwargs: Any) -> Any:
        raise expired

    monkeypatch.setattr(filesystem_module, "open_object", expired_read)
    with pytest.raises(FileNotFoundError) as raised:
        fs.cat(f"sales/{old}/t/a.csv")
    assert raised.value.__cause__ is expired
    assert raised.value.strerror == str(expired)
    assert raised.value.filename == f"branchwater://sales/{old}"


def test_data_missing_at_a_branch_is_file_not_found_with_the_engine_message(
    fs_lake: FsLake,
) -> None:
    main, fs = fs_lake.repo.branch("main"), fs_lake.fs
    entry = main.upload("t/a.csv", b"gone\n")
    fs_lake.lake.graveler.objects(fs_lake.repo.storage_namespace).delete([entry.address])
    with pytest.raises(FileNotFoundError, match="is missing from") as raised:
        fs.open("sales/main/t/a.csv")
    assert raised.value.filename == "branchwater://sales/main/t/a.csv"


class Vanishing(io.BytesIO):
    """An object deleted while open: the open succeeds, every read then raises the store's
    `NotFound`, which names only the physical key."""

    def __init__(self, key: str) -> None:
        super().__init__(b"x")
        self.error = NotFound(f"no such key {key!r}")

    def read(self, size: int | None = -1) -> bytes:
        raise self.error

    def readinto(self, buffer: Any) -> int:
        raise self.error


def test_data_gone_while_a_handle_is_open_is_file_not_found_and_names_the_ref(
    fs_lake: FsLake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opens tell the engine the ref and commit read, so it names them (or the expiry); a
    read of the open handle that finds the data gone reaches fsspec callers as the
    `FileNotFoundError` every other missing read is, with the engine's message, chained from
    the engine's error."""
    monkeypatch.setattr(filesystem_module, "REPOSITORY_SECONDS", 3600)
    main, fs = fs_lake.repo.branch("main"), fs_lake.fs
    main.upload("t/a.csv", b"x")
    old = main.commit("old").id
    assert fs.cat(fs_lake.url(old, "t/a.csv")) == b"x"
    when = datetime.now(UTC)
    record_expired(fs_lake.lake.graveler.kv, fs_lake.repo.record, [old], when, "run")
    store = fs.lake.graveler.objects(fs_lake.repo.storage_namespace)
    monkeypatch.setattr(store, "open", Vanishing)
    cases = [
        ("main", NotFound, "was deleted while it was open", "main/t/a.csv"),
        (old, CommitExpired, "expired", old),
    ]
    for ref, kind, why, named in cases:
        url = fs_lake.url(ref, "t/a.csv")
        with fs.open(url) as f, pytest.raises(FileNotFoundError) as raised:
            f.read()
        with pytest.raises(FileNotFoundError) as by_cat:
            fs.cat_file(url)
        for caught in (raised.value, by_cat.value):
            cause = caught.__cause__
            assert type(cause) is kind and caught.strerror == str(cause) and why in str(cause)
            assert cause is not None and isinstance(cause.__cause__, NotFound)
            assert caught.filename == f"branchwater://sales/{named}"
