"""Which version a filesystem call reads, under the interleavings that made it read another:
a commit between DuckDB's `open` and its `size`, a repository deleted and created again
under its name, a commit that retention expired after the filesystem resolved it, and a
repository deleted between a listing's resolution and its pages. Each interleaving is
forced by hand (a wrapped call, the sweep's steps), never by timing."""

from __future__ import annotations

import gc
import io
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import duckdb
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from branchwater.engine import BranchwaterFileSystem, CommitExpired, NotFound, Ref
from branchwater.engine import filesystem as filesystem_module
from branchwater.engine.filesystem import Location
from branchwater.engine.gc.retention.expired import record_expired
from tests.filesystem.conftest import FsLake

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


def duckdb_summary(fs_lake: FsLake, kind: str, path: str) -> list[tuple[Any, ...]]:
    con = duckdb.connect()
    try:
        con.execute("SET threads = 1")
        con.register_filesystem(fs_lake.fs)
        url = fs_lake.url("main", path)
        return con.sql(f"SELECT count(*), sum(amount) FROM read_{kind}('{url}')").fetchall()
    finally:
        con.close()


@pytest.mark.parametrize(("kind", "after"), [("csv", "last"), ("parquet", "first")])
def test_duckdb_reads_one_version_when_a_commit_lands_between_open_and_size(
    fs_lake: FsLake, kind: str, after: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commit replaces the file between one of DuckDB's opens of it and the `size` it asks
    next (a dry run counts the opens): DuckDB read the version it opened cut to the new
    one's size, silently wrong rows for a CSV (after the open that reads the rows), an
    `IOException` for Parquet (after the first, which reads the footer)."""
    main, fs = fs_lake.repo.branch("main"), fs_lake.fs
    path = f"t/orders.{kind}"
    main.upload(path, content(kind, 1))
    main.commit("version 1")
    opens: list[int] = [0]
    committed: list[str] = []
    real_open, real_size = fs._open, fs.size

    def counted_open(*args: Any, **kwargs: Any) -> Any:
        opens[0] += 1
        return real_open(*args, **kwargs)

    monkeypatch.setattr(fs, "_open", counted_open)
    assert duckdb_summary(fs_lake, kind, path) == [summary(kind, 1)]
    last, opens[0] = opens[0], 0
    target = last if after == "last" else 1

    def commit_then_size(name: str) -> int | None:
        if opens[0] == target and not committed:
            main.upload(path, content(kind, 2))
            committed.append(main.commit("version 2").id)
        return real_size(name)

    monkeypatch.setattr(fs, "size", commit_then_size)
    got = duckdb_summary(fs_lake, kind, path)
    assert committed and opens[0] == last
    assert got == [summary(kind, 1 if after == "last" else 2)]


def test_an_open_read_handle_pins_what_info_size_modified_and_ukey_say(fs_lake: FsLake) -> None:
    main, fs = fs_lake.repo.branch("main"), fs_lake.fs
    url = fs_lake.url("main", "a.csv")
    main.upload("a.csv", b"old content\n")
    main.commit("old")
    old = {"info": fs.info(url), "modified": fs.modified(url), "ukey": fs.ukey(url)}

    def described() -> dict[str, Any]:
        return {"info": fs.info(url), "modified": fs.modified(url), "ukey": fs.ukey(url)}

    first = fs.open(url)
    main.upload("a.csv", b"new\n")
    main.commit("new")
    assert described() == old
    assert fs.size(url) == len(b"old content\n") and fs.checksum(url) == int(old["ukey"], 16)
    assert first.read() == b"old content\n"
    second = fs.open(url)
    new = described()
    assert new["info"]["size"] == len(b"new\n") and new["ukey"] != old["ukey"]
    second.close()
    assert described() == old
    first.close()
    assert described() == new
    dropped = fs.open(url)
    main.upload("a.csv", b"newer\n")
    assert fs.size(url) == len(b"new\n")
    del dropped
    gc.collect()
    assert fs.size(url) == len(b"newer\n")


def test_a_pin_is_per_path_and_forgotten_once_its_handles_closed(fs_lake: FsLake) -> None:
    main, fs = fs_lake.repo.branch("main"), fs_lake.fs
    for i in range(100):
        main.upload(f"many/{i}.txt", b"x")
    for i in range(100):
        with fs.open(fs_lake.url("main", f"many/{i}.txt")) as f:
            f.read()
    main.upload("many/0.txt", b"changed")
    assert fs.size(fs_lake.url("main", "many/0.txt")) == len(b"changed")
    assert len(fs._pins) < 100


def test_a_repository_created_again_under_its_name_is_another_one(fs_lake: FsLake) -> None:
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
    """An object deleted while open: the open succeeds, every read then raises `error`."""

    def __init__(self, error: Exception) -> None:
        super().__init__(b"x")
        self.error = error

    def read(self, size: int | None = -1) -> bytes:
        raise self.error


def test_data_gone_while_a_handle_is_open_is_file_not_found_and_names_the_ref(
    fs_lake: FsLake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Opens tell the engine the ref and commit read, so it names them (or the expiry); a
    read of the open handle that finds the data gone reaches fsspec callers as the
    `FileNotFoundError` every other missing read is, with the engine's message."""
    main, fs = fs_lake.repo.branch("main"), fs_lake.fs
    main.upload("t/a.csv", b"x")
    old = main.commit("old").id
    deleted = NotFound("object 't/a.csv' at ref 'main' of 'sales' was deleted while it was open")
    expired = CommitExpired(old, datetime.now(UTC).isoformat())
    opened: list[dict[str, Any]] = []

    def open_vanishing(*args: Any, **kwargs: Any) -> Vanishing:
        opened.append(kwargs)
        return Vanishing(expired if kwargs["commit_id"] else deleted)

    monkeypatch.setattr(filesystem_module, "open_object", open_vanishing)
    for ref, error, named in [("main", deleted, "main/t/a.csv"), (old, expired, old)]:
        url = fs_lake.url(ref, "t/a.csv")
        with fs.open(url) as f, pytest.raises(FileNotFoundError) as raised:
            f.read()
        with pytest.raises(FileNotFoundError) as by_cat:
            fs.cat_file(url)
        for caught in (raised.value, by_cat.value):
            assert caught.__cause__ is error and caught.strerror == str(error)
            assert caught.filename == f"branchwater://sales/{named}"
    assert opened[0] == {"ref": "main", "commit_id": None}
    assert opened[-1] == {"ref": old, "commit_id": old}
