"""Object stores: `file:///root` (embedded default) and `s3://bucket/prefix`."""

from __future__ import annotations

import os
from collections.abc import Mapping

from branchwater.engine.errors import ConfigurationError, InvalidArgument
from branchwater.engine.objects.store import (
    Listing,
    ObjectInfo,
    ObjectStore,
    Stats,
    check_object_key,
)
from branchwater.engine.per_process import ChildSafeLock
from branchwater.engine.urls import redact_url, url_scheme

S3_OPTIONS = (
    "endpoint_url",
    "aws_access_key_id",
    "aws_secret_access_key",
    "aws_session_token",
    "region_name",
)


def check_s3_options(options: object) -> dict[str, str | None]:
    """S3 options as a dict, once they are known to be `S3_OPTIONS` with text values (a
    value's type is named, never the value: it may be a secret)."""
    if not isinstance(options, Mapping):
        raise ConfigurationError(
            f"S3 options must be a dict of settings, not {type(options).__name__}"
        )
    for key, value in options.items():
        if key not in S3_OPTIONS:
            raise ConfigurationError(f"unknown S3 option {key!r}: use {', '.join(S3_OPTIONS)}")
        if value is not None and not isinstance(value, str):
            raise ConfigurationError(
                f"S3 option {key} must be a string, not {type(value).__name__}"
            )
    return dict(options)


def open_object_store(url: str, **s3_options: str | None) -> ObjectStore:
    """Open the store a URL names.

    `s3_options` (`endpoint_url`, `aws_access_key_id`, `aws_secret_access_key`,
    `aws_session_token`, `region_name`) override boto3's usual credential chain.
    """
    if not isinstance(url, str):
        raise InvalidArgument(f"object store URL must be a string, not {type(url).__name__}")
    scheme = url_scheme(url)
    if scheme == "file":
        from branchwater.engine.objects.local import LocalObjectStore

        return LocalObjectStore(url)
    if scheme == "s3":
        from branchwater.engine.objects.s3 import S3ObjectStore

        return S3ObjectStore(url, **check_s3_options(s3_options))
    raise ConfigurationError(
        f"unknown object store URL scheme {scheme or '(none)'!r} in {redact_url(url)!r}; "
        "use file:// or s3://"
    )


_SHARED: dict[tuple[int, str, tuple[tuple[str, str], ...]], ObjectStore] = {}
_SHARED_LOCK = ChildSafeLock()


def shared_object_store(url: str, **s3_options: str | None) -> ObjectStore:
    """This process's one store for `url` and `s3_options`, opened on first use and kept open
    for the life of the process (never close it).

    For code that runs many short tasks in one process, as Spark's Python workers do: each
    store holds a client (S3: boto3 and obstore, slow to make) and a connection pool
    that a store per task would make again and drop. Stores are kept by process id, so a
    forked child opens its own: clients and their pools do not survive a fork."""
    options = tuple(sorted((k, v) for k, v in s3_options.items() if v is not None))
    key = (os.getpid(), url, options)
    with _SHARED_LOCK:
        store = _SHARED.get(key)
        if store is None:
            store = _SHARED[key] = open_object_store(url, **s3_options)
        return store


__all__ = [
    "Listing",
    "ObjectInfo",
    "ObjectStore",
    "Stats",
    "check_object_key",
    "open_object_store",
    "shared_object_store",
]
