"""Addresses of objects that live outside their repository's namespace: imported objects.

An entry's address is relative to its repository's namespace (`data/<slice>/<object id>`),
except an imported object's, which is the full URI of the object where it already was:
`s3://bucket/key` or `file:///absolute/path`, the key or path verbatim (not
percent-encoded), so any key the source holds round-trips. No relative address starts with a
scheme, so the two never mix up, and GC, which lists and deletes only under
`<namespace>/data/`, skips every external address (`gc/addresses.py`).
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from branchwater.engine.errors import InvalidAddress

S3_SCHEME = "s3://"
FILE_SCHEME = "file://"
EXTERNAL_SCHEMES = (S3_SCHEME, FILE_SCHEME)


def is_external(address: str) -> bool:
    """Whether `address` is the full URI of an object outside the namespace."""
    return address.startswith(EXTERNAL_SCHEMES)


def external_location(address: str) -> tuple[str, str]:
    """The object store URL (a bucket, or the file system's root) and the key inside it that
    an external address names; `InvalidAddress` for one with no key."""
    if address.startswith(S3_SCHEME):
        bucket, _, key = address[len(S3_SCHEME) :].partition("/")
        if bucket and key:
            return f"{S3_SCHEME}{bucket}", key
    elif address.startswith(FILE_SCHEME + "/"):
        key = address[len(FILE_SCHEME) + 1 :]
        if key:
            return f"{FILE_SCHEME}/", key
    raise InvalidAddress(
        f"external address {address!r} must be s3://bucket/key or file:///absolute/path"
    )


def external_mask(addresses: pa.Array | pa.ChunkedArray, namespace: str) -> pa.ChunkedArray:
    """True where an address is external and not inside `namespace` (a store URL as the
    object store spells it): what GC skips. An absolute URI into the namespace itself is no
    import (imports refuse such sources), so GC keeps it and stops on it as malformed."""
    external = pc.or_(pc.starts_with(addresses, S3_SCHEME), pc.starts_with(addresses, FILE_SCHEME))
    inside = pc.starts_with(addresses, namespace.rstrip("/") + "/")
    return pc.fill_null(pc.and_(external, pc.invert(inside)), False)
