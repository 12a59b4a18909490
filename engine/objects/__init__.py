"""Object stores: `file:///root` (embedded default) and `s3://bucket/prefix`."""

from __future__ import annotations

from branchwater.engine.errors import ConfigurationError, InvalidArgument
from branchwater.engine.objects.store import (
    Listing,
    ObjectInfo,
    ObjectStore,
    Stats,
    check_object_key,
)
from branchwater.engine.urls import redact_url, url_scheme


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

        return S3ObjectStore(url, **s3_options)
    raise ConfigurationError(
        f"unknown object store URL scheme {scheme or '(none)'!r} in {redact_url(url)!r}; "
        "use file:// or s3://"
    )


__all__ = [
    "Listing",
    "ObjectInfo",
    "ObjectStore",
    "Stats",
    "check_object_key",
    "open_object_store",
]
