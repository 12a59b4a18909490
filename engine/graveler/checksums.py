"""Content checksums, on which entry identity rests.

The engine's own checksum is the SHA-256 of the content in lowercase hex: collision resistant,
so entries with equal size, checksum and metadata hold the same content. Uploads written before
identity was content carry the MD5 of their content (32 hex digits) instead; they still read
and compare as they are, and an upload recognises its own content in them by MD5.
"""

from __future__ import annotations

import hashlib

from branchwater.engine.graveler.model import Entry, Metadata, metadata_json

LEGACY_MD5_LENGTH = 32
"""Hex digits of the MD5 checksums uploads carried before SHA-256."""


def content_checksum(data: bytes) -> str:
    """The checksum the engine gives the content it writes."""
    return hashlib.sha256(data).hexdigest()


def holds(entry: Entry, data: bytes, checksum: str, metadata: Metadata) -> bool:
    """Whether `entry` is `data` (whose `content_checksum` is `checksum`) with `metadata`."""
    if entry.size != len(data) or metadata_json(entry.metadata) != metadata_json(metadata):
        return False
    if len(entry.checksum) == LEGACY_MD5_LENGTH:
        return entry.checksum == hashlib.md5(data, usedforsecurity=False).hexdigest()
    return entry.checksum == checksum
