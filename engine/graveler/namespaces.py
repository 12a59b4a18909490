"""Where a storage namespace lies, comparable across spellings (`s3://b/x/` and `s3://b/x`, a
local folder through a symbolic link): what two namespaces, or a namespace and an import
source, are judged to overlap on, since one holding the other would let a GC run list the
other's objects as its own."""

from __future__ import annotations

import os
from urllib.parse import unquote, urlsplit

from branchwater.engine.graveler.external import FILE_SCHEME, S3_SCHEME


def as_folder(prefix: str) -> str:
    return prefix if not prefix or prefix.endswith("/") else prefix + "/"


def location_of(namespace: str) -> str:
    """The namespace's scheme and location as one folder-like string, spelled as an import
    source's URI is (a bucket and prefix, or the real directory): two overlap when one of
    these starts with the other."""
    try:
        parts = urlsplit(namespace)
    except ValueError:
        return as_folder(namespace)
    if parts.scheme == "s3":
        return S3_SCHEME + as_folder(f"{parts.netloc}/{parts.path.strip('/')}".rstrip("/"))
    if parts.scheme == "file":
        return FILE_SCHEME + as_folder(os.path.realpath(unquote(parts.path)))
    return as_folder(namespace)


def overlap(a: str, b: str) -> bool:
    """Whether locations `a` and `b` (`location_of`) are one, or one holds the other."""
    return a.startswith(b) or b.startswith(a)
