"""A read whose object's data is gone says why: `CommitExpired` when GC retention expired the
commit read, else `NotFound` naming the lake path, the ref and the address.

A `Ref` resolved before a sweep keeps its commit, and a file opened before it keeps reading
until the store refuses (an S3 ranged GET; a local file open stays readable). The sweep is
done by hand between two steps of the reader, as a run's sweep does it: delete the objects
only the commit holds, then `record_expired` (or, mid-sweep, `mark_expiring`)."""

from __future__ import annotations

import io
import os
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO, TypeVar

import pytest

from branchwater.engine import CommitExpired, Lake, NotFound
from branchwater.engine.api import Ref, Repository
from branchwater.engine.gc.retention.expired import mark_expiring
from branchwater.engine.graveler.reads import Guarded
from tests.fixtures.s3 import S3Server
from tests.helpers.gc import record_expired

T = TypeVar("T")

WHEN = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
RUN = "18f2a9c3b7d1-a1b2c3"
OLD = os.urandom(300_000)
"""More than a first read fetches, so an open file reads from the store again after it."""


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def store_repo(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Repository]:
    """Repository `sales` in a SQLite lake, on local files or on a fresh S3 bucket."""
    kv = f"sqlite:///{tmp_path}/lake.db"
    if request.param == "local":
        with Lake.connect(kv, range_cache_dir="") as lake:
            yield lake.create_repository("sales", f"file://{tmp_path}/sales")
        return
    server: S3Server = request.getfixturevalue("s3_server")
    bucket = request.getfixturevalue("s3_bucket")
    with Lake.connect(kv, s3_options=server.options, range_cache_dir="") as lake:
        yield lake.create_repository("sales", f"s3://{bucket}/sales")
        store = lake.graveler.objects(f"s3://{bucket}/sales")
        store.delete(info.key for info in store.list_objects())


def old_commit(repo: Repository) -> str:
    """`t/a.bin` committed as OLD, then replaced on main: the first commit alone holds OLD."""
    main = repo.branch("main")
    main.upload("t/a.bin", OLD)
    old = main.commit("old").id
    main.upload("t/a.bin", b"new")
    main.commit("new")
    return old


def delete_data(ref: Ref, path: str) -> str:
    """What a sweep deletes: the object's data, its address returned."""
    address = ref.stat(path).address
    ref.repository.lake.graveler.objects(ref.repository.storage_namespace).delete([address])
    return address


def sweep(ref: Ref, commit_id: str) -> None:
    delete_data(ref, "t/a.bin")
    repo = ref.repository
    record_expired(repo.lake.graveler.kv, repo.record, [commit_id], WHEN, RUN)


def test_a_ref_resolved_before_its_commit_expired_reads_as_expired(
    store_repo: Repository,
) -> None:
    old = old_commit(store_repo)
    by_id, by_name = store_repo.ref(old), store_repo.ref("main~1")
    assert by_id.read("t/a.bin") == OLD
    sweep(by_id, old)
    for ref in (by_id, by_name):
        for read in (ref.read, ref.open):
            with pytest.raises(CommitExpired) as raised:
                read("t/a.bin")
            assert raised.value.commit_id == old
            assert raised.value.expired == WHEN.isoformat()


def test_a_read_during_the_sweep_names_the_run_collecting_the_commit(
    store_repo: Repository,
) -> None:
    old = old_commit(store_repo)
    ref = store_repo.ref(old)
    assert mark_expiring(store_repo.lake.graveler.kv, store_repo.record, [old], RUN) == [old]
    delete_data(ref, "t/a.bin")
    with pytest.raises(CommitExpired) as raised:
        ref.read("t/a.bin")
    assert raised.value.collecting == RUN


def test_a_file_opened_before_the_sweep_reads_on_or_says_its_commit_expired(
    store_repo: Repository,
) -> None:
    old = old_commit(store_repo)
    ref = store_repo.ref(old)
    with ref.open("t/a.bin") as f:
        first = f.read(1000)
        sweep(ref, old)
        if store_repo.storage_namespace.startswith("file://"):
            assert first + f.read() == OLD  # the open file holds the data
            return
        with pytest.raises(CommitExpired) as raised:
            f.read()
    assert raised.value.commit_id == old


@pytest.mark.parametrize("verify", [True, False])
def test_missing_data_of_a_live_commit_is_not_found_naming_path_ref_and_address(
    store_repo: Repository, verify: bool
) -> None:
    old = old_commit(store_repo)
    ref = store_repo.ref(old)
    address = delete_data(ref, "t/a.bin")
    for read in (ref.read, ref.open):
        with pytest.raises(NotFound) as raised:
            read("t/a.bin", verify=verify)
        assert not isinstance(raised.value, CommitExpired)
        said = str(raised.value)
        assert "'t/a.bin'" in said and repr(old) in said and address in said
        assert f"branchwater gc explain sales {address}" in said


@pytest.mark.s3
def test_an_s3_read_cut_by_a_deletion_names_the_path_and_branch(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    """A live branch's object deleted under an open file (not by retention): the ranged GET
    that finds it gone names the lake path and the branch, not only the physical key."""
    with Lake.connect(f"sqlite:///{tmp_path}/lake.db", s3_options=s3_server.options) as lake:
        repo = lake.create_repository("sales", f"s3://{s3_bucket}/sales")
        main = repo.branch("main")
        main.upload("t/a.bin", OLD)
        with main.open("t/a.bin", verify=False) as f:
            f.read(1000)
            address = delete_data(main, "t/a.bin")
            with pytest.raises(NotFound) as raised:
                f.read()
    said = str(raised.value)
    assert "'t/a.bin' at ref 'main'" in said and address in said
    assert "was deleted while it was open" in said


# --- the file `open` returns ----------------------------------------------------------------

LINES = [b"%08d,some,row,content\n" % i for i in range(20_000)]
"""A 520 KB CSV: reading it a byte a call (as `readline` does on an unbuffered file) makes
520,001 reads of the store's file."""


class StoreFile(Guarded):
    """The store's file, its reads (and seeks) counted; once `gone`, each raises `NotFound`
    naming only the key, as an S3 ranged GET of an object deleted meanwhile does. The
    engine's own raw wrapper, so it keeps a store file's protocol as the engine's does."""

    def __init__(self, f: BinaryIO) -> None:
        super().__init__(f, lambda error: error)
        self.reads = 0
        self.gone = False

    def _guard(self, call: Callable[[], T]) -> T:
        self.reads += 1
        if self.gone:
            raise NotFound("object not found")
        return call()


def store_files(repo: Repository, monkeypatch: pytest.MonkeyPatch) -> list[StoreFile]:
    """Every file the repository's store opens from now on, as `StoreFile`s."""
    store = repo.lake.graveler.objects(repo.storage_namespace)
    opened: list[StoreFile] = []
    open_key = store.open

    def counted(key: str) -> BinaryIO:
        opened.append(StoreFile(open_key(key)))
        return opened[-1]  # type: ignore[return-value]

    monkeypatch.setattr(store, "open", counted)
    return opened


@pytest.mark.parametrize("verify", [True, False])
def test_line_iteration_reads_the_store_a_buffer_at_a_time(
    repo: Repository, monkeypatch: pytest.MonkeyPatch, verify: bool
) -> None:
    """Unverified, the file was a guard without a buffer: a read of the store's file a byte."""
    data = b"".join(LINES)
    repo.branch("main").upload("t.csv", data)
    opened = store_files(repo, monkeypatch)
    with repo.branch("main").open("t.csv", verify=verify) as f:
        assert list(f) == LINES
    assert opened[0].reads <= len(data) // io.DEFAULT_BUFFER_SIZE + 5  # and a few seeks


def test_a_local_object_opened_unverified_is_a_buffered_file_with_its_descriptor(
    repo: Repository,
) -> None:
    first, last = LINES[0], LINES[99]
    data = b"".join(LINES[:100])
    repo.branch("main").upload("t.csv", data)
    with repo.branch("main").open("t.csv", verify=False) as f:
        assert isinstance(f, io.BufferedReader)
        assert os.fstat(f.fileno()).st_size == len(data)
        assert f.peek(1)[:1] == first[:1] and f.readline() == first
        assert f.seek(-len(last), io.SEEK_END) == len(data) - len(last)
        buffer = bytearray(len(last))
        assert f.readinto(buffer) == len(buffer) and buffer == last
        assert f.tell() == len(data)
    assert f.closed


@pytest.mark.parametrize("verify", [True, False])
def test_data_gone_under_a_buffered_read_names_the_path_and_branch(
    repo: Repository, monkeypatch: pytest.MonkeyPatch, verify: bool
) -> None:
    """The guard sits under the buffer: a line read that refills it still translates."""
    repo.branch("main").upload("t.csv", b"".join(LINES))
    opened = store_files(repo, monkeypatch)
    with repo.branch("main").open("t.csv", verify=verify) as f:
        assert f.readline() == LINES[0]
        opened[0].gone = True
        with pytest.raises(NotFound, match=r"'t\.csv' at ref 'main' .* was deleted while it"):
            for _ in f:
                pass
