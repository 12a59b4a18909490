"""Uploads: write the content to a fresh address, then stage it (see `Branch.upload`).

The content streams from bytes, a local file or a binary file object; its SHA-256 is
computed on the way to the store, so the entry records the bytes written, whatever a file
does meanwhile. Content the branch already shows at the path is neither written nor staged.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO

from branchwater.engine.errors import InvalidArgument
from branchwater.engine.graveler import writes
from branchwater.engine.graveler.checksums import ContentHasher
from branchwater.engine.graveler.graveler import Graveler
from branchwater.engine.graveler.model import Entry, Metadata, RepositoryRecord
from branchwater.engine.objects.store import StreamSource, iter_chunks

UploadSource = bytes | bytearray | memoryview | str | Path | BinaryIO
"""Content, a local file's path, or a binary file object read from where it stands to EOF."""


class Upload:
    """One upload of content to `path` on a branch, with `metadata`."""

    def __init__(
        self,
        g: Graveler,
        repo: RepositoryRecord,
        branch_name: str,
        path: str,
        metadata: Metadata,
        next_address: Callable[[], str],
    ) -> None:
        self._g = g
        self._repo = repo
        self._branch = branch_name
        self._path = path
        self._metadata = metadata
        self._next_address = next_address

    def run(self, source: UploadSource) -> Entry:
        """Upload `source`; its type is checked before anything is read or written."""
        if isinstance(source, bytes | bytearray | memoryview):
            return self._from_bytes(bytes(source))
        if isinstance(source, str | Path):
            with _open_local(source) as f:
                return self._from_file(f)
        if callable(getattr(source, "read", None)):
            return self._from_file(source)
        raise InvalidArgument(
            "upload data must be bytes, a local file's path or a binary file object, "
            f"not {type(source).__name__}"
        )

    def _from_bytes(self, data: bytes) -> Entry:
        checksum = ContentHasher().update(data).hexdigest()

        def md5() -> str:
            return hashlib.md5(data, usedforsecurity=False).hexdigest()

        existing = self._unchanged(len(data), checksum, md5)
        return existing or self._write([data], (len(data), checksum))

    def _from_file(self, f: BinaryIO) -> Entry:
        """A seekable file is hashed first: the branch may show its content already, and a
        read of a local file costs far less than writing it (to S3 above all). A stream is
        written, then dropped if the branch turns out to show its content."""
        if not f.seekable():
            return self._write(f, None)
        start = f.tell()
        hasher = ContentHasher()
        for chunk in iter_chunks(f):
            hasher.update(chunk)
        f.seek(start)
        existing = self._unchanged(hasher.size, hasher.hexdigest())
        return existing or self._write(f, (hasher.size, hasher.hexdigest()))

    def _write(self, source: StreamSource, checked: tuple[int, str] | None) -> Entry:
        """Write to a fresh address, hashing on the way, then stage. Content other than what
        was `checked` (a stream, or a file that changed since) is checked against the branch
        now, and its object deleted if the branch shows it already."""
        hasher = ContentHasher()
        address = self._next_address()
        store = self._g.objects(self._repo.storage_namespace)
        info = store.put_stream(address, _hashed(iter_chunks(source), hasher))
        content = (hasher.size, hasher.hexdigest())
        if content != checked:
            existing = self._unchanged(*content)
            if existing is not None:
                store.delete([address])
                return existing
        entry = Entry(self._path, address, hasher.size, content[1], info.mtime, self._metadata)
        writes.stage_entry(self._g, self._repo, self._branch, entry)
        return entry

    def _unchanged(
        self, size: int, checksum: str, legacy_md5: Callable[[], str] | None = None
    ) -> Entry | None:
        return writes.unchanged_entry(
            self._g,
            self._repo,
            self._branch,
            self._path,
            size,
            checksum,
            self._metadata,
            legacy_md5,
        )


def _hashed(chunks: Iterator[bytes], hasher: ContentHasher) -> Iterator[bytes]:
    for chunk in chunks:
        hasher.update(chunk)
        yield chunk


def _open_local(path: str | Path) -> BinaryIO:
    try:
        return open(path, "rb")
    except OSError as exc:
        raise InvalidArgument(
            f"cannot read local file {str(path)!r} to upload: {exc.strerror or exc}"
        ) from exc
