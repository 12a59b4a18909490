"""The lake's secret key, for what the engine hands out and must recognise when it comes
back: link tokens (`gc.tokens`) and merge hints (`merge`). There is no server to hold it: it
is created once per lake in the KV with `set_if` and read by every process."""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets

from branchwater.engine.errors import NotFound, PredicateFailed
from branchwater.engine.graveler.refs import GRAVELER_PARTITION
from branchwater.engine.kv import Store

LAKE_KEY = b"gc/link-signing-key"
"""Key of the lake's secret in the `graveler` partition (named when only link tokens used it;
lakes made since keep their key under it)."""
_KEY_BYTES = 32
_TAG_BYTES = 16


def lake_key(kv: Store) -> bytes:
    """The lake's key: read, or created by whichever process gets there first."""
    try:
        return kv.get(GRAVELER_PARTITION, LAKE_KEY).value
    except NotFound:
        pass
    try:
        candidate = secrets.token_bytes(_KEY_BYTES)
        kv.set_if(GRAVELER_PARTITION, LAKE_KEY, candidate, None)
        return candidate
    except PredicateFailed:
        return kv.get(GRAVELER_PARTITION, LAKE_KEY).value


def signature(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def short_tag(key: bytes, text: str) -> str:
    """A short URL-safe tag of `text`, for strings a person may copy by hand."""
    tag = signature(key, text)[:_TAG_BYTES]
    return base64.urlsafe_b64encode(tag).rstrip(b"=").decode()


def tag_matches(key: bytes, text: str, given: str) -> bool:
    return hmac.compare_digest(short_tag(key, text).encode(), given.encode())
