"""The streaming half of the `ObjectStore` contract, on every driver: `put_stream` from chunks
and from file objects, `open` with ranged reads, and failed writes that leave nothing."""

from __future__ import annotations

import io
import os
import random
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from branchwater.engine.errors import CorruptedData, InvalidArgument, NotFound
from branchwater.engine.objects import ObjectStore
from branchwater.engine.objects import s3 as s3_module
from branchwater.engine.objects.local import LocalObjectStore
from branchwater.engine.objects.s3 import S3ObjectStore
from branchwater.engine.objects.store import MAX_READ_AHEAD, MIN_READ_AHEAD
from tests.fixtures.s3 import S3Server

MULTIPART = 2 * s3_module.PART_SIZE + 12345
"""Bytes that take three parts on S3."""
CLOCK_SLACK = timedelta(seconds=2)
"""S3 stamps whole seconds."""


class Boom(Exception):
    """What a source fails with midway."""


def chunks_of(data: bytes, seed: int = 0) -> Iterator[bytes]:
    """`data` in chunks of uneven sizes, empty ones among them."""
    rng = random.Random(seed)
    at = 0
    while at < len(data):
        size = rng.choice([0, 1, 1000, 65536, 3 << 20])
        yield data[at : at + size]
        at += size


def failing_after(data: bytes) -> Iterator[bytes]:
    yield from chunks_of(data)
    raise Boom("the source broke")


def leftovers(store: ObjectStore, request: pytest.FixtureRequest) -> list[str]:
    """Anything a failed write could leave: objects, temporary files, pending uploads (seen
    through a plain boto3 client of the test's server)."""
    keys = [info.key for info in store.list_objects()]
    if isinstance(store, LocalObjectStore):
        return keys + [str(p) for p in store.root.rglob("*") if p.is_file()]
    assert isinstance(store, S3ObjectStore)
    server: S3Server = request.getfixturevalue("s3_server")
    client: Any = server.client()
    pending = client.list_multipart_uploads(Bucket=store.bucket).get("Uploads", [])
    client.close()
    return keys + [u["Key"] for u in pending]


@pytest.mark.parametrize("size", [0, 1, 5000, MULTIPART])
def test_put_stream_from_chunks_round_trips(store: ObjectStore, size: int) -> None:
    data = os.urandom(size)
    info = store.put_stream("big/object", chunks_of(data, size))
    assert (info.key, info.size) == ("big/object", size)
    assert store.stat("big/object").size == size
    assert store.get("big/object") == data


def test_put_stream_from_a_file_object_round_trips(store: ObjectStore, tmp_path: Path) -> None:
    data = os.urandom(MULTIPART)
    source = tmp_path / "source.bin"
    source.write_bytes(data)
    with open(source, "rb") as f:
        assert store.put_stream("from/file", f).size == len(data)
    assert store.put_stream("from/bytesio", io.BytesIO(data)).size == len(data)
    assert store.get("from/file") == store.get("from/bytesio") == data


def test_put_and_get_of_bytes_are_the_same_path(store: ObjectStore) -> None:
    store.put("k", b"small")
    with store.open("k") as f:
        assert f.read() == b"small"
    with pytest.raises(InvalidArgument, match="bytes"):
        store.put("k", "text")  # type: ignore[arg-type]


def test_ranged_reads_return_exactly_the_asked_bytes(store: ObjectStore) -> None:
    data = os.urandom(3 * MAX_READ_AHEAD + 17)
    store.put_stream("ranged", chunks_of(data))
    rng = random.Random(7)
    with store.open("ranged") as f:
        assert f.readable() and f.seekable()
        assert f.seek(0, io.SEEK_END) == len(data)
        assert f.seek(-8, io.SEEK_END) == len(data) - 8
        assert f.read(8) == data[-8:]
        assert f.read(8) == b""
        for _ in range(40):
            start = rng.randrange(len(data))
            size = rng.choice([1, 100, 70000, MAX_READ_AHEAD + 5])
            assert f.seek(start) == start
            assert f.read(size) == data[start : start + size]
            assert f.tell() == min(start + size, len(data))
        f.seek(10)
        f.seek(5, io.SEEK_CUR)
        assert f.read(3) == data[15:18]
        f.seek(0)
        assert f.read() == data


def test_open_of_a_missing_object_is_not_found(store: ObjectStore) -> None:
    with pytest.raises(NotFound, match="absent"):
        store.open("absent")


def test_a_stream_that_fails_midway_leaves_nothing(
    store: ObjectStore, request: pytest.FixtureRequest
) -> None:
    with pytest.raises(Boom):
        store.put_stream("half", failing_after(os.urandom(MULTIPART)))
    assert leftovers(store, request) == []
    with pytest.raises(NotFound):
        store.stat("half")


@pytest.mark.parametrize("size", [0, 5000, MULTIPART])
def test_copy_writes_the_bytes_under_a_new_key_stamped_as_a_new_object(
    store: ObjectStore, size: int
) -> None:
    """Stamped when copied, not when the source was written: what moves an upload that
    took hours to a fresh stamp (`fresh_object`). S3 stamps the copy itself."""
    data = os.urandom(size)
    store.put_stream("from/src", chunks_of(data))
    if isinstance(store, LocalObjectStore):
        old = (datetime.now(UTC) - timedelta(hours=7)).timestamp()
        os.utime(store.root / "from/src", (old, old))
    before = datetime.now(UTC)
    info = store.copy("from/src", "to/dst")
    stat = store.stat("to/dst")
    assert (info.key, info.size) == (stat.key, stat.size) == ("to/dst", size)
    assert before - CLOCK_SLACK <= info.mtime <= datetime.now(UTC) + CLOCK_SLACK
    assert abs(stat.mtime - info.mtime) <= CLOCK_SLACK
    assert store.get("to/dst") == store.get("from/src") == data


def test_a_copy_of_a_missing_object_is_not_found_and_writes_nothing(
    store: ObjectStore, request: pytest.FixtureRequest
) -> None:
    with pytest.raises(NotFound, match="from/missing"):
        store.copy("from/missing", "to/dst")
    assert leftovers(store, request) == []


@pytest.mark.parametrize(
    "source",
    [
        lambda: b"bytes",
        lambda: "text",
        lambda: [b"ok", "text"],
        lambda: io.StringIO("text"),
        lambda: 42,
    ],
    ids=["bytes", "str", "str-chunk", "text-file", "int"],
)
def test_a_source_that_is_not_binary_is_refused_before_writing(
    store: ObjectStore, source: Callable[[], Any], request: pytest.FixtureRequest
) -> None:
    with pytest.raises(InvalidArgument, match=r"bytes|binary"):
        store.put_stream("refused", source())
    assert leftovers(store, request) == []


@pytest.mark.s3
def test_s3_ranged_read_fetches_what_is_asked(
    s3_store: S3ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = os.urandom(4 * MAX_READ_AHEAD)
    s3_store.put_stream("ranged", chunks_of(data))
    fetched: list[tuple[int, int | None]] = []
    original = S3ObjectStore._get_range

    def spy(self: S3ObjectStore, key: str, etag: str, start: int, stop: int | None) -> bytes:
        fetched.append((start, stop))
        return original(self, key, etag, start, stop)

    monkeypatch.setattr(S3ObjectStore, "_get_range", spy)
    with s3_store.open("ranged") as f:
        f.seek(-8, io.SEEK_END)
        assert f.read(8) == data[-8:]
        f.seek(1000)
        assert f.read(10) == data[1000:1010]
        assert f.read(10) == data[1010:1020]
    assert fetched == [(len(data) - 8, len(data)), (1000, 1010), (1010, 1020 + MIN_READ_AHEAD)]
    fetched.clear()
    heads: list[str] = []
    monkeypatch.setattr(s3_module.obstore, "head", lambda *a, **k: heads.append(a[1]))
    assert s3_store.get("ranged") == data
    assert fetched == [] and heads == []  # get is one whole-object GET, no HEAD first


@pytest.mark.s3
def test_s3_object_replaced_during_a_read_fails_it(s3_store: S3ObjectStore) -> None:
    data = os.urandom(2 * MAX_READ_AHEAD)
    s3_store.put("k", data)
    with s3_store.open("k") as f:
        assert f.read(10) == data[:10]
        s3_store.put("k", os.urandom(len(data)))
        f.seek(MAX_READ_AHEAD + 1)
        with pytest.raises(CorruptedData, match="replaced while it was being read"):
            f.read(10)


@pytest.mark.s3
def test_s3_a_stream_failing_after_parts_in_flight_aborts_the_upload(
    s3_store: S3ObjectStore, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More parts than are sent at once went up before the source broke: none stays."""
    monkeypatch.setattr(s3_module, "STREAM_PART", s3_module.PART_SIZE)
    parts = s3_module.PARTS_IN_FLIGHT + 2
    with pytest.raises(Boom):
        s3_store.put_stream("half", failing_after(os.urandom(parts * s3_module.PART_SIZE)))
    assert leftovers(s3_store, request) == []


@pytest.mark.s3
def test_s3_a_stream_longer_than_an_upload_holds_is_refused_and_aborted(
    s3_store: S3ObjectStore, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(s3_module, "MAX_PARTS", 2)
    monkeypatch.setattr(s3_module, "STREAM_PART", s3_module.PART_SIZE)
    with pytest.raises(InvalidArgument, match="give its size"):
        s3_store.put_stream("huge", chunks_of(os.urandom(2 * s3_module.PART_SIZE + 1)))
    assert leftovers(s3_store, request) == []


@pytest.mark.s3
def test_s3_a_multipart_upload_streams_from_an_s3_object_being_read(
    s3_store: S3ObjectStore, request: pytest.FixtureRequest
) -> None:
    """A copy (`Ref.open` into `upload`, the filesystem's `cp`): the source's reads go
    through obstore while obstore draws the upload's stream, which panicked inside obstore's
    runtime and left the upload open."""
    data = os.urandom(5 * s3_module.PART_SIZE)
    s3_store.put_stream("source", chunks_of(data))
    with s3_store.open("source") as source:
        assert s3_store.put_stream("copy", source).size == len(data)
    assert s3_store.get("copy") == data
    assert sorted(leftovers(s3_store, request)) == ["copy", "source"]


GiB = 1 << 30


@pytest.mark.parametrize(
    "size", [None, 0, 1, 5 << 20, 78 * GiB, 80 * GiB, 700 * GiB, s3_module.MAX_OBJECT]
)
def test_s3_part_plan_reaches_the_size_within_s3s_limits_and_bounded_memory(
    size: int | None,
) -> None:
    """Parts of whole MiB, at least 5 MiB, no larger than needed; the parts held (those in
    flight and the one filling) within the memory budget, or two when one part exceeds it."""
    part, in_flight = s3_module.part_plan(size)
    assert part >= 5 << 20 and part % (1 << 20) == 0 and in_flight >= 1
    if size is not None:
        assert part * s3_module.MAX_PARTS >= size
        assert part == s3_module.PART_SIZE or part - (1 << 20) < size / s3_module.MAX_PARTS
    assert (in_flight + 1) * part <= max(s3_module.UPLOAD_MEMORY, 2 * part)


def test_s3_part_plan_of_more_than_an_s3_object_holds_is_refused() -> None:
    with pytest.raises(InvalidArgument, match="5 TiB an S3 object holds"):
        s3_module.part_plan(s3_module.MAX_OBJECT + 1)


@pytest.mark.s3
def test_s3_parts_are_sized_from_a_seekable_file_or_a_given_size(
    s3_store: S3ObjectStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With uploads of two parts at most, 20 MiB need 10 MiB parts: the file's size, or the
    size given with a stream, sizes them (S3's ETag of a multipart upload counts its parts);
    a larger size than S3 holds is refused before anything is written."""
    monkeypatch.setattr(s3_module, "MAX_PARTS", 2)
    data = os.urandom(20 << 20)
    path = tmp_path / "twenty"
    path.write_bytes(data)
    with open(path, "rb") as f:
        s3_store.put_stream("from-file", f)
    s3_store.put_stream("with-size", chunks_of(data), size=len(data))
    for key in ("from-file", "with-size"):
        assert s3_store.get(key) == data
        assert (s3_store.stat(key).etag or "").endswith("-2")
    with pytest.raises(InvalidArgument, match="5 TiB"):
        s3_store.put_stream("too-big", [b"x"], size=s3_module.MAX_OBJECT + 1)
    assert not s3_store.exists("too-big")


@pytest.mark.s3
def test_s3_a_multipart_object_is_stamped_as_its_listing_shows_it(
    s3_store: S3ObjectStore,
) -> None:
    """AWS stamps a multipart upload when it began: the write reads its stamp back, so an
    upload that took hours is seen to look that old before it is staged."""
    info = s3_store.put_stream("big", chunks_of(os.urandom(MULTIPART)))
    assert info == s3_store.stat("big")
    (listed,) = s3_store.list_objects("big")
    assert listed.mtime == info.mtime


@pytest.mark.s3
def test_s3_a_large_copy_is_copied_in_parts_on_the_server(
    s3_store: S3ObjectStore, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest
) -> None:
    monkeypatch.setattr(s3_module, "COPY_THRESHOLD", s3_module.PART_SIZE)
    monkeypatch.setattr(s3_module, "COPY_PART", s3_module.PART_SIZE)
    data = os.urandom(MULTIPART)
    s3_store.put_stream("src", chunks_of(data))
    info = s3_store.copy("src", "dst")
    assert info.etag is not None and info.etag.endswith("-3")
    assert s3_store.get("dst") == data
    assert sorted(leftovers(s3_store, request)) == ["dst", "src"]
