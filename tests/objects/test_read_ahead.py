"""The adaptive read-ahead (`AdaptiveReader`) over the S3 driver's ranged GETs on the real
SeaweedFS server: random small reads fetch what they ask, a front-to-back read grows to
`MAX_READ_AHEAD` a GET, and the bytes read are the object's either way."""

from __future__ import annotations

import io
import os
import random
from typing import Any

import pytest

from branchwater.engine.objects.s3 import S3ObjectStore, _RangeReader
from branchwater.engine.objects.store import MAX_READ_AHEAD, AdaptiveReader

pytestmark = pytest.mark.s3

SIZE = 24 << 20


class Counted:
    """Counts the GETs and bytes the driver fetches."""

    def __init__(self, store: S3ObjectStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.gets = 0
        self.bytes = 0
        real = store._get_range

        def counted(key: str, etag: str, start: int, stop: int | None) -> Any:
            data = real(key, etag, start, stop)
            self.gets += 1
            self.bytes += len(data)
            return data

        monkeypatch.setattr(store, "_get_range", counted)


def opened(store: S3ObjectStore, key: str) -> AdaptiveReader:
    info = store.stat(key)
    return AdaptiveReader(_RangeReader(store, key, info.size, info.etag or "*"))


def test_random_small_reads_fetch_what_they_ask_sequential_reads_grow(
    s3_store: S3ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = os.urandom(SIZE)
    s3_store.put("big.bin", data)
    count = Counted(s3_store, monkeypatch)
    rng = random.Random(7)
    asked = 0
    with opened(s3_store, "big.bin") as f:
        # A Parquet-like pattern: the footer's length, the footer, then column chunks.
        f.seek(-8, io.SEEK_END)
        assert f.read(8) == data[-8:]
        f.seek(-(64 << 10), io.SEEK_END)
        assert f.read((64 << 10) - 8) == data[-(64 << 10) : -8]
        asked += 8 + (64 << 10) - 8
        for _ in range(20):
            start = rng.randrange(0, SIZE - 4096)
            f.seek(start)
            assert f.read(4096) == data[start : start + 4096]
            asked += 4096
    assert count.bytes == asked, "random reads fetch exactly what they ask"
    random_gets = count.gets

    # The fixed 4 MiB read-ahead `S3ObjectStore.open` had fetches a window per random read.
    count.gets = count.bytes = 0
    info = s3_store.stat("big.bin")
    raw = _RangeReader(s3_store, "big.bin", info.size, info.etag or "*")
    with io.BufferedReader(raw, buffer_size=MAX_READ_AHEAD) as fixed:
        for _ in range(20):
            start = rng.randrange(0, SIZE - 4096)
            fixed.seek(start)
            assert fixed.read(4096) == data[start : start + 4096]
    print(f"fixed read-ahead: {count.bytes} bytes for {20 * 4096} asked")
    assert count.bytes > 10 * 20 * 4096

    count.gets = count.bytes = 0
    with opened(s3_store, "big.bin") as f:
        chunks = [f.read(8192) for _ in range(SIZE // 8192)]
    assert b"".join(chunks) == data
    assert count.bytes == SIZE, "a front-to-back read fetches each byte once"
    # Doubling from 64 KiB reaches 4 MiB within a few GETs: far fewer than one per read.
    assert count.gets <= SIZE // MAX_READ_AHEAD + 10
    assert random_gets == 22


def test_no_read_fetches_more_than_asked_plus_the_window(
    s3_store: S3ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = os.urandom(9 << 20)
    s3_store.put("mid.bin", data)
    count = Counted(s3_store, monkeypatch)
    with opened(s3_store, "mid.bin") as f:
        f.seek(100)
        assert f.read(10) == data[100:110]
        assert count.bytes == 10
        assert f.read(10) == data[110:120]  # sequential: asked plus a 64 KiB window
        assert count.bytes == 10 + 10 + (64 << 10)
        assert f.read(-1) == data[120:]  # the rest, the buffer's part not fetched again
        assert count.bytes == len(data) - 100
        f.seek(0)
        assert f.read(5) == data[:5]
