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

from branchwater.engine.errors import InvalidArgument
from branchwater.engine.graveler.model import Entry, Metadata, metadata_json

SHA256_LENGTH = 64
LEGACY_MD5_LENGTH = 32
"""Hex digits of the MD5 checksums uploads carried before SHA-256."""
_LOWER_HEX = re.compile(r"[0-9a-f]+")
_ALGORITHMS = {SHA256_LENGTH: "sha256", LEGACY_MD5_LENGTH: "md5"}
"""The checksums a read can recompute, by length (of lowercase hex)."""
CHECKSUM_ALPHABET = "0-9 A-Z a-z + / = . _ : -"
CHECKSUM_MAX_LENGTH = 128
_CHECKSUM = re.compile(rf"[0-9A-Za-z+/=._:-]{{1,{CHECKSUM_MAX_LENGTH}}}", re.ASCII)


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
    return hashlib.sha256(data).hexdigest()


def content_mismatch(entry: Entry, data: bytes) -> str | None:
    """How `data` differs from the content `entry` records, None if it does not: the size
    always, and the checksum when it is one the engine can recompute (its SHA-256, or a
    legacy MD5). A linked object's other checksums (an ETag) are taken on trust."""
    if len(data) != entry.size:
        return f"it has {len(data)} bytes where its entry records {entry.size}"
    algorithm = _ALGORITHMS.get(len(entry.checksum))
    if algorithm is None or not _LOWER_HEX.fullmatch(entry.checksum):
        return None
    if hashlib.new(algorithm, data, usedforsecurity=False).hexdigest() != entry.checksum:
        return f"its {algorithm} is not the {entry.checksum} its entry records"
    return None


def holds(entry: Entry, data: bytes, checksum: str, metadata: Metadata) -> bool:
    """Whether `entry` is `data` (whose `content_checksum` is `checksum`) with `metadata`."""
    if entry.size != len(data) or metadata_json(entry.metadata) != metadata_json(metadata):
        return False
    if len(entry.checksum) == LEGACY_MD5_LENGTH:
        return entry.checksum == hashlib.md5(data, usedforsecurity=False).hexdigest()
    return entry.checksum == checksum
