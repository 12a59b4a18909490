"""`ObjectStore.discard_abandoned_writes`: what a write killed half-way leaves (a local
`.tmp-` file, an open S3 multipart upload with its parts) is discarded once older than the
cutoff, and nothing else is: not a young write, not an object, not what lies outside the
folder. S3 runs on the SeaweedFS server, at the bucket root and below a key prefix."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from branchwater.engine.errors import InvalidArgument, Unavailable
from branchwater.engine.objects import ObjectStore, s3_fallback
from branchwater.engine.objects.local import LocalObjectStore
from branchwater.engine.objects.s3 import S3ObjectStore
from branchwater.engine.objects.store import Discarded, StreamSource
from tests.fixtures.s3 import S3Server

LOCAL_WRITTEN = 1 << 20
"""What a killed local writer got onto disk: one chunk, larger than Python's file buffer."""
PART = 5 << 20
"""The smallest part S3 takes but for the last: what an abandoned upload holds."""

KILLED_WRITER = """
import os, signal, sys
from branchwater.engine.objects.local import LocalObjectStore

def chunks():
    yield bytes(int(sys.argv[3]))
    os.kill(os.getpid(), signal.SIGKILL)

LocalObjectStore(sys.argv[1]).put_stream(sys.argv[2], chunks())
"""
"""A writer killed (SIGKILL, so no cleanup runs) after its first chunk."""


def abandon(store: ObjectStore, request: pytest.FixtureRequest, key: str) -> int:
    """Start a write of `key` whose writer dies half-way, as a killed process leaves it; the
    bytes it left."""
    if isinstance(store, LocalObjectStore):
        killed = subprocess.run(
            [sys.executable, "-c", KILLED_WRITER, store.url, key, str(LOCAL_WRITTEN)],
            check=False,
        )
        assert killed.returncode == -signal.SIGKILL
        return LOCAL_WRITTEN
    assert isinstance(store, S3ObjectStore)
    return start_upload(request, store.bucket, store.prefix + key)


def start_upload(request: pytest.FixtureRequest, bucket: str, full_key: str) -> int:
    """A multipart upload started with one part and never completed; aborted after the test
    if it is still open, so its bucket can go."""
    server: S3Server = request.getfixturevalue("s3_server")
    client = server.client()
    upload = client.create_multipart_upload(Bucket=bucket, Key=full_key)["UploadId"]
    client.upload_part(Bucket=bucket, Key=full_key, UploadId=upload, PartNumber=1, Body=bytes(PART))

    def abort_if_open() -> None:
        open_ids = {u["UploadId"] for u in open_uploads(server, bucket)}
        if upload in open_ids:
            client.abort_multipart_upload(Bucket=bucket, Key=full_key, UploadId=upload)
        client.close()

    request.addfinalizer(abort_if_open)
    return PART


def open_uploads(server: S3Server, bucket: str) -> list[dict[str, str]]:
    client = server.client()
    try:
        return list(client.list_multipart_uploads(Bucket=bucket).get("Uploads", []))
    finally:
        client.close()


def leftovers(store: ObjectStore, request: pytest.FixtureRequest) -> list[str]:
    """The folder (below the store's root, a `..` part above it) of each unfinished write."""
    if isinstance(store, LocalObjectStore):
        found = [p.parent.relative_to(store.root) for p in store.root.rglob(".tmp-*")]
        return sorted(p.as_posix() for p in found)
    assert isinstance(store, S3ObjectStore)
    server: S3Server = request.getfixturevalue("s3_server")
    keys = [u["Key"] for u in open_uploads(server, store.bucket)]
    return sorted(os.path.relpath(k.rsplit("/", 1)[0], store.prefix or ".") for k in keys)


def test_a_killed_write_is_discarded_once_older_than_the_cutoff(
    store: ObjectStore, request: pytest.FixtureRequest
) -> None:
    """A cutoff an hour ago keeps the write just killed (it may be a live one); a cutoff in
    the future (the write as if a day old) discards it, with its bytes, and only it."""
    store.put("data/s1/kept", b"an object, never an abandoned write")
    left = abandon(store, request, "data/s1/big.bin")
    abandon(store, request, "_branchwater/ranges/r1")
    outside = ["_branchwater/ranges"]
    if isinstance(store, S3ObjectStore) and store.prefix:
        start_upload(request, store.bucket, "elsewhere/data/s1/x")
        outside.append(os.path.relpath("elsewhere/data/s1", store.prefix))
    now = datetime.now(UTC)

    assert store.discard_abandoned_writes("data", now - timedelta(hours=1)) == Discarded()
    assert leftovers(store, request) == sorted([*outside, "data/s1"])

    discarded = store.discard_abandoned_writes("data", now + timedelta(minutes=1))

    assert discarded == Discarded(writes=1, bytes=left)
    assert leftovers(store, request) == sorted(outside)
    assert store.get("data/s1/kept") == b"an object, never an abandoned write"
    assert store.discard_abandoned_writes("data", now + timedelta(minutes=1)) == Discarded()


@pytest.mark.s3
def test_every_page_of_open_uploads_is_read(
    s3_store: S3ObjectStore, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ListMultipartUploads answers a page at a time (S3: 1,000 uploads); here pages of two,
    which SeaweedFS honours. Young uploads are kept on every page; old ones are aborted on
    every page, each page asked after the last one's uploads (its marker among them) are
    gone."""
    monkeypatch.setattr(s3_fallback, "UPLOADS_PAGE", 2)
    keys = [f"data/s{i % 3}/k{i}" for i in range(7)]
    for key in keys:
        start_upload(request, s3_store.bucket, key)
    start_upload(request, s3_store.bucket, "_branchwater/ranges/r1")
    server: S3Server = request.getfixturevalue("s3_server")
    client = server.client()
    first = client.list_multipart_uploads(Bucket=s3_store.bucket, Prefix="data/", MaxUploads=2)
    client.close()
    assert first["IsTruncated"] and len(first["Uploads"]) == 2
    now = datetime.now(UTC)

    assert s3_store.discard_abandoned_writes("data", now - timedelta(hours=1)) == Discarded()
    assert len(open_uploads(server, s3_store.bucket)) == len(keys) + 1

    discarded = s3_store.discard_abandoned_writes("data", now + timedelta(minutes=1))

    assert discarded == Discarded(writes=len(keys), bytes=len(keys) * PART)
    assert leftovers(s3_store, request) == ["_branchwater/ranges"]


def test_a_folder_without_writes_discards_nothing(store: ObjectStore) -> None:
    assert store.discard_abandoned_writes("data", datetime.now(UTC)) == Discarded()


@pytest.mark.parametrize("folder", ["data/", "../data", "/data"])
def test_a_malformed_folder_is_refused(store: ObjectStore, folder: str) -> None:
    with pytest.raises(InvalidArgument):
        store.discard_abandoned_writes(folder, datetime.now(UTC))


def test_a_naive_cutoff_is_refused(store: ObjectStore) -> None:
    """A naive datetime would be read in this machine's zone, against the store's UTC."""
    with pytest.raises(InvalidArgument, match="timezone-aware"):
        store.discard_abandoned_writes("data", datetime.now())


def test_a_local_temporary_file_ages_by_its_last_write(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """A killed write's file last written two days ago goes with a day's cutoff; one whose
    write is still under way keeps its file (every chunk touches it), and finishes."""
    store = LocalObjectStore(f"file://{tmp_path / 'root'}")
    abandon(store, request, "data/s1/old")
    (old,) = store.root.rglob(".tmp-*")
    two_days_ago = (datetime.now(UTC) - timedelta(days=2)).timestamp()
    os.utime(old, (two_days_ago, two_days_ago))
    first_written, go_on = threading.Event(), threading.Event()

    def slow_chunks() -> Iterator[bytes]:
        yield bytes(LOCAL_WRITTEN)
        first_written.set()
        assert go_on.wait(30)
        yield b"end"

    writer = threading.Thread(target=store.put_stream, args=("data/s1/live", slow_chunks()))
    writer.start()
    assert first_written.wait(30)

    discarded = store.discard_abandoned_writes("data", datetime.now(UTC) - timedelta(days=1))

    go_on.set()
    writer.join(30)
    assert discarded == Discarded(writes=1, bytes=LOCAL_WRITTEN)
    assert not old.exists()
    assert store.stat("data/s1/live").size == LOCAL_WRITTEN + 3
    assert leftovers(store, request) == []


def test_a_write_whose_file_was_discarded_under_it_says_so(tmp_path: Path) -> None:
    """A write stalled past the cutoff loses its file to the sweep: its rename then failed
    with a bare `FileNotFoundError` naming the temporary file."""
    store = LocalObjectStore(f"file://{tmp_path / 'root'}")

    def stalled_chunks() -> Iterator[bytes]:
        yield b"first"
        store.discard_abandoned_writes("data", datetime.now(UTC) + timedelta(seconds=1))
        yield b"last"

    with pytest.raises(Unavailable, match="discarded before it finished"):
        store.put_stream("data/s1/stalled", stalled_chunks())
    assert not store.exists("data/s1/stalled")


def test_a_write_if_absent_whose_file_was_discarded_under_it_says_so(tmp_path: Path) -> None:
    """As `put_stream`: the link into place found no file and raised a bare
    `FileNotFoundError`."""

    class SweptBeforeLink(LocalObjectStore):
        def _written(self, path: Path, key: str, source: StreamSource) -> tuple[Path, list[Path]]:
            written = super()._written(path, key, source)
            self.discard_abandoned_writes("_branchwater", datetime.now(UTC) + timedelta(seconds=1))
            return written

    store = SweptBeforeLink(f"file://{tmp_path / 'root'}")

    with pytest.raises(Unavailable, match="discarded before it finished"):
        store.put_if_absent("_branchwater/ranges/r1", lambda: b"range")
    assert not store.exists("_branchwater/ranges/r1")
