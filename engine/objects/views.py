"""A raw file over a store's file object, for wrappers that check or guard what it reads."""

from __future__ import annotations

import io
from typing import BinaryIO


class FileView(io.RawIOBase):
    """A raw, read-only, seekable file over `f` that closes it; subclasses check or guard
    what passes in `readinto` (and `readall`). Raw, so the buffer above keeps a file's
    protocol: `readline` reads a buffer per call, not a byte, and `peek`, `fileno` (where
    `f` has one) and `name` work as on `f`."""

    def __init__(self, f: BinaryIO) -> None:
        super().__init__()
        self._f = f

    @property
    def name(self) -> str:
        """`f`'s (a local file's path); an `AttributeError` where it has none, as on S3."""
        return self._f.name

    def fileno(self) -> int:
        return self._f.fileno()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._f.tell()

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._f.seek(offset, whence)

    def close(self) -> None:
        if not self.closed:
            self._f.close()
        super().close()
