"""A file object over a stored object that checks it against its entry as it is read.

The size is checked when it opens, and again by every read: one finding the object ended
before that size (it was truncated while open) or going past it fails instead of returning
a short or long object as a normal end. The checksum, where the engine can recompute it, once the
bytes from the first to the last have all been read, in any number of reads: reads that go
back over bytes already hashed, or seek, are served as asked, and hashing goes on from where
it stopped when a read covers that point again. A reader that never reads some byte is
never told about the checksum, only about the size.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any, BinaryIO

from branchwater.engine.errors import CorruptedData
from branchwater.engine.graveler.checksums import digest_mismatch, recomputable_hash, size_mismatch
from branchwater.engine.graveler.model import Entry
from branchwater.engine.objects.views import FileView

Corrupted = Callable[[str], CorruptedData]
"""Builds the error for a mismatch, naming what the reader knows (path, address, store)."""


def verified(f: BinaryIO, entry: Entry, corrupted: Corrupted) -> BinaryIO:
    """`f` (at its start) checked against `entry`; `CorruptedData` from `corrupted` at once
    for a wrong size, else from the read that completes the content."""
    try:
        size = f.seek(0, io.SEEK_END)
        f.seek(0)
        mismatch = size_mismatch(entry, size)
        if mismatch is not None:
            raise corrupted(mismatch)
        return io.BufferedReader(_VerifiedReader(f, entry, corrupted))
    except BaseException:
        f.close()
        raise


class _VerifiedReader(FileView):
    def __init__(self, f: BinaryIO, entry: Entry, corrupted: Corrupted) -> None:
        super().__init__(f)
        self._entry = entry
        self._corrupted = corrupted
        self._hasher = recomputable_hash(entry)
        self._hashed = 0
        self._pos = 0
        self._check_if_complete()

    def fileno(self) -> int:
        """None: a reader of the descriptor would read around the checks."""
        raise io.UnsupportedOperation("a checked read has no file descriptor")

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        self._pos = self._f.seek(offset, whence)
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = self._f.readinto(view)  # type: ignore[attr-defined]
        if n == 0 and len(view) > 0:
            self._check_not_ended()
        self._read(view[:n])
        return int(n)

    def readall(self) -> bytes:
        data = self._f.read()
        self._read(memoryview(data))
        self._check_not_ended()
        return data

    def _check_not_ended(self) -> None:
        """At an end of file: the object may not end before its size."""
        if self._pos < self._entry.size:
            raise self._corrupted(
                f"it ended after {self._pos} of the {self._entry.size} bytes its entry "
                "records (it was truncated while open)"
            )

    def _read(self, data: memoryview) -> None:
        start, self._pos = self._pos, self._pos + len(data)
        if data and self._pos > self._entry.size:
            raise self._corrupted(
                f"it holds more than the {self._entry.size} bytes its entry records (it "
                "grew while open)"
            )
        if self._hasher is not None and start <= self._hashed < self._pos:
            self._hasher.update(data[self._hashed - start :])
            self._hashed = self._pos
            self._check_if_complete()

    def _check_if_complete(self) -> None:
        if self._hasher is None or self._hashed != self._entry.size:
            return
        mismatch = digest_mismatch(self._entry, self._hasher.hexdigest())
        self._hasher = None
        if mismatch is not None:
            raise self._corrupted(mismatch)
