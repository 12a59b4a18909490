"""The `ObjectStore` contract: a flat namespace of immutable-once-written byte objects.

Keys are `/`-separated strings relative to the store's root (a directory or an S3 prefix).
Graveler writes data objects, ranges and metaranges through this; GC lists and deletes.
Objects stream both ways (`put_stream`, `open`), so their size is never bounded by memory;
`put` and `get` of bytes are conveniences over the same code path.
"""

from __future__ import annotations

import abc
import io
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, BinaryIO

from branchwater.engine.errors import InvalidArgument, NotFound

CHUNK_SIZE = 1 << 20
"""Bytes read from a file object per call while streaming it."""

StreamSource = Iterable[bytes] | BinaryIO
"""What `put_stream` writes: an iterable of byte chunks, or a binary file object read to EOF."""


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    mtime: datetime
    etag: str | None = None
    """The store's version tag where its listing gives one (S3's ETag, unquoted)."""


@dataclass(frozen=True)
class Listing:
    """One folder level: its objects as columns (names relative to the folder, sizes, and
    modification times in epoch nanoseconds: no datetime per object, for listings of
    millions) and its subfolders' names. Without metadata, sizes and times are None."""

    names: list[str]
    sizes: list[int] | None
    mtimes_ns: list[int] | None
    directories: list[str]


@dataclass(frozen=True)
class Discarded:
    """Abandoned writes a store discarded (`discard_abandoned_writes`), and their bytes."""

    writes: int = 0
    bytes: int = 0

    def __add__(self, other: Discarded) -> Discarded:
        return Discarded(self.writes + other.writes, self.bytes + other.bytes)


@dataclass(frozen=True)
class Stats:
    """Sizes and modification times (epoch nanoseconds) of keys, in the keys' order; None
    where the object is gone or the key names no object (a folder, say)."""

    sizes: list[int | None]
    mtimes_ns: list[int | None]


class ObjectStore(abc.ABC):
    url: str

    @abc.abstractmethod
    def put_stream(self, key: str, source: StreamSource, size: int | None = None) -> ObjectInfo:
        """Write `source` without holding it whole, atomically: a reader sees the old object,
        the whole new one, or nothing; a failed write leaves nothing behind. `size`, the
        stream's length where the caller knows it (`known_size`), lets S3 size its parts
        for it; a seekable file's is found without it."""

    @abc.abstractmethod
    def open(self, key: str, *, etag: str | None = None) -> BinaryIO:
        """A readable, seekable file object; reads fetch only what is asked (plus a bounded
        read-ahead). `NotFound` names the key and the store URL. `etag` (S3's, unquoted), a
        version every read must match, else `CorruptedData`; without it, the version found
        when opening. A store without ETags (local files) has nothing to match it with."""

    def put(self, key: str, data: bytes) -> ObjectInfo:
        """Write `data` (bytes) atomically."""
        if not isinstance(data, bytes | bytearray | memoryview):
            raise InvalidArgument(f"object data must be bytes, not {type(data).__name__}")
        return self.put_stream(key, [bytes(data)])

    def copy(self, src: str, dst: str) -> ObjectInfo:
        """Write a copy of the object at `src` to `dst` as `put_stream` writes (atomically,
        in bounded memory), stamped as a new object is: when the copy ends, or on S3 when
        it begins (a server-side copy, which takes minutes where the write took hours).
        `NotFound` when `src` is missing; one deleted mid-copy leaves nothing at `dst`."""
        with self.open(src) as f:
            return self.put_stream(dst, f)

    def put_if_absent(self, key: str, encode: Callable[[], bytes]) -> bool:
        """Write the bytes `encode` makes unless `key` holds an object already; whether it
        wrote. Of two writers racing for a new key one writes and the other is told it did
        not, where the store can promise it (local files, S3 with conditional writes); here,
        for a store that cannot, a HEAD then a PUT. Content-addressed objects need no more
        (an object there holds the same bytes); a namespace's marker needs the promise.
        `encode` runs only where the bytes are sent. Where a reply was lost (S3), a key
        found holding exactly these bytes counts as written, as no reader can tell the two
        apart: a caller that must know it won writes bytes no other writer does. A write
        nothing settles is `OutcomeUnknown`: it may have been applied, and may still be."""
        if self.exists(key):
            return False
        self.put(key, encode())
        return True

    def get(self, key: str) -> bytes:
        """Return the object's bytes; `NotFound` names the key and the store URL."""
        with self.open(key) as f:
            return f.read()

    @abc.abstractmethod
    def stat(self, key: str) -> ObjectInfo: ...

    @abc.abstractmethod
    def delete(self, keys: Iterable[str]) -> None:
        """Delete in bulk; absent keys are not an error."""

    @abc.abstractmethod
    def list_objects(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Objects whose key starts with `prefix`, in ascending key order."""

    @abc.abstractmethod
    def list_folder(self, folder: str, *, metadata: bool = True) -> Listing:
        """Objects and subfolders directly under `folder` (a key without its trailing `/`;
        "" is the root), in no particular order. `metadata=False` lets a store that needs a
        call per object for sizes and times (local files) skip them; S3 lists them anyway."""

    @abc.abstractmethod
    def stat_many(self, keys: Sequence[str]) -> Stats:
        """`stat` of many keys at once (S3: HEADs in parallel), None for absent ones."""

    @abc.abstractmethod
    def discard_abandoned_writes(self, folder: str, before: datetime) -> Discarded:
        """Discard what writes that never finished left under `folder` (a key without its
        trailing `/`; "" is the root) and last showed life before `before`: a killed writer
        leaves such storage (a local temporary file, an open S3 multipart upload) that no
        listing shows, so no GC run could ever reclaim it. Never an object: only storage no
        reader can see. A write still under way that is discarded fails; it never publishes
        a partial object. `before` must be timezone-aware (`check_moment`)."""

    def exists(self, key: str) -> bool:
        try:
            self.stat(key)
        except NotFound:
            return False
        return True

    def uri(self, key: str) -> str:
        """The absolute URL of `key`, as another tool (Spark, aws cli) would address it."""
        return f"{self.url.rstrip('/')}/{key}"

    def close(self) -> None:  # noqa: B027 - optional hook; stores without clients keep it
        """Release clients; the store must not be used afterwards."""


def known_size(source: StreamSource) -> int | None:
    """The bytes `source` holds, where that is known without reading it: a list or tuple of
    chunks, or a seekable file (from where it stands); None for other streams."""
    if isinstance(source, list | tuple):
        return sum(len(chunk) for chunk in source)
    seekable = getattr(source, "seekable", None)
    if callable(seekable) and seekable():
        f: Any = source
        start = f.tell()
        end = f.seek(0, os.SEEK_END)
        f.seek(start)
        return max(0, end - start)
    return None


def iter_chunks(source: StreamSource, chunk_size: int = CHUNK_SIZE) -> Iterator[bytes]:
    """The chunks of `source`, each checked to be bytes as it comes, so a text file or a
    stream of strings is refused (`InvalidArgument`) before anything is written from it."""
    if isinstance(source, str | bytes | bytearray | memoryview):
        raise InvalidArgument(
            f"stream source must be an iterable of bytes or a binary file object, "
            f"not {type(source).__name__}"
        )
    read = getattr(source, "read", None)
    if callable(read):
        while chunk := read(chunk_size):
            yield _checked_chunk(chunk)
        return
    if not isinstance(source, Iterable):
        raise InvalidArgument(
            f"stream source must be an iterable of bytes or a binary file object, "
            f"not {type(source).__name__}"
        )
    for chunk in source:
        if chunk:
            yield _checked_chunk(chunk)


def _checked_chunk(chunk: object) -> bytes:
    if isinstance(chunk, bytes):
        return chunk
    if isinstance(chunk, bytearray | memoryview):
        return bytes(chunk)
    raise InvalidArgument(
        f"stream chunks must be bytes, not {type(chunk).__name__} (open files in binary mode)"
    )


def check_folder(folder: object) -> str:
    """A folder argument: "" (the root) or a key, given without its trailing `/`."""
    if not isinstance(folder, str):
        raise InvalidArgument(f"folder must be a string, not {type(folder).__name__}")
    return check_object_key(folder) if folder else folder


def check_moment(moment: object, what: str, *, within: timedelta = timedelta(0)) -> datetime:
    """A timezone-aware datetime, `what` naming the argument: a naive one compared with a
    store's UTC times would be read in whatever zone this machine is in. With `within`, at
    least that far from the calendar's ends, so dates computed from it cannot overflow."""
    if not isinstance(moment, datetime):
        raise InvalidArgument(
            f"{what} must be a timezone-aware datetime, not {type(moment).__name__}"
        )
    if moment.utcoffset() is None:
        raise InvalidArgument(
            f"{what} must be a timezone-aware datetime, not a naive one ({moment.isoformat()})"
        )
    if not datetime.min + within <= moment.replace(tzinfo=None) <= datetime.max - within:
        raise InvalidArgument(
            f"{what} must be at least {within.days} days from the calendar's ends (years 1 "
            f"and 9999), not {moment.isoformat()}"
        )
    return moment


def check_object_key(key: object) -> str:
    """Reject keys that could escape the root or are not plain relative paths."""
    if not isinstance(key, str):
        raise InvalidArgument(f"object key must be a string, not {type(key).__name__}")
    if not key or key.startswith("/") or key.endswith("/"):
        raise InvalidArgument(f"object key {key!r} must be a non-empty relative path")
    if any(part in ("", ".", "..") for part in key.split("/")):
        raise InvalidArgument(f"object key {key!r} must not contain empty, '.' or '..' parts")
    return key


MIN_READ_AHEAD = 64 << 10
"""The read-ahead's first step once reads turn sequential."""
MAX_READ_AHEAD = 4 << 20
"""The read-ahead's ceiling: one GET per 4 MiB while a file is read front to back."""


class AdaptiveReader(io.BufferedIOBase):
    """A read-ahead over a seekable raw reader (one ranged GET per `readinto`) that adapts
    as fsspec's and Arrow's readers do: after `open` or a seek out of the buffer, a read
    fetches exactly what it asks; each read that carries on where the last one ended doubles
    the window from `MIN_READ_AHEAD` up to `maximum`. So random small reads (a Parquet footer,
    then column chunks) fetch what they ask, a front-to-back read soon fetches `maximum` a
    request, and no read ever fetches more than it asks plus the window."""

    def __init__(self, raw: io.RawIOBase, maximum: int = MAX_READ_AHEAD) -> None:
        self._raw = raw
        self._maximum = maximum
        self._window = 0
        self._pos = 0
        self._buffer = b""
        self._start = 0  # the file offset of `_buffer[0]`
        self._last_end = -1  # where the last fetch ended: a read from there is sequential

    @property
    def raw(self) -> io.RawIOBase:
        """The unbuffered reader, for callers that coalesce their own reads (pyarrow)."""
        return self._raw

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence == io.SEEK_END:
            self._pos = self._raw.seek(offset, io.SEEK_END)
            return self._pos
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos}.get(whence)
        if base is None or base + offset < 0:
            raise InvalidArgument(f"cannot seek to {offset} from {whence}")
        self._pos = base + offset
        return self._pos

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0:
            held = self._held()
            self._raw.seek(self._pos + len(held))
            rest = self._raw.readall() or b""
            self._pos += len(held) + len(rest)
            self._buffer, self._last_end = b"", -1
            return held + rest
        held = self._held(size)
        self._pos += len(held)
        wanted = size - len(held)
        if wanted == 0:
            return held
        if self._pos == self._last_end:
            self._window = min(self._maximum, max(MIN_READ_AHEAD, self._window * 2))
        else:
            self._window = 0
        fetched = self._fetch(self._pos, wanted + self._window)
        taken = fetched[:wanted]
        self._pos += len(taken)
        return held + taken

    read1 = read

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        data = self.read(len(view))
        view[: len(data)] = data
        return len(data)

    def close(self) -> None:
        self._buffer = b""
        self._raw.close()
        super().close()

    def _held(self, size: int | None = None) -> bytes:
        """Up to `size` (default: all) buffered bytes from the current position on (none if
        it lies outside): sliced once, so small reads through a large buffer copy only what
        they return."""
        offset = self._pos - self._start
        if 0 <= offset < len(self._buffer):
            return self._buffer[offset : None if size is None else offset + size]
        return b""

    def _fetch(self, start: int, length: int) -> bytes:
        """Up to `length` bytes from `start` in one raw read, kept as the buffer."""
        self._raw.seek(start)
        out = bytearray(length)
        got = self._raw.readinto(out) or 0
        self._buffer, self._start = bytes(out[:got]), start
        self._last_end = start + got
        return self._buffer
