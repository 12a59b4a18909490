"""Content checksums, on which entry identity rests.

The engine's own checksum is the SHA-256 of the content in lowercase hex: collision resistant,
so entries with equal size, checksum and metadata hold the same content. Uploads written before
identity was content carry the MD5 of their content (32 hex digits) instead; they still read
and compare as they are, and an upload recognises its own content in them by MD5.

A linked object's checksum comes from its writer. It should be the engine's, but may be
another digest its tool reports (an S3 ETag, base64 of a CRC): any 1 to 128 characters of
`CHECKSUM_ALPHABET`, which covers hex, base64 and ETags without their quotes, and keeps
separators, control characters and text UTF-8 cannot encode out of every record.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from typing import Any

from branchwater.engine.errors import InvalidArgument
from branchwater.engine.graveler.external import is_external
from branchwater.engine.graveler.model import Entry, Metadata, metadata_json
from branchwater.engine.objects.store import ObjectInfo
from branchwater.engine.units import epoch_micros

SHA256_LENGTH = 64
LEGACY_MD5_LENGTH = 32
"""Hex digits of the MD5 checksums uploads carried before SHA-256."""
_LOWER_HEX = re.compile(r"[0-9a-f]+")
_ALGORITHMS = {SHA256_LENGTH: "sha256", LEGACY_MD5_LENGTH: "md5"}
"""The checksums a read can recompute, by length (of lowercase hex)."""
CHECKSUM_ALPHABET = "0-9 A-Z a-z + / = . _ : -"
CHECKSUM_MAX_LENGTH = 128
_CHECKSUM = re.compile(rf"[0-9A-Za-z+/=._:-]{{1,{CHECKSUM_MAX_LENGTH}}}", re.ASCII)


IMPORTED_PREFIX = "etag:"
"""An imported entry's checksum: `etag:` and the version of the object imported (`version`)."""


def version(etag: str | None, mtime_us: int, size: int) -> str:
    """The checksum an import gives an object: `etag:` and its S3 ETag, or for a local file
    (no ETag) its modification time in microseconds and its size in hex, as web servers
    make ETags (`imports._checksums` makes the same in Arrow, for a whole listing). An
    ETag no record could hold is itself hex-encoded."""
    if etag is None:
        return f"{IMPORTED_PREFIX}{mtime_us:x}-{size:x}"
    return held(IMPORTED_PREFIX + etag)


def held(checksum: str) -> str:
    """An imported checksum as a record can hold it: as it is, or its ETag hex-encoded."""
    try:
        return check_checksum(checksum)
    except InvalidArgument:
        return IMPORTED_PREFIX + checksum.removeprefix(IMPORTED_PREFIX).encode().hex()[:100]


def imported_version(entry: Entry) -> str | None:
    """The version an imported entry recorded (its checksum), None for any other entry."""
    imported = entry.checksum.startswith(IMPORTED_PREFIX) and is_external(entry.address)
    return entry.checksum if imported else None


def source_mismatch(info: ObjectInfo, imported: str) -> str | None:
    """How the object `info` describes differs from the version `imported`, None if it is
    that version."""
    return version_mismatch(version(info.etag, epoch_micros(info.mtime), info.size), imported)


def version_mismatch(now: str, imported: str) -> str | None:
    """How an imported object's version `now` differs from the version `imported`."""
    if now == imported:
        return None
    return (
        f"it was rewritten at its source since it was imported (it is now {now}, its entry "
        f"records {imported})"
    )


def check_checksum(checksum: object) -> str:
    """`checksum` if it is one a record can hold, else `InvalidArgument` saying what is."""
    if not isinstance(checksum, str):
        raise InvalidArgument(f"checksum must be a string, not {type(checksum).__name__}")
    if not _CHECKSUM.fullmatch(checksum):
        raise InvalidArgument(
            f"checksum {checksum[: CHECKSUM_MAX_LENGTH + 8]!r} must be 1 to "
            f"{CHECKSUM_MAX_LENGTH} characters of {CHECKSUM_ALPHABET} (the SHA-256 of the "
            "content in lowercase hex, ideally)"
        )
    return checksum


def content_checksum(data: bytes) -> str:
    """The checksum the engine gives the content it writes."""
    return ContentHasher().update(data).hexdigest()


class ContentHasher:
    """`content_checksum` computed chunk by chunk, with the size, for content that streams."""

    def __init__(self) -> None:
        self._sha256 = hashlib.sha256()
        self.size = 0

    def update(self, chunk: bytes) -> ContentHasher:
        self._sha256.update(chunk)
        self.size += len(chunk)
        return self

    def hexdigest(self) -> str:
        return self._sha256.hexdigest()


def size_mismatch(entry: Entry, size: int) -> str | None:
    """How an object of `size` bytes differs from the content `entry` records, if it does."""
    if size != entry.size:
        return f"it has {size} bytes where its entry records {entry.size}"
    return None


def recomputable_hash(entry: Entry) -> Any | None:
    """A hash object for `entry`'s checksum, when it is one the engine can recompute (its
    SHA-256, or a legacy MD5); None for a linked object's other checksums (an ETag), which
    are taken on trust."""
    algorithm = _ALGORITHMS.get(len(entry.checksum))
    if algorithm is None or not _LOWER_HEX.fullmatch(entry.checksum):
        return None
    return hashlib.new(algorithm, usedforsecurity=False)


def digest_mismatch(entry: Entry, hexdigest: str) -> str | None:
    """How content whose `recomputable_hash` came to `hexdigest` differs from `entry`'s."""
    if hexdigest != entry.checksum:
        algorithm = _ALGORITHMS[len(entry.checksum)]
        return f"its {algorithm} is not the {entry.checksum} its entry records"
    return None


def content_mismatch(entry: Entry, data: bytes) -> str | None:
    """How `data` differs from the content `entry` records, None if it does not: the size
    always, and the checksum when `recomputable_hash` can recompute it."""
    mismatch = size_mismatch(entry, len(data))
    hasher = recomputable_hash(entry)
    if mismatch is not None or hasher is None:
        return mismatch
    hasher.update(data)
    return digest_mismatch(entry, hasher.hexdigest())


def holds(
    entry: Entry,
    size: int,
    checksum: str,
    metadata: Metadata,
    legacy_md5: Callable[[], str] | None = None,
) -> bool:
    """Whether `entry` is content of `size` bytes whose `content_checksum` is `checksum`,
    with `metadata`. An entry with a legacy MD5 holds it only if `legacy_md5` computes the
    content's MD5 and it matches; a stream, which cannot compute it after the fact, passes
    None and writes such content anew (under its SHA-256)."""
    if entry.size != size or metadata_json(entry.metadata) != metadata_json(metadata):
        return False
    if len(entry.checksum) == LEGACY_MD5_LENGTH:
        return legacy_md5 is not None and entry.checksum == legacy_md5()
    return entry.checksum == checksum
