"""Reading an imported object where it lives, held to the version its import recorded.

An import never reads the bytes, so its entry records a version (`checksums.version`: an S3
ETag, or a local file's modification time and size), not a content hash; a read holds the
object to that version instead of hashing it. On S3 every GET is pinned (If-Match) to the
ETag a HEAD has just found to be the imported one, so no read returns another version's
bytes. A local file cannot be pinned: it is checked once open (`fstat` of the open file,
so a rewrite before or during the open is seen, and a file renamed over the path after
it was opened is not mistaken for it), and again whenever a read reaches its end.

Checking at the end suffices for a reader that reads to the end last: a rewrite gives the
file a new modification time that no later write gives back, so a check that passes
vouches for every byte read before it, and a rewrite during the read (an in-place write,
or a truncating `cp` that makes the file end early) fails that read instead of returning
mixed or missing bytes. It vouches for nothing read after it: a reader that reads the end
first and the rest afterwards (a Parquet footer, then its column chunks) is told only of a
rewrite before its last read reaching the end, and one that never reaches the end only of
a rewrite before the open.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from typing import Any, BinaryIO, cast

from branchwater.engine import failpoints
from branchwater.engine.errors import CorruptedData
from branchwater.engine.graveler.checksums import (
    IMPORTED_PREFIX,
    source_mismatch,
    version,
    version_mismatch,
)
from branchwater.engine.objects import ObjectStore
from branchwater.engine.objects.views import FileView

Corrupted = Callable[[str], CorruptedData]


def open_source(
    store: ObjectStore, key: str, imported: str, corrupted: Corrupted = CorruptedData
) -> BinaryIO:
    """The object at `key` of `store`, an imported entry's source, as a seekable file held
    to the version `imported` (`imported_version`): `corrupted(how it differs)` when it is
    another version once opened, or, for a local file, when a read reaching its end finds
    it rewritten; on S3 a read of another version fails in the store (`CorruptedData`).
    `NotFound` if it is gone. An import that knew no version (an empty ETag) opens it as
    it is."""
    if imported == IMPORTED_PREFIX:
        return store.open(key)
    info = store.stat(key)
    _raise_if(source_mismatch(info, imported), corrupted)
    failpoints.hit("source.after_check")
    f = store.open(key, etag=info.etag)
    try:
        descriptor = _descriptor(f)
        if descriptor is None:
            return f

        def rewritten() -> str | None:
            st = os.fstat(descriptor)
            now = version(None, st.st_mtime_ns // 1000, st.st_size)
            return version_mismatch(now, imported)

        _raise_if(rewritten(), corrupted)
        return io.BufferedReader(_Rechecked(f, rewritten, corrupted))
    except BaseException:
        f.close()
        raise


def _descriptor(f: BinaryIO) -> int | None:
    """The open file's descriptor, None where it has none (an S3 object)."""
    try:
        return f.fileno()
    except (OSError, AttributeError):  # io.UnsupportedOperation is an OSError
        return None


def _raise_if(mismatch: str | None, corrupted: Corrupted) -> None:
    if mismatch is not None:
        raise corrupted(mismatch)


class _Rechecked(FileView):
    """`f`, a local file, whose version is checked again (`rewritten`) after every read that
    reaches its end or finds it ended: a file truncated while open ends early, so that read
    is the one that tells."""

    def __init__(self, f: BinaryIO, rewritten: Callable[[], str | None], corrupted: Corrupted):
        super().__init__(f)
        self._rewritten = rewritten
        self._corrupted = corrupted
        self._size = f.seek(0, io.SEEK_END)
        f.seek(0)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        n = cast(io.BufferedIOBase, self._f).readinto(view)
        if (n == 0 and len(view) > 0) or self._f.tell() >= self._size:
            _raise_if(self._rewritten(), self._corrupted)
        return n

    def readall(self) -> bytes:
        data = self._f.read()
        _raise_if(self._rewritten(), self._corrupted)
        return data
