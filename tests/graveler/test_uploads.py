"""How often an upload reads its file: new content once (hashed while written); content the
branch may already show (an entry of its size and metadata) hashed first, so a retry reads
it once and writes nothing, and other content of that size is then written."""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

from branchwater.engine import failpoints
from branchwater.engine.api import Repository
from branchwater.engine.errors import InvalidArgument, PathExists, Unavailable
from branchwater.engine.objects import ObjectStore

DATA = os.urandom(3 << 20)


class CountingFile(io.BytesIO):
    """A seekable binary file that counts the bytes read from it."""

    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.bytes_read = 0

    def read(self, size: int | None = -1) -> bytes:
        chunk = super().read(size)
        self.bytes_read += len(chunk)
        return chunk


def objects(repo: Repository) -> list[Path]:
    root = Path(repo.storage_namespace.removeprefix("file://")) / "data"
    return [p for p in root.rglob("*") if p.is_file()] if root.exists() else []


def test_new_content_is_read_once_and_hashed_on_the_way(repo: Repository) -> None:
    f = CountingFile(DATA)
    entry = repo.branch("main").upload("big.bin", f)
    assert f.bytes_read == len(DATA)
    assert entry.checksum == hashlib.sha256(DATA).hexdigest() and entry.size == len(DATA)
    assert repo.branch("main").read("big.bin") == DATA


def test_a_retry_is_hashed_first_and_writes_nothing(repo: Repository) -> None:
    main = repo.branch("main")
    first = main.upload("big.bin", CountingFile(DATA))
    written = objects(repo)
    retry = CountingFile(DATA)
    assert main.upload("big.bin", retry) == first
    assert retry.bytes_read == len(DATA) and objects(repo) == written


def test_other_content_of_the_same_size_is_written(repo: Repository) -> None:
    main = repo.branch("main")
    main.upload("big.bin", CountingFile(DATA))
    other = DATA[::-1]
    f = CountingFile(other)
    entry = main.upload("big.bin", f)
    assert f.bytes_read == 2 * len(other)
    assert entry.checksum == hashlib.sha256(other).hexdigest()
    assert main.read("big.bin") == other and len(objects(repo)) == 2


def test_a_local_path_that_cannot_be_opened_is_refused_and_stages_nothing(
    repo: Repository, tmp_path: Path
) -> None:
    """A NUL in the path makes `open` raise `ValueError`, not `OSError`."""
    main = repo.branch("main")
    for path in (str(tmp_path / "absent"), f"{tmp_path}/a\x00b", tmp_path):
        with pytest.raises(InvalidArgument, match="cannot read local file"):
            main.upload("p", path)
    assert list(main.uncommitted()) == [] and objects(repo) == []


class Stream(io.BytesIO):
    """Content that cannot be read twice: checked against the branch only once written."""

    def seekable(self) -> bool:
        return False


class RefusingDeletes:
    """The namespace's store, but every delete fails, as on a bucket whose policy denies
    them or a server that is down just then."""

    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def delete(self, keys: Iterable[str]) -> None:
        raise Unavailable("deletes are refused here")


def test_a_write_decided_before_its_cleanup_fails_is_told_as_decided(repo: Repository) -> None:
    """The object an upload leaves unstaged is deleted best effort: content the branch shows
    already is a success, a path another writer took is `PathExists`, whatever the delete
    says; the object left behind is GC's to collect."""
    main = repo.branch("main")
    shown = main.upload("p", b"same")
    g = repo.lake.graveler
    g._objects[repo.storage_namespace] = RefusingDeletes(g.objects(repo.storage_namespace))  # type: ignore[assignment]
    assert main.upload("p", Stream(b"same")) == shown

    def another_writer() -> None:
        with failpoints.armed("write.before_create", lambda: None):
            main.upload("q", b"theirs")

    with failpoints.armed("write.before_create", another_writer), pytest.raises(PathExists):
        main.upload("q", b"mine", if_absent=True)
    assert main.read("q") == b"theirs"
