"""S3 `ObjectStore` (`s3://bucket/optional/prefix`), for AWS and S3-compatible servers.

Keys are relative to the URL's prefix. A single PutObject is atomic on S3 (readers see the
old object or the whole new one), so writes need no temporary objects. Constructing a store
makes no request: a missing bucket or an unreachable endpoint shows on first use, as a typed
error that names the URL.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from itertools import chain, islice
from typing import Any, NoReturn, TypeVar
from urllib.parse import urlsplit

import boto3
from botocore.config import Config
from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionError,
    CredentialRetrievalError,
    HTTPClientError,
    NoCredentialsError,
    PartialCredentialsError,
)

from branchwater.engine.errors import (
    BranchwaterError,
    BucketNotFound,
    ConfigurationError,
    InvalidArgument,
    NotFound,
    Unavailable,
)
from branchwater.engine.objects.store import ObjectInfo, ObjectStore, check_object_key
from branchwater.engine.urls import redact_url

DELETE_BATCH = 1000
"""S3's DeleteObjects accepts at most this many keys per request."""

_BUCKET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{1,253}[A-Za-z0-9]$")
_BODYLESS_NOT_FOUND = frozenset({"404", "NotFound"})
"""What HEAD requests report for a missing key and for a missing bucket alike."""
_CREDENTIAL_CODES = frozenset(
    {
        "AccessDenied",
        "InvalidAccessKeyId",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "InvalidToken",
        "TokenRefreshRequired",
        "AllAccessDisabled",
        "403",
        "Forbidden",
    }
)
_PATH_ORDER_SERVERS = ("SeaweedFS",)
"""`Server` headers of S3-compatible stores that list path by path (`a/b` before `a-c`)."""
_NETWORK_ERRORS = (ConnectionError, HTTPClientError)
_CREDENTIAL_ERRORS = (NoCredentialsError, PartialCredentialsError, CredentialRetrievalError)
_DEFAULT_CONFIG = Config(
    connect_timeout=10,
    read_timeout=60,
    retries={"mode": "standard", "max_attempts": 5},
)

T = TypeVar("T")


class S3ObjectStore(ObjectStore):
    """An object store on one S3 bucket, optionally below a key prefix.

    Options given here override boto3's usual chain (environment, config files, instance
    roles); `AWS_ENDPOINT_URL` works as boto3 defines it. `config` merges over defaults
    that bound how long an unreachable endpoint can stall a caller.
    """

    def __init__(
        self,
        url: str,
        endpoint_url: str | None = None,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        aws_session_token: str | None = None,
        region_name: str | None = None,
        *,
        config: Config | None = None,
    ) -> None:
        self.bucket, self.prefix = _parse_url(url)
        self.url = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        self._bucket_seen = False
        self._client: Any = boto3.session.Session().client(
            "s3",
            endpoint_url=endpoint_url,
            aws_access_key_id=aws_access_key_id,
            aws_secret_access_key=aws_secret_access_key,
            aws_session_token=aws_session_token,
            region_name=region_name,
            config=_DEFAULT_CONFIG.merge(config) if config else _DEFAULT_CONFIG,
        )
        self.endpoint_url: str = self._client.meta.endpoint_url

    def put(self, key: str, data: bytes) -> ObjectInfo:
        """Write with one PutObject; the mtime is the server's `Date` header.

        Reading it from the response saves a HEAD per write; S3 stamps `LastModified`
        within the same request, so the two agree to S3's one-second resolution.
        """
        if not isinstance(data, bytes | bytearray):
            raise InvalidArgument(f"object data must be bytes, not {type(data).__name__}")
        full = self._full_key(key)
        response = self._call(
            key, lambda: self._client.put_object(Bucket=self.bucket, Key=full, Body=data)
        )
        return ObjectInfo(key, len(data), _response_time(response))

    def get(self, key: str) -> bytes:
        full = self._full_key(key)

        def read() -> bytes:
            body = self._client.get_object(Bucket=self.bucket, Key=full)["Body"]
            with body:
                return body.read()

        return self._call(key, read)

    def stat(self, key: str) -> ObjectInfo:
        full = self._full_key(key)
        head = self._call(key, lambda: self._client.head_object(Bucket=self.bucket, Key=full))
        return ObjectInfo(key, head["ContentLength"], _utc(head["LastModified"]))

    def delete(self, keys: Iterable[str]) -> None:
        """Delete with DeleteObjects, 1000 keys per request; S3 ignores absent keys itself."""
        full_keys = (self._full_key(key) for key in keys)
        while batch := list(islice(full_keys, DELETE_BATCH)):
            self._delete_batch(sorted(set(batch)))

    def list_objects(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Page through ListObjectsV2, which returns keys in ascending UTF-8 byte order.

        Keys this API could not address (folder markers ending in `/`, `a//b` written by
        other tools) are left out, since a caller could neither read nor delete them here.
        """
        if not isinstance(prefix, str):
            raise InvalidArgument(f"list prefix must be a string, not {type(prefix).__name__}")
        return self._list(self.prefix + prefix)

    def close(self) -> None:
        self._client.close()

    def _list(self, full_prefix: str) -> Iterator[ObjectInfo]:
        pages = self._pages(full_prefix)
        first = next(pages, None)
        if first is None:
            return
        infos: Iterator[ObjectInfo] = (
            info for page in chain([first], pages) for info in self._infos(page)
        )
        if _lists_path_by_path(first):
            infos = _in_key_order(infos, len(full_prefix) - len(self.prefix))
        yield from infos

    def _pages(self, full_prefix: str) -> Iterator[dict[str, Any]]:
        paginator = self._client.get_paginator("list_objects_v2")
        pages = iter(paginator.paginate(Bucket=self.bucket, Prefix=full_prefix))
        while (page := self._call(None, lambda: next(pages, None))) is not None:
            yield page

    def _infos(self, page: dict[str, Any]) -> Iterator[ObjectInfo]:
        for obj in page.get("Contents", ()):
            info = self._info(obj)
            if info is not None:
                yield info

    def _info(self, obj: dict[str, Any]) -> ObjectInfo | None:
        key = obj["Key"][len(self.prefix) :]
        try:
            check_object_key(key)
        except InvalidArgument:
            return None
        return ObjectInfo(key, obj["Size"], _utc(obj["LastModified"]))

    def _delete_batch(self, full_keys: list[str]) -> None:
        request = {"Objects": [{"Key": k} for k in full_keys], "Quiet": True}
        response = self._call(
            None, lambda: self._client.delete_objects(Bucket=self.bucket, Delete=request)
        )
        failures = [e for e in response.get("Errors", ()) if e.get("Code") != "NoSuchKey"]
        if failures:
            first = failures[0]
            raise Unavailable(
                f"S3 object store {self.url} could not delete {len(failures)} object(s); "
                f"first: {first.get('Key')!r}: {first.get('Code')} {first.get('Message', '')}"
            )

    def _full_key(self, key: str) -> str:
        return self.prefix + check_object_key(key)

    def _call(self, key: str | None, request: Callable[[], T]) -> T:
        """Run one S3 request, turning boto errors into typed errors that name the URL."""
        try:
            result = request()
        except ClientError as exc:
            self._raise_client_error(key, exc)
        except _NETWORK_ERRORS as exc:
            raise Unavailable(
                f"cannot reach S3 object store {self.url} at {self.endpoint_url}: {exc}"
            ) from exc
        except _CREDENTIAL_ERRORS as exc:
            raise Unavailable(
                f"no usable AWS credentials for S3 object store {self.url}: {exc}"
            ) from exc
        except BotoCoreError as exc:
            raise BranchwaterError(f"S3 object store {self.url}: {exc}") from exc
        self._bucket_seen = True
        return result

    def _raise_client_error(self, key: str | None, exc: ClientError) -> NoReturn:
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        detail = f"{code} {error.get('Message', '')}".strip()
        if code == "NoSuchBucket":
            raise self._missing_bucket() from None
        if code == "NoSuchKey":
            raise NotFound(f"object {key!r} not found in {self.url}") from None
        if code in _BODYLESS_NOT_FOUND and key is not None:
            if not self._bucket_seen and not self._bucket_exists():
                raise self._missing_bucket() from None
            raise NotFound(f"object {key!r} not found in {self.url}") from None
        if code in _CREDENTIAL_CODES:
            raise Unavailable(
                f"S3 object store {self.url} refused our credentials or access ({detail})"
            ) from exc
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        if status >= 500 or code in ("SlowDown", "RequestTimeout", "Throttling"):
            raise Unavailable(f"S3 object store {self.url} is unavailable ({detail})") from exc
        raise BranchwaterError(
            f"S3 object store {self.url} rejected the request ({detail})"
        ) from exc

    def _bucket_exists(self) -> bool:
        """Tell a missing bucket from a missing key: HEAD errors carry no body to say which.

        Anything but a clear "no such bucket" counts as existing: a policy may allow object
        reads yet deny HeadBucket, and then the missing key is the honest answer.
        """
        try:
            self._client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            return code not in ("404", "NoSuchBucket", "NotFound")
        except BotoCoreError:
            return True
        self._bucket_seen = True
        return True

    def exists(self, key: str) -> bool:
        """Like `ObjectStore.exists`, but a missing bucket is an error, never plain `False`."""
        try:
            self.stat(key)
        except BucketNotFound:
            raise
        except NotFound:
            return False
        return True

    def _missing_bucket(self) -> BucketNotFound:
        return BucketNotFound(
            f"S3 bucket {self.bucket!r} of object store {self.url} does not exist; "
            "create it or fix the URL"
        )


def _parse_url(url: str) -> tuple[str, str]:
    """Split `s3://bucket/a/b` into the bucket and a key prefix ending in `/` (or empty)."""
    shown = redact_url(url) if isinstance(url, str) else repr(url)
    try:
        parts = urlsplit(url) if isinstance(url, str) else None
    except ValueError:
        parts = None
    if parts is None or parts.scheme != "s3" or parts.query or parts.fragment:
        raise ConfigurationError(f"S3 object store URL {shown!r} must look like s3://bucket/prefix")
    if not _BUCKET_NAME.match(parts.netloc):
        raise ConfigurationError(f"S3 object store URL {shown!r} does not name a valid bucket")
    prefix = parts.path.strip("/")
    if prefix:
        try:
            check_object_key(prefix)
        except InvalidArgument:
            raise ConfigurationError(
                f"S3 object store URL {shown!r} has a malformed key prefix {prefix!r}"
            ) from None
        prefix += "/"
    return parts.netloc, prefix


def _lists_path_by_path(page: dict[str, Any]) -> bool:
    server = page.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("server", "")
    return server.startswith(_PATH_ORDER_SERVERS)


def _in_key_order(infos: Iterable[ObjectInfo], shared: int) -> Iterator[ObjectInfo]:
    """Byte order from a listing sorted path by path, as a store built on directories lists.

    Such a store lists all of `a/` where `a` sorts, before siblings like `a-c` or `a.d`
    that S3 puts first. A key is held back only while a later key could still sort before
    it; every key shares its first `shared` characters.
    """
    held: list[tuple[str, ObjectInfo]] = []
    for info in infos:
        heapq.heappush(held, (info.key, info))
        while held and _settled(held[0][0], info.key, shared):
            yield heapq.heappop(held)[1]
    while held:
        yield heapq.heappop(held)[1]


def _settled(key: str, latest: str, shared: int) -> bool:
    """Whether no key listed path by path after `latest` can sort before `key`.

    Only a key that matches `key` up to one of its `/` and has a character below `/` there
    can; those are listed right after that directory, so once `latest` is past both, none
    is left to come.
    """
    pairs = zip(key, latest, strict=False)
    common = next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(key), len(latest)))
    if "/" in key[shared:common]:
        return False
    at_fork = common < len(key) and key[common] == "/" and common < len(latest)
    return not (at_fork and latest[common] < "/")


def _response_time(response: dict[str, Any]) -> datetime:
    header = response.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
    if header:
        try:
            return _utc(parsedate_to_datetime(header))
        except (TypeError, ValueError):
            pass
    return datetime.now(UTC)


def _utc(moment: datetime) -> datetime:
    return moment.astimezone(UTC)
