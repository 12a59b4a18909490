"""S3 `ObjectStore` (`s3://bucket/optional/prefix`), for AWS and S3-compatible servers.

Keys are relative to the URL's prefix. A PutObject, and a completed multipart upload, are
atomic on S3 (readers see the old object or the whole new one), so writes need no temporary
objects; a multipart upload that fails is aborted. Constructing a store
makes no request: a missing bucket or an unreachable endpoint shows on first use, as a typed
error that names the URL.
"""

from __future__ import annotations

import contextlib
import heapq
import io
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from itertools import chain, islice
from typing import Any, BinaryIO, NoReturn, TypeVar
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
    CorruptedData,
    InvalidArgument,
    NotFound,
    Unavailable,
)
from branchwater.engine.objects.store import (
    Listing,
    ObjectInfo,
    ObjectStore,
    Stats,
    StreamSource,
    check_folder,
    check_object_key,
    iter_chunks,
)
from branchwater.engine.urls import redact_url

DELETE_BATCH = 1000
"""S3's DeleteObjects accepts at most this many keys per request."""
REQUESTS_IN_FLIGHT = 8
"""DeleteObjects batches and HEADs sent at once: below boto3's pool of 10 connections."""
PART_SIZE = 8 << 20
"""A multipart upload's first parts (S3 wants 5 MiB at least, but for the last)."""
PARTS_PER_SIZE = 2000
"""Parts of one size before the size doubles: S3 allows 10,000 parts per upload."""
PARTS_IN_FLIGHT = 4
"""Parts uploaded at once; boto3's default pool of 10 connections serves them."""
READ_AHEAD = 4 << 20
"""Bytes a small read fetches ahead: one GET per 4 MiB read sequentially, while a seek to
read a Parquet footer fetches no more than that."""

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
U = TypeVar("U")


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

    def put_stream(self, key: str, source: StreamSource) -> ObjectInfo:
        """One PutObject when `source` fits in a part, else a multipart upload: parts of
        `PART_SIZE` (doubling every `PARTS_PER_SIZE` parts, so a stream of unknown length
        fits S3's 10,000 parts up to ~480 GiB), `PARTS_IN_FLIGHT` at once, so memory stays
        about `PARTS_IN_FLIGHT + 1` parts. A failed upload is aborted after its parts in
        flight end: no object, no pending upload. The mtime is the server's `Date` header,
        which saves a HEAD per write; S3 stamps `LastModified` within the same request, so
        the two agree to S3's one-second resolution."""
        full = self._full_key(key)
        parts = _parts(iter_chunks(source, PART_SIZE))
        head = list(islice(parts, 2))
        if len(head) < 2:
            body = head[0] if head else b""
            response = self._call(
                key, lambda: self._client.put_object(Bucket=self.bucket, Key=full, Body=body)
            )
            return ObjectInfo(key, len(body), _response_time(response))
        return self._multipart(key, full, _handed_on(head, parts))

    def open(self, key: str) -> BinaryIO:
        """Ranged GETs behind a `READ_AHEAD` buffer; a read to the end is one GET. The HEAD
        this starts with gives the size (for `seek` from the end), `NotFound` early, and the
        ETag every GET must match, so an object replaced meanwhile fails the read
        (`CorruptedData`) instead of mixing two versions."""
        full = self._full_key(key)
        head = self._call(key, lambda: self._client.head_object(Bucket=self.bucket, Key=full))
        reader = _RangeReader(self, key, head["ContentLength"], head["ETag"])
        return io.BufferedReader(reader, buffer_size=READ_AHEAD)

    def _multipart(self, key: str, full: str, parts: Iterator[bytes | bytearray]) -> ObjectInfo:
        upload_id = self._call(
            key,
            lambda: self._client.create_multipart_upload(Bucket=self.bucket, Key=full),
        )["UploadId"]
        size = 0
        done: list[dict[str, Any]] = []
        in_flight: set[Future[dict[str, Any]]] = set()
        with ThreadPoolExecutor(PARTS_IN_FLIGHT, thread_name_prefix="bw-s3-part") as pool:
            try:
                for number, part in enumerate(parts, start=1):
                    if len(in_flight) >= PARTS_IN_FLIGHT:
                        finished, in_flight = wait(in_flight, return_when=FIRST_COMPLETED)
                        done.extend(f.result() for f in finished)
                    size += len(part)
                    in_flight.add(pool.submit(self._part, key, full, upload_id, number, part))
                done.extend(f.result() for f in in_flight)
                in_flight = set()
                done.sort(key=lambda p: int(p["PartNumber"]))
                response = self._call(
                    key,
                    lambda: self._client.complete_multipart_upload(
                        Bucket=self.bucket,
                        Key=full,
                        UploadId=upload_id,
                        MultipartUpload={"Parts": done},
                    ),
                )
            except BaseException:
                for future in in_flight:
                    future.cancel()
                wait(in_flight)
                self._abort(full, upload_id)
                raise
        return ObjectInfo(key, size, _response_time(response))

    def _part(
        self, key: str, full: str, upload_id: str, number: int, data: bytes | bytearray
    ) -> dict[str, Any]:
        response = self._call(
            key,
            lambda: self._client.upload_part(
                Bucket=self.bucket, Key=full, UploadId=upload_id, PartNumber=number, Body=data
            ),
        )
        return {"PartNumber": number, "ETag": response["ETag"]}

    def _abort(self, full: str, upload_id: str) -> None:
        """Best effort: the error that made us abort is the one to report. An upload left
        pending is what a bucket lifecycle rule (AbortIncompleteMultipartUpload) is for."""
        with contextlib.suppress(ClientError, BotoCoreError):
            self._client.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=upload_id)

    def _get_range(self, key: str, etag: str, start: int, stop: int | None) -> bytes:
        """Bytes `start` up to `stop` (exclusive; None: to the end) of `key`, if its ETag
        still is `etag`."""
        full = self._full_key(key)
        wanted = f"bytes={start}-" if stop is None else f"bytes={start}-{stop - 1}"

        def read() -> bytes:
            body = self._client.get_object(
                Bucket=self.bucket, Key=full, Range=wanted, IfMatch=etag
            )["Body"]
            with body:
                data: bytes = body.read()
                return data

        return self._call(key, read)

    def stat(self, key: str) -> ObjectInfo:
        full = self._full_key(key)
        head = self._call(key, lambda: self._client.head_object(Bucket=self.bucket, Key=full))
        return ObjectInfo(key, head["ContentLength"], _utc(head["LastModified"]))

    def delete(self, keys: Iterable[str]) -> None:
        """Delete with DeleteObjects, 1000 keys per request, `REQUESTS_IN_FLIGHT` requests
        at once (keys are drawn as batches are sent, so memory stays a few batches); S3
        ignores absent keys itself. Every key is checked before its batch is sent, and the
        first failure stops further batches."""
        full_keys = (self._full_key(key) for key in keys)
        batches = iter(lambda: sorted(set(islice(full_keys, DELETE_BATCH))), [])
        _bounded_map(self._delete_batch, batches)

    def list_folder(self, folder: str, *, metadata: bool = True) -> Listing:
        """ListObjectsV2 with a `/` delimiter: one request per 1,000 names however deep the
        folder's tree. Names this API could not address (a folder marker, `a//b`) are left
        out, as `list_objects` does."""
        full = self.prefix + (f"{check_folder(folder)}/" if folder else "")
        names: list[str] = []
        sizes: list[int] = []
        mtimes: list[int] = []
        directories: list[str] = []
        for page in self._pages(full, delimiter="/"):
            for obj in page.get("Contents", ()):
                name = obj["Key"][len(full) :]
                if name and "/" not in name:
                    names.append(name)
                    sizes.append(obj["Size"])
                    mtimes.append(_epoch_ns(obj["LastModified"]))
            for common in page.get("CommonPrefixes", ()):
                name = common["Prefix"][len(full) :].rstrip("/")
                if name and "/" not in name:
                    directories.append(name)
        return Listing(names, sizes, mtimes, directories)

    def stat_many(self, keys: Sequence[str]) -> Stats:
        """HEADs, `REQUESTS_IN_FLIGHT` at once; a missing bucket is an error, not None."""

        def one(key: str) -> tuple[int | None, int | None]:
            try:
                info = self.stat(key)
            except BucketNotFound:
                raise
            except NotFound:
                return None, None
            return info.size, _epoch_ns(info.mtime)

        found = _bounded_map(one, iter(keys))
        return Stats([size for size, _ in found], [mtime for _, mtime in found])

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

    def _pages(self, full_prefix: str, delimiter: str = "") -> Iterator[dict[str, Any]]:
        paginator = self._client.get_paginator("list_objects_v2")
        extra = {"Delimiter": delimiter} if delimiter else {}
        pages = iter(paginator.paginate(Bucket=self.bucket, Prefix=full_prefix, **extra))
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
        etag = obj.get("ETag", "").strip('"') or None
        return ObjectInfo(key, obj["Size"], _utc(obj["LastModified"]), etag)

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
        if code == "PreconditionFailed" and key is not None:
            raise CorruptedData(
                f"object {key!r} in {self.url} was replaced while it was being read; "
                "objects are written once, so something outside Branchwater rewrote it"
            ) from None
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


def _bounded_map(function: Callable[[T], U], items: Iterator[T]) -> list[U]:
    """`function` over `items` in order, `REQUESTS_IN_FLIGHT` calls at once, items drawn
    only as calls start; the first error is raised once the calls in flight end, and no
    further call starts after it."""
    results: dict[int, U] = {}
    in_flight: dict[Future[U], int] = {}
    with ThreadPoolExecutor(REQUESTS_IN_FLIGHT, thread_name_prefix="bw-s3") as pool:
        try:
            for index, item in enumerate(items):
                if len(in_flight) >= REQUESTS_IN_FLIGHT:
                    finished, _ = wait(in_flight, return_when=FIRST_COMPLETED)
                    for future in finished:
                        results[in_flight.pop(future)] = future.result()
                in_flight[pool.submit(function, item)] = index
            for future in list(in_flight):
                results[in_flight.pop(future)] = future.result()
        finally:
            for future in in_flight:
                future.cancel()
    return [results[i] for i in range(len(results))]


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _epoch_ns(moment: datetime) -> int:
    return (moment - _EPOCH) // timedelta(microseconds=1) * 1000


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


def _parts(chunks: Iterator[bytes]) -> Iterator[bytes | bytearray]:
    """`chunks` regrouped into parts of the sizes `_part_size` says; the last may be short.
    A chunk of exactly a part's size (a file read a part at a time) passes uncopied, and so
    does a buffer that chunks filled exactly (chunks of a size dividing the part's)."""
    buffer = bytearray()
    number = 1
    for chunk in chunks:
        if not buffer and len(chunk) == _part_size(number):
            yield chunk
            number += 1
            continue
        buffer += chunk
        while len(buffer) >= (size := _part_size(number)):
            if len(buffer) == size:
                part: bytes | bytearray = buffer
                buffer = bytearray()
            else:
                with memoryview(buffer) as view:
                    part = view[:size].tobytes()
                del buffer[:size]
            yield part
            number += 1
    if buffer or number == 1:
        yield bytes(buffer)


def _handed_on(
    head: list[bytes | bytearray], rest: Iterator[bytes | bytearray]
) -> Iterator[bytes | bytearray]:
    """`head` then `rest`, each part of `head` let go as it is handed on, so the first two
    parts are not held for the whole upload."""
    while head:
        yield head.pop(0)
    yield from rest


def _part_size(number: int) -> int:
    return PART_SIZE << min((number - 1) // PARTS_PER_SIZE, 4)


class _RangeReader(io.RawIOBase):
    """The raw side of `S3ObjectStore.open`: each read is one ranged GET of what it asks."""

    def __init__(self, store: S3ObjectStore, key: str, size: int, etag: str) -> None:
        self._store = store
        self._key = key
        self._size = size
        self._etag = etag
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}.get(whence)
        if base is None or base + offset < 0:
            raise InvalidArgument(f"cannot seek to {offset} from {whence} in {self._key!r}")
        self._pos = base + offset
        return self._pos

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        stop = min(self._pos + len(view), self._size)
        if stop <= self._pos:
            return 0
        data = self._store._get_range(self._key, self._etag, self._pos, stop)
        view[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def readall(self) -> bytes:
        if self._pos >= self._size:
            return b""
        data = self._store._get_range(self._key, self._etag, self._pos, None)
        self._pos += len(data)
        return data
