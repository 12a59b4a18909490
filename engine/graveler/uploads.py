"""Uploads: write the content to a fresh address, then stage it (see `Branch.upload`).

The content streams from bytes, a local file or a binary file object; its SHA-256 is
computed on the way to the store, so the entry records the bytes written, whatever a file
does meanwhile. Content the branch already shows at the path is neither written nor staged.
An exclusive upload stages only a path the branch does not show (`writes.create_entry`).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import BinaryIO

from branchwater.engine.errors import (
    BranchwaterError,
    InvalidArgument,
    NotFound,
    OutcomeUnknown,
    PathExists,
    Unavailable,
)
from branchwater.engine.graveler import writes
from branchwater.engine.graveler.checksums import ContentHasher
from branchwater.engine.graveler.graveler import Graveler
from branchwater.engine.graveler.model import Entry, Metadata, RepositoryRecord, metadata_json
from branchwater.engine.graveler.reads import find_branch_look
from branchwater.engine.objects.store import (
    ObjectInfo,
    ObjectStore,
    StreamSource,
    iter_chunks,
    known_size,
)

log = logging.getLogger(__name__)

UploadSource = bytes | bytearray | memoryview | str | Path | BinaryIO
"""Content, a local file's path, or a binary file object read from where it stands to EOF."""


class Upload:
    """One upload of content to `path` on a branch, with `metadata`; `exclusive`: only where
    the branch shows nothing at `path`, else `PathExists` (its object deleted)."""

    def __init__(
        self,
        g: Graveler,
        repo: RepositoryRecord,
        branch_name: str,
        path: str,
        metadata: Metadata,
        next_address: Callable[[], str],
        *,
        exclusive: bool = False,
    ) -> None:
        self._g = g
        self._repo = repo
        self._branch = branch_name
        self._path = path
        self._metadata = metadata
        self._next_address = next_address
        self._exclusive = exclusive

    def run(self, source: UploadSource) -> Entry:
        """Upload `source`; its type is checked before anything is read or written, and an
        exclusive upload's path before anything is written."""
        if self._exclusive and self._shown() is not None:
            raise writes.path_exists(self._repo, self._branch, self._path)
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
        """Content is hashed as it is written, in one pass. Only a seekable file the branch
        may already show (an entry at the path with its size and metadata: a retry, most
        likely) is hashed first, so that a retry writes nothing; a stream, or a file that
        changed meanwhile, is checked after its write, its object dropped if unchanged."""
        if not f.seekable():
            return self._write(f, None)
        if not self._may_be_unchanged(known_size(f) or 0):
            return self._write(f, None, recheck=False)
        start = f.tell()
        hasher = ContentHasher()
        for chunk in iter_chunks(f):
            hasher.update(chunk)
        f.seek(start)
        existing = self._unchanged(hasher.size, hasher.hexdigest())
        return existing or self._write(f, (hasher.size, hasher.hexdigest()))

    def _shown(self) -> Entry | None:
        return find_branch_look(self._g, self._repo, self._branch, self._path).value

    def _may_be_unchanged(self, size: int) -> bool:
        if self._exclusive:
            return False
        shown = self._shown()
        return (
            shown is not None
            and shown.size == size
            and metadata_json(shown.metadata) == metadata_json(self._metadata)
        )

    def _write(
        self, source: StreamSource, checked: tuple[int, str] | None, *, recheck: bool = True
    ) -> Entry:
        """Write to a fresh address, hashing on the way, then stage. Content other than what
        was `checked` (a stream, or a file that changed since) is checked against the branch
        now, and its object deleted if the branch shows it already; unless `recheck` is
        off, when the branch was seen to show nothing of its size at the path."""
        hasher = ContentHasher()
        store = self._g.objects(self._repo.storage_namespace)
        address, info = write_fresh(
            store,
            _hashed(iter_chunks(source), hasher),
            self._next_address,
            size=known_size(source),
            writing=f"writing {self._path!r}",
            again="upload it again",
        )
        content = (hasher.size, hasher.hexdigest())
        if recheck and content != checked:
            existing = self._unchanged(*content)
            if existing is not None:
                discard(store, address)
                return existing
        entry = Entry(self._path, address, hasher.size, content[1], info.mtime, self._metadata)
        if not self._exclusive:
            writes.stage_entry(self._g, self._repo, self._branch, entry)
            return entry
        try:
            writes.create_entry(self._g, self._repo, self._branch, entry)
        except PathExists:
            discard(store, address)
            raise
        return entry

    def _unchanged(
        self, size: int, checksum: str, legacy_md5: Callable[[], str] | None = None
    ) -> Entry | None:
        if self._exclusive:
            return None
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


RESTAMP_AFTER = timedelta(hours=1)
"""How long ago a write may have begun, or its object look written, before the object is
copied to a fresh address to be staged there. S3 stamps a multipart object when its upload
began (AWS does), so an upload that took hours lists as that old, and a GC run that scanned
the branch before the entry was staged would take it for garbage once older than the run's
minimum age (by default 6 hours and 5 minutes at the least); and its address's slice was
opened before the write began, while an optimized run takes a slice's objects to land
within the token expiry and a slice's life of its opening. An hour leaves the rest of
those for the copy itself and for clocks that disagree."""


def written_long_ago(*moments: datetime) -> bool:
    """Whether the earliest of `moments` (a write's start, its object's stamp) is more than
    `RESTAMP_AFTER` ago."""
    return datetime.now(UTC) - min(moments) > RESTAMP_AFTER


def write_fresh(
    store: ObjectStore,
    source: StreamSource,
    next_address: Callable[[], str],
    *,
    size: int | None,
    writing: str,
    again: str,
) -> tuple[str, ObjectInfo]:
    """Write `source` to a new address, moved to a fresh one if it took long
    (`fresh_object`): the address and info to stage. A lost reply is `Unavailable` saying
    `writing` (what the caller writes) staged nothing and to do `again`, not the store's
    `OutcomeUnknown`: nothing refers to the object yet, so reading its key settles nothing
    a caller could act on, and GC collects it once old."""
    started = datetime.now(UTC)
    address = next_address()
    try:
        info = store.put_stream(address, source, size=size)
    except OutcomeUnknown as exc:
        raise Unavailable(
            f"{writing} to {store.url} got no reply, so nothing was staged: {again}"
        ) from exc
    return fresh_object(
        store, address, info, next_address, stale=written_long_ago(started, info.mtime)
    )


def fresh_object(
    store: ObjectStore,
    address: str,
    info: ObjectInfo,
    next_address: Callable[[], str],
    *,
    stale: bool,
    drop_written: bool = True,
) -> tuple[str, ObjectInfo]:
    """The address and info to stage for an object just written at `address`: itself, or
    where it is `stale` (`written_long_ago`, or stamped before its link token was issued),
    a copy at a new address (server-side on S3: minutes where the write took hours), the
    first deleted unless `drop_written` is off (a link that fails later can be run again
    with its token; GC collects the first once old). A GC run that deletes the first
    meanwhile fails the write (`Unavailable`: write again), and so does a copy that took
    long itself; nothing is staged then."""
    if not stale:
        return address, info
    fresh = next_address()
    began = datetime.now(UTC)
    try:
        copied = store.copy(address, fresh)
    except NotFound:
        raise Unavailable(
            f"the object written at {address!r} in {store.url} looked written "
            f"{_hours_since(info.mtime)} hours ago (S3 stamps a multipart upload when it "
            "begins) and a GC run collected it before it was staged; nothing was staged: "
            "write it again"
        ) from None
    if written_long_ago(began, copied.mtime):
        for unstaged in (fresh, address) if drop_written else (fresh,):
            discard(store, unstaged)
        raise Unavailable(
            f"copying {address!r} in {store.url} to a fresh address, to stage it younger "
            f"than GC's minimum age, took {_hours_since(began)} hours, so the copy looks as "
            "old; nothing was staged: write it again, in smaller objects"
        )
    if drop_written:
        discard(store, address)
    return fresh, copied


def _hours_since(moment: datetime) -> str:
    return f"{(datetime.now(UTC) - moment).total_seconds() / 3600:.1f}"


def discard(store: ObjectStore, address: str) -> None:
    """Delete an object nothing stages, best effort: the write's outcome is decided already
    (the branch shows the content, the path is another's, the copy is staged), and an object
    left behind is unreferenced, which GC collects once old."""
    try:
        store.delete([address])
    except BranchwaterError as exc:
        log.warning("left %s in %s for GC to collect: %s", address, store.url, exc)


def _hashed(chunks: Iterator[bytes], hasher: ContentHasher) -> Iterator[bytes]:
    """`chunks`, the first hashed here (content of one chunk starts no thread), each later
    one on a thread of its own while the store writes it (hashlib and file or socket writes
    release the GIL), so hashing a large stream adds little time where writing takes as
    long. Chunks are hashed in order, one at a time."""
    first = next(chunks, None)
    if first is None:
        return
    hasher.update(first)
    yield first
    with ThreadPoolExecutor(1, thread_name_prefix="upload-hash") as pool:
        for chunk in chunks:
            hashing = pool.submit(hasher.update, chunk)
            yield chunk
            hashing.result()


def _open_local(path: str | Path) -> BinaryIO:
    try:
        return open(path, "rb")
    except (OSError, ValueError) as exc:  # ValueError: a NUL in the path
        raise InvalidArgument(
            f"cannot read local file {str(path)!r} to upload: "
            f"{getattr(exc, 'strerror', None) or exc}"
        ) from exc
