"""S3 `ObjectStore` (`s3://bucket/optional/prefix`), for AWS and S3-compatible servers.

Built on obstore (Rust's `object_store` behind a Python API), which the object-layer
measurement chose over boto3 and `pyarrow.fs` (docs/design/objects.md, "One object layer").
Keys are relative to the URL's prefix. A PutObject, and a completed multipart upload, are
atomic on S3 (readers see the old object or the whole new one), so writes need no temporary
objects; a multipart upload that fails is aborted. Keys obstore cannot address (ASCII
control characters, which other tools may write) go through boto3 (`s3_fallback`), and so
does a listing that meets one. Constructing a store makes no request:
a missing bucket, an unreachable endpoint or missing credentials show on first use, as a
typed error that names the URL (never a credential).

obstore runs its requests on one runtime per process, started by the first request, whose
threads a forked child does not inherit: any request the child makes through it waits for
ever, whichever store makes it. So a process forked from one that made an S3 request gets
`ConfigurationError` saying how to start it instead (`_runtime_usable`).
"""

from __future__ import annotations

import hashlib
import io
import os
import queue
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import reduce
from itertools import chain, islice
from typing import TYPE_CHECKING, Any, BinaryIO, NoReturn, TypeVar, cast
from urllib.parse import urlsplit

import obstore
import pyarrow as pa
import pyarrow.compute as pc
from obstore.exceptions import (
    AlreadyExistsError,
    BaseError,
    InvalidPathError,
    PermissionDeniedError,
    PreconditionError,
    UnauthenticatedError,
)
from obstore.store import S3Store

from branchwater.engine.errors import (
    BranchwaterError,
    BucketNotFound,
    ConfigurationError,
    CorruptedData,
    InvalidArgument,
    NotFound,
    OutcomeUnknown,
    Unavailable,
    lake_closed,
)
from branchwater.engine.objects.native_exit import drain_native_readers_at_exit
from branchwater.engine.objects.s3_fallback import THROTTLED, Boto3Keys, addressable, refusal
from branchwater.engine.objects.store import (
    AdaptiveReader,
    Discarded,
    Listing,
    ObjectInfo,
    ObjectStore,
    Stats,
    StreamSource,
    check_folder,
    check_moment,
    check_object_key,
    iter_chunks,
    known_size,
)
from branchwater.engine.per_process import ChildSafeLock
from branchwater.engine.units import epoch_micros
from branchwater.engine.urls import redact_url

if TYPE_CHECKING:
    from obstore import ObjectMeta
    from obstore.store import ClientConfig, RetryConfig

DELETE_BATCH = 1000
"""S3's DeleteObjects accepts at most this many keys per request."""
REQUESTS_IN_FLIGHT = 8
"""DeleteObjects batches and HEADs sent at once."""
PART_SIZE = 8 << 20
"""A multipart upload's smallest part (S3 wants 5 MiB at least, but for the last), and the
size of what is read ahead to tell a one-request object from a multipart one."""
COPY_THRESHOLD = 1 << 30
"""Objects above this are copied in parts (CopyObject takes 5 GiB at most)."""
COPY_PART = 256 << 20
"""The part size of a copy in parts; boto3 enlarges it where S3's part limit needs it."""
MAX_PARTS = 10_000
"""S3's limit of parts per upload."""
MAX_KEY = 1024
"""S3's limit of a key's length in UTF-8 bytes."""
CONFLICT_PAUSES = (0.05, 0.2, 1.0)
"""Pauses before a conditional PUT is asked again after a 409 (another conditional write of
the key under way: AWS says to retry, and the write under way soon ends one way or the
other) or after its reply was lost (once)."""
MAX_OBJECT = 5 << 40
"""S3's limit of an object's size (5 TiB)."""
STREAM_PART = 32 << 20
"""The part size of a stream of unknown length: such a stream holds up to 312 GiB."""
PARTS_IN_FLIGHT = 4
"""Parts uploaded at once, at most."""
UPLOAD_MEMORY = 128 << 20
"""What an upload's parts may hold in memory (those in flight and the one filling), where
parts are small enough: fewer go at once as parts grow, one at the least."""
LIST_PAGE = 1000
"""Objects per listing page, as S3 returns them."""
LIST_SCHEMA = pa.schema(
    [
        pa.field("key", pa.string(), nullable=False),
        pa.field("size", pa.int64(), nullable=False),
        pa.field("mtime", pa.timestamp("us", tz="UTC"), nullable=False),
        pa.field("etag", pa.string()),
    ]
)
"""`S3ObjectStore.list_tables`' columns: an `ObjectInfo` a row."""

_BUCKET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{1,253}[A-Za-z0-9]$")
_STATUS = re.compile(r"non-2xx status code: (\d{3})")
_CODE = re.compile(r"<Code>([^<]+)</Code>")
_PLAIN_KEY = re.compile(r"(?:(?!\.\.?/)[^/\x00-\x1f\x7f]+/)*(?!\.\.?\Z)[^/\x00-\x1f\x7f]+")
"""A key `check_object_key` accepts and obstore can address, told by one C-speed match:
a sweep deletes millions, and the two checks' Python loops cost more CPU than the deletes'
requests on a busy host. A key it does not match takes those checks."""
_PATH_ORDER_SERVERS = ("SeaweedFS",)
"""`Server` headers of S3-compatible stores that list path by path (`a/b` before `a-c`)."""
_UNREACHABLE = ("HTTP error", "error sending request", "timed out", "connection")
"""What obstore's messages say when no HTTP response came back."""
_DELETE_FAILED = "DeleteObjects request failed for key"
"""obstore's message for the first key a DeleteObjects reply says it could not delete."""
CONNECT_TIMEOUT_ENV = "BRANCHWATER_S3_CONNECT_TIMEOUT"
READ_TIMEOUT_ENV = "BRANCHWATER_S3_READ_TIMEOUT"
RETRY_TIMEOUT_ENV = "BRANCHWATER_S3_RETRY_TIMEOUT"
_TRANSFER_TIMEOUT = timedelta(hours=1)
"""obstore's bound on a whole request: how long a large transfer may take, not a stall."""
_BACKOFF = {
    "init_backoff": timedelta(milliseconds=100),
    "max_backoff": timedelta(seconds=5),
    "base": 2,
}


@dataclass(frozen=True)
class S3Timeouts:
    """How long an S3 request may wait, for both clients of a store (obstore's and the boto3
    fallback's): `connect` seconds to connect, `read` seconds for each read of a reply,
    `retries` more attempts after a failed one, but none started once `retry` seconds have
    passed since the first. So a server that stops answering is `Unavailable` after about
    `retry + connect + read` seconds at most (two minutes and ten seconds by default).
    Each can be set in seconds by `$BRANCHWATER_S3_CONNECT_TIMEOUT`, `..._READ_TIMEOUT` and
    `..._RETRY_TIMEOUT`, read when a store is made."""

    connect: float = 10.0
    read: float = 60.0
    retry: float = 60.0
    retries: int = 4

    @classmethod
    def from_env(cls) -> S3Timeouts:
        default = cls()
        return cls(
            connect=_seconds_from_env(CONNECT_TIMEOUT_ENV, default.connect),
            read=_seconds_from_env(READ_TIMEOUT_ENV, default.read),
            retry=_seconds_from_env(RETRY_TIMEOUT_ENV, default.retry),
        )

    def obstore_client(self) -> ClientConfig:
        return {
            "connect_timeout": timedelta(seconds=self.connect),
            "read_timeout": timedelta(seconds=self.read),
            "timeout": _TRANSFER_TIMEOUT,
        }

    def obstore_retry(self) -> RetryConfig:
        return {
            "max_retries": self.retries,
            "retry_timeout": timedelta(seconds=self.retry),
            "backoff": _BACKOFF,  # type: ignore[typeddict-item]
        }


def _seconds_from_env(name: str, default: float) -> float:
    """A positive number of seconds from `name`, else `default` where it is unset or empty."""
    value = os.environ.get(name, "").strip()
    if not value:
        return default
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds < float("inf"):
        raise ConfigurationError(
            f"${name} must be a positive number of seconds, not {value!r}: unset it for "
            f"the default of {default:g}"
        )
    return seconds


T = TypeVar("T")
U = TypeVar("U")
Skipped = Callable[[str, int], None]
"""Told of each key (below the store's prefix) and size a listing leaves out."""


def _check_endpoint(endpoint: str | None) -> None:
    """`http(s)://host[:port]` or nothing: the S3 client panics (a `BaseException` no
    handler expects) on `localhost:9000` or a port that is not a number."""
    if not endpoint:
        return
    parts = urlsplit(endpoint)
    try:
        port_ok = parts.port is None or parts.port > 0
    except ValueError:
        port_ok = False
    if parts.scheme not in ("http", "https") or not parts.hostname or not port_ok:
        raise ConfigurationError(
            f"S3 endpoint {redact_url(endpoint)!r} is not a URL such as "
            "http://localhost:9000 or https://s3.example.com: give its scheme, host and "
            "port (endpoint_url, or AWS_ENDPOINT_URL)"
        )


def _check_key_pair(access_key: str | None, secret_key: str | None) -> None:
    if bool(access_key) != bool(secret_key):
        missing = "aws_secret_access_key" if access_key else "aws_access_key_id"
        raise ConfigurationError(
            f"S3 option {missing} is missing: give the access key id and the secret access "
            "key together, or neither (credentials then come from the environment)"
        )


class S3ObjectStore(ObjectStore):
    """An object store on one S3 bucket, optionally below a key prefix.

    Options given here override the usual AWS chain; without keys, credentials come from
    boto3's chain (environment, config files and profiles, instance roles), read on first
    use. `AWS_ENDPOINT_URL` works as boto3 defines it. A custom endpoint (SeaweedFS, MinIO)
    is addressed path-style, over `http://` if it says so.
    """

    def __init__(
        self,
        url: str,
        endpoint_url: str | None = None,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        aws_session_token: str | None = None,
        region_name: str | None = None,
    ) -> None:
        self.bucket, self.prefix = _parse_url(url)
        self.url = f"s3://{self.bucket}/{self.prefix}".rstrip("/")
        self.endpoint_url: str | None = endpoint_url or os.environ.get("AWS_ENDPOINT_URL")
        _check_endpoint(self.endpoint_url)
        _check_key_pair(aws_access_key_id, aws_secret_access_key)
        self._keys = (aws_access_key_id, aws_secret_access_key, aws_session_token)
        self._region = region_name
        self._store: S3Store | None = None
        self._opening = ChildSafeLock()
        self._bucket_seen = False
        self._path_order: bool | None = None
        self._conditional_puts = True
        self._closed = False
        self.timeouts = S3Timeouts.from_env()
        self._boto3 = Boto3Keys(
            self.url,
            self.bucket,
            self.prefix,
            {
                "endpoint_url": self.endpoint_url,
                "aws_access_key_id": aws_access_key_id,
                "aws_secret_access_key": aws_secret_access_key,
                "aws_session_token": aws_session_token,
                "region_name": region_name,
            },
            self.timeouts,
        )

    def put_stream(self, key: str, source: StreamSource, size: int | None = None) -> ObjectInfo:
        """One PutObject when `source` fits in `PART_SIZE`, else a multipart upload whose
        parts `part_plan` sizes from the stream's length (`size`, or a seekable file's), so
        that memory stays about `UPLOAD_MEMORY`. A failed upload is aborted: no object, no
        pending upload. A one-request object's mtime is this machine's clock when the write
        ends, which saves a HEAD per write (S3 stamps `LastModified` within the request); a
        multipart object's is read back, as AWS stamps it when the upload began, however
        long its parts took: what a GC run listing it will see."""
        self._check_writable(key)
        if size is None:
            size = known_size(source)
        part, in_flight = part_plan(size, f"{key!r} in {self.url}")
        chunks = iter_chunks(source, PART_SIZE)
        head: list[bytes] = []
        length = 0
        while length <= PART_SIZE and (chunk := next(chunks, None)) is not None:
            head.append(chunk)
            length += len(chunk)
        if length <= PART_SIZE:
            body = b"".join(head)
            self._call(key, lambda: obstore.put(self._s3, key, body, use_multipart=False))
            return ObjectInfo(key, length, datetime.now(UTC))
        counted = _Counted(chain(head, chunks), MAX_PARTS * part, self.url, key)
        aside = _ReadAside(counted)
        try:
            self._call(
                key,
                lambda: obstore.put(
                    self._s3,
                    key,
                    aside,
                    use_multipart=True,
                    chunk_size=part,
                    max_concurrency=in_flight,
                ),
            )
        except BucketNotFound:
            raise
        except NotFound:
            raise self._upload_forgotten(key) from None
        finally:
            aside.stop()
        return self._written(key)

    def copy(self, src: str, dst: str) -> ObjectInfo:
        """A server-side copy, no byte passing through this machine: CopyObject, or parts
        of `COPY_PART` copied `PARTS_IN_FLIGHT` at once (UploadPartCopy) above
        `COPY_THRESHOLD`, by boto3's managed copy, which aborts a failed one."""
        self._check_writable(dst)
        check_object_key(src)
        self._boto3.copy(src, dst, COPY_THRESHOLD, COPY_PART, PARTS_IN_FLIGHT)
        return self._written(dst)

    def _written(self, key: str) -> ObjectInfo:
        """The object just written at `key`, as a listing shows it."""
        try:
            return self.stat(key)
        except BucketNotFound:
            raise
        except NotFound:
            raise Unavailable(
                f"{key!r} in {self.url} was deleted as soon as it was written, by something "
                "outside this write (a GC run with a minimum age shorter than the write "
                "took); nothing refers to it: write it again"
            ) from None

    def _upload_forgotten(self, key: str) -> Unavailable:
        """The error of an upload the server stopped knowing (NoSuchUpload) before it
        answered its completion: a sweep of abandoned writes aborted it (nothing was
        written), or a completion whose reply was lost was sent again, and the first had
        completed it, which only an object under the key can show. It said the object was
        not found."""
        if not self.exists(key):
            return Unavailable(
                f"the upload of {key!r} to {self.url} was aborted before it completed (a GC "
                "sweep aborts uploads older than a day as abandoned); nothing was written: "
                "write it again"
            )
        return OutcomeUnknown(
            f"the upload of {key!r} to {self.url} may or may not have completed: the server "
            "no longer knows it, as after a completion whose reply was lost, and the key "
            "holds an object; read it to see whether it is this one, or write it again"
        )

    def put_if_absent(self, key: str, encode: Callable[[], bytes]) -> bool:
        """One conditional PutObject (`If-None-Match: *`) instead of a HEAD and a PUT: a
        round trip less on every range and metarange a commit stores, and one writer of two
        racing for the key. A server that reports another conditional write of the key under
        way (409) is asked again, as it says to, after each of `CONFLICT_PAUSES`; one that does not
        implement the condition (501) gets the HEAD and the PUT from then on, and one still
        in conflict gets them this time. The bytes are made first, as the request carries
        them.

        A PUT whose reply was lost may have been applied, and obstore sends it again by
        itself (after a dropped connection or a 5xx), whose copy then finds the key taken:
        so a taken key is settled by what it holds (`_holds`). These very bytes count as
        this call's write: no reader can tell them from another writer's same bytes, and a
        writer that must know it won writes bytes no other writes. A reply that stays lost
        (a timeout, a reset, 5xx to the end) has the PUT sent once more, which settles it;
        `OutcomeUnknown` if that reply is lost as well."""
        if not self._conditional_puts:
            return super().put_if_absent(key, encode)
        self._check_writable(key)
        body = encode()
        if len(body) > PART_SIZE:
            return super().put_if_absent(key, lambda: body)
        pauses = iter(CONFLICT_PAUSES)
        lost: _LostReply | None = None
        while True:
            try:
                written = self._call(key, lambda: self._create(key, body))
            except _LostReply as exc:
                if lost is not None:
                    raise OutcomeUnknown(
                        f"the write of {key!r} to {self.url} may or may not have been applied: "
                        f"its reply was lost, and so was the reply to sending it again "
                        f"({exc.cause}); read the key to see, or write it again later"
                    ) from None
                lost, written = exc, None
            if written is not None:
                return written
            pause = next(pauses, None)
            if pause is None or not self._conditional_puts:
                break
            time.sleep(pause)
        held = self._call(key, lambda: self._holds(key, body))
        if held is None:
            self.put(key, body)
            return True
        return held

    def _create(self, key: str, body: bytes) -> bool | None:
        """One conditional PUT of `body`: whether it wrote (a taken key: whether it holds
        `body`), or None to ask again (409, 501, a key emptied since its 412); `_LostReply`
        where no reply settled it."""
        try:
            obstore.put(self._s3, key, body, mode="create", use_multipart=False)
        except AlreadyExistsError:
            return self._holds(key, body)
        except BaseError as exc:
            if _status(exc) == "501" or _code(exc) == "NotImplemented":
                self._conditional_puts = False
                return None
            if _status(exc) == "409":
                return None
            if _reply_lost(exc):
                raise _LostReply(self._error(exc)) from None
            raise
        return True

    def _holds(self, key: str, body: bytes) -> bool | None:
        """Whether `key` holds exactly `body`; None where it holds nothing. A single PUT's
        ETag is its MD5 (AWS without KMS keys, SeaweedFS); where it is not, the bytes of an
        object of the same size are compared."""
        try:
            meta = obstore.head(self._s3, key)
            if _etag(meta) == hashlib.md5(body, usedforsecurity=False).hexdigest():
                return True
            if meta["size"] != len(body):
                return False
            return bytes(obstore.get(self._s3, key).bytes()) == body
        except FileNotFoundError:
            return None

    def _check_writable(self, key: str) -> None:
        if not addressable(check_object_key(key)):
            raise InvalidArgument(
                f"object key {key!r} has control characters: Branchwater reads such S3 keys "
                "(written by other tools) but does not write them"
            )
        if len((self.prefix + key).encode()) > MAX_KEY:
            raise InvalidArgument(
                f"object key {key!r} is longer than the {MAX_KEY} bytes (UTF-8, with the "
                f"store's prefix) an S3 key holds in {self.url}; shorten it"
            )

    def open(self, key: str, *, etag: str | None = None) -> BinaryIO:
        """Ranged GETs behind an adaptive read-ahead (`AdaptiveReader`: a read after a seek
        fetches what it asks, sequential reads a growing window); a read to the end is one
        GET. The HEAD
        this starts with gives the size (for `seek` from the end), `NotFound` early, and the
        ETag every GET must match (`etag` where given: a version the caller holds), so an
        object replaced meanwhile fails the read (`CorruptedData`) instead of mixing two
        versions."""
        drain_native_readers_at_exit()
        if not addressable(check_object_key(key)):
            info = self._boto3.head(key)
            reader = _RangeReader(self, key, info.size, etag or info.etag or "*")
            return cast(BinaryIO, AdaptiveReader(reader))
        meta = self._call(key, lambda: obstore.head(self._s3, key))
        pinned = f'"{etag}"' if etag else meta["e_tag"] or "*"
        reader = _RangeReader(self, key, meta["size"], pinned)
        return cast(BinaryIO, AdaptiveReader(reader))

    def get(self, key: str) -> bytes:
        """One GET of the whole object, where `open` would HEAD first and then GET: a
        whole-object GET already returns a single version, so no ETag is needed to keep two
        versions from mixing. Keys obstore cannot address read through boto3 as `open` does."""
        if not addressable(check_object_key(key)):
            return super().get(key)
        result = self._call(key, lambda: obstore.get(self._s3, key))
        return bytes(self._call(key, result.bytes))

    def _get_range(self, key: str, etag: str, start: int, stop: int | None) -> Any:
        """Bytes `start` to `stop` (the end when None) of `key`, if it still has `etag`."""
        if not addressable(key):
            return self._boto3.get_range(key, etag, start, stop)
        wanted: Any = {"offset": start} if stop is None else (start, stop)
        result = self._call(
            key,
            lambda: obstore.get(self._s3, key, options={"range": wanted, "if_match": etag}),
        )
        return self._call(key, result.bytes)

    def stat(self, key: str) -> ObjectInfo:
        if not addressable(check_object_key(key)):
            return self._boto3.head(key)
        meta = self._call(key, lambda: obstore.head(self._s3, key))
        return ObjectInfo(key, meta["size"], _utc(meta["last_modified"]), _etag(meta))

    def exists(self, key: str) -> bool:
        """Like `ObjectStore.exists`, but a missing bucket is an error, never plain `False`."""
        try:
            self.stat(key)
        except BucketNotFound:
            raise
        except NotFound:
            return False
        return True

    def delete(self, keys: Iterable[str]) -> None:
        """DeleteObjects of `DELETE_BATCH` keys, `REQUESTS_IN_FLIGHT` batches at once, keys
        drawn as batches go; the first failed batch ends it (batches in flight finish)."""
        checked = (key if _plain(key) else check_object_key(key) for key in keys)
        batches = iter(lambda: list(islice(checked, DELETE_BATCH)), [])
        _bounded_map(lambda batch: self._delete_batch(batch), batches)

    def list_objects(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Keys in ascending UTF-8 byte order. obstore lists folders (`prefix` up to its
        last `/`), so the keys of that folder that do not start with `prefix` are passed
        over. A folder marker (`a/`, written by other tools) is left out: obstore reads it
        as `a`, so an empty object is looked up to tell which it is."""
        if not isinstance(prefix, str):
            raise InvalidArgument(f"list prefix must be a string, not {type(prefix).__name__}")
        return self._list(prefix)

    def list_folder(self, folder: str, *, metadata: bool = True) -> Listing:
        """ListObjectsV2 with a `/` delimiter: one request per 1,000 names however deep the
        folder's tree."""
        folder = check_folder(folder)
        try:
            result = self._call(
                None,
                lambda: obstore.list_with_delimiter(self._s3, folder or None, return_arrow=True),
            )
        except _Unlistable:
            return self._boto3_folder(folder)
        start = len(folder) + 1 if folder else 0
        directories = [p[start:] for p in result["common_prefixes"] if "/" not in p[start:]]
        objects = pa.table(result["objects"])
        if not len(objects):
            return Listing([], [], [], directories)
        names = pc.utf8_slice_codeunits(objects["path"], start)
        kept = pc.and_(pc.not_equal(names, ""), pc.invert(pc.match_substring(names, "/")))
        mtimes = pc.cast(
            pc.filter(objects["last_modified"], kept), pa.timestamp("us", tz="UTC"), safe=False
        )
        return Listing(
            pc.filter(names, kept).to_pylist(),
            pc.filter(objects["size"], kept).cast(pa.int64()).to_pylist(),
            pc.multiply(mtimes.cast(pa.int64()), 1000).to_pylist(),
            directories,
        )

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

    def discard_abandoned_writes(self, folder: str, before: datetime) -> Discarded:
        """Abort the multipart uploads of keys under `folder` initiated before `before`, and
        with them their parts (bytes S3 bills, no listing of objects shows). A killed
        writer's upload stays open for ever; obstore cannot list uploads, so boto3 does. S3
        tells only when an upload began, never when its last part came, so `before` must
        leave room for the longest upload: one still under way when aborted fails at its
        completion and publishes nothing. An upload completed or aborted meanwhile is
        passed over."""
        folder = check_folder(folder)
        cutoff = check_moment(before, "before")
        discarded = Discarded()
        full_prefix = self.prefix + (f"{folder}/" if folder else "")
        for upload in self._boto3.multipart_uploads(full_prefix):
            if _utc(upload["Initiated"]) >= cutoff:
                continue
            key, upload_id = upload["Key"], upload["UploadId"]
            try:
                size = self._boto3.upload_bytes(key, upload_id)
                self._boto3.abort_upload(key, upload_id)
            except NotFound:
                continue
            discarded += Discarded(1, size)
        return discarded

    def close(self) -> None:
        """Drop the clients, for good: a request after (one still under way on another
        thread, say) gets `LakeClosed` rather than a new client."""
        with self._opening:
            self._closed = True
            self._store = None
        self._boto3.close()

    @property
    def _s3(self) -> S3Store:
        """The obstore client, made on first use: finding credentials may take a request."""
        _runtime_usable(self.url)
        with self._opening:
            if self._closed:
                raise lake_closed()
            if self._store is None:
                self._store = self._open()
            return self._store

    def _open(self) -> S3Store:
        access_key, secret_key, token = self._keys
        options: dict[str, Any] = {}
        if access_key or secret_key:
            options.update(access_key_id=access_key, secret_access_key=secret_key)
            if token:
                options["token"] = token
        else:
            options["credential_provider"] = self._boto3_credentials()
        if self._region:
            options["region"] = self._region
        client = dict(self.timeouts.obstore_client())
        if self.endpoint_url:
            options.update(endpoint=self.endpoint_url, virtual_hosted_style_request=False)
            client["allow_http"] = self.endpoint_url.startswith("http://")
        try:
            return S3Store(
                self.bucket,
                prefix=self.prefix.rstrip("/") or None,
                client_options=client,  # type: ignore[arg-type]
                retry_config=self.timeouts.obstore_retry(),
                **options,
            )
        except BaseError as exc:
            raise ConfigurationError(f"S3 object store {self.url}: {_message(exc)}") from None

    def _boto3_credentials(self) -> Any:
        """boto3's credential chain, which obstore's own lacks parts of (profiles, SSO)."""
        import boto3
        from obstore.auth.boto3 import Boto3CredentialProvider

        session = boto3.session.Session()
        try:
            provider = Boto3CredentialProvider(session)
        except ValueError:
            raise Unavailable(
                f"no usable AWS credentials for S3 object store {self.url}: none given, "
                "and none in the environment, the AWS config files or an instance role"
            ) from None
        if not self._region and session.region_name:
            self._region = session.region_name
        return provider

    def list_tables(
        self, prefix: str = "", *, skipped: Skipped | None = None
    ) -> Iterator[pa.Table]:
        """`list_objects` as Arrow tables of `LIST_SCHEMA`, a listing page at a time: the
        same objects in the same order, without a Python object per key (an import lists
        millions). `skipped(key, size)` is told of each key S3 holds that the listing leaves
        out, as no key of a store can be: a folder marker (`a/`, written by other tools) or a
        key with empty, `.` or `..` parts (`a//b`) that AWS holds verbatim (directory-backed
        servers such as SeaweedFS rewrite or refuse such keys, so never list one)."""
        if not isinstance(prefix, str):
            raise InvalidArgument(f"list prefix must be a string, not {type(prefix).__name__}")
        return self._tables(prefix, skipped)

    def _list(self, prefix: str) -> Iterator[ObjectInfo]:
        for table in self._tables(prefix, None):
            yield from map(ObjectInfo, *(table[name].to_pylist() for name in LIST_SCHEMA.names))

    def _tables(self, prefix: str, skipped: Skipped | None) -> Iterator[pa.Table]:
        """obstore's listing, or boto3's from where it stopped if it met a key obstore
        cannot address. A caller told of skipped keys (an import) on a server that keeps
        keys verbatim, as AWS does, gets boto3's from the start: obstore lists a non-empty
        folder marker `a/` as an object `a`, and only the raw keys tell them apart."""
        if skipped is not None and not self._lists_path_by_path():
            yield from self._boto3_tables(prefix, None, skipped)
            return
        last: str | None = None
        try:
            for table in self._obstore_tables(prefix, skipped):
                last = table["key"][-1].as_py()
                yield table
        except _Unlistable:
            yield from self._boto3_tables(prefix, last, skipped)

    def _boto3_tables(
        self, prefix: str, after: str | None, skipped: Skipped | None
    ) -> Iterator[pa.Table]:
        infos = self._boto3_list(prefix, after, skipped)
        tables: Iterator[pa.Table] = map(
            _table_of, iter(lambda: list(islice(infos, LIST_PAGE)), [])
        )
        if self._lists_path_by_path():
            tables = _key_ordered(tables, len(prefix))
        return tables

    def _boto3_list(
        self, prefix: str, after: str | None, skipped: Skipped | None
    ) -> Iterator[ObjectInfo]:
        """Every key below `prefix` and after `after` as boto3 lists it, in the server's
        order; keys no store can address (folder markers, `a//b`) are left out, and told to
        `skipped`."""
        for page in self._boto3.pages(self.prefix + prefix):
            for obj in page.get("Contents", ()):
                key = obj["Key"][len(self.prefix) :]
                if after is not None and key <= after:
                    continue
                try:
                    check_object_key(key)
                except InvalidArgument:
                    if skipped is not None:
                        skipped(key, obj["Size"])
                    continue
                etag = obj.get("ETag", "").strip('"') or None
                yield ObjectInfo(key, obj["Size"], _utc(obj["LastModified"]), etag)

    def _boto3_folder(self, folder: str) -> Listing:
        full = self.prefix + (f"{folder}/" if folder else "")
        names: list[str] = []
        sizes: list[int] = []
        mtimes: list[int] = []
        directories: list[str] = []
        for page in self._boto3.pages(full, delimiter="/"):
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

    def _obstore_tables(self, prefix: str, skipped: Skipped | None) -> Iterator[pa.Table]:
        folder = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        if folder:
            try:
                check_folder(folder)
            except InvalidArgument:
                return
        pages = self._call(
            None,
            lambda: obstore.list(self._s3, folder or None, chunk_size=LIST_PAGE, return_arrow=True),
        )
        tables: Iterator[pa.Table] = (
            t for page in _called(self, pages) if len(t := _listed(page, prefix))
        )
        if self._lists_path_by_path():
            tables = _key_ordered(tables, len(prefix))
        previous: str | None = None
        for table in tables:
            kept = table.filter(self._kept(table, previous, skipped))
            if len(kept):
                previous = kept["key"][-1].as_py()
                yield kept

    def _kept(self, table: pa.Table, previous: str | None, skipped: Skipped | None) -> pa.Array:
        """Which rows are objects: not a repeat of the key before, and not empty unless an
        object of that key exists. obstore lists a key ending in `/` (a folder marker) as
        the key without it, so such a repeat, or an empty key that does not exist, is that
        key with its `/`, told to `skipped`. A non-empty `a/` alone lists as an object `a`,
        which nothing in the listing tells apart: where it matters (an import), a server
        that keeps such keys is listed by boto3 (`_tables`)."""
        keys = table["key"]
        before = pa.concat_arrays([pa.array([previous], pa.string()), keys.combine_chunks()])
        kept = pc.fill_null(pc.not_equal(keys, before[:-1]), True)
        empty = pc.equal(table["size"], 0)
        if pc.any(empty).as_py():
            rows = pc.indices_nonzero(pc.and_(empty, kept)).to_pylist()
            gone = {row for row in rows if not self.exists(keys[row].as_py())}
            marker = pa.array([row in gone for row in range(len(table))])
            kept = pc.and_(kept, pc.invert(marker))
        if skipped is not None and not pc.all(kept).as_py():
            left_out = table.filter(pc.invert(kept))
            keys_out, sizes_out = left_out["key"].to_pylist(), left_out["size"].to_pylist()
            for key, size in zip(keys_out, sizes_out, strict=True):
                skipped(key + "/", size)
        return kept

    def _lists_path_by_path(self) -> bool:
        """Whether the endpoint is a server that lists path by path, by its `Server` header
        (AWS itself lists in byte order). One unsigned HEAD of the bucket, the first time it
        matters (the endpoint's root answers without the header)."""
        if self._path_order is None:
            self._path_order = False
            if self.endpoint_url:
                bucket = f"{self.endpoint_url.rstrip('/')}/{self.bucket}"
                request = urllib.request.Request(bucket, method="HEAD")
                try:
                    with urllib.request.urlopen(request, timeout=10) as response:
                        server = response.headers.get("Server", "")
                except urllib.error.HTTPError as exc:
                    server = exc.headers.get("Server", "")
                except (OSError, ValueError):
                    server = ""
                self._path_order = server.startswith(_PATH_ORDER_SERVERS)
        return self._path_order

    def _delete_batch(self, keys: list[str]) -> None:
        """One DeleteObjects. obstore raises on the first key its reply says could not be
        deleted and hides the others (and would fail on `NoSuchKey`, which some servers
        report for an absent key): then the batch is sent again through boto3, which tells
        every key's failure and passes over absent ones. Deleting again is harmless."""
        plain = [key for key in keys if _plain(key) or addressable(key)]
        if plain and not self._call(None, lambda: self._deleted(plain)):
            self._boto3.delete(plain)
        if len(plain) < len(keys):
            self._boto3.delete([key for key in keys if not addressable(key)])

    def _deleted(self, keys: list[str]) -> bool:
        """Whether obstore's DeleteObjects of `keys` deleted every one."""
        try:
            obstore.delete(self._s3, keys)
        except BaseError as exc:
            if _DELETE_FAILED not in str(exc):
                raise
            return False
        return True

    def _call(self, key: str | None, request: Callable[[], T]) -> T:
        """Run one S3 request, turning obstore's errors into typed errors that name the URL."""
        try:
            result = request()
        except BranchwaterError:
            raise
        except FileNotFoundError as exc:
            self._raise_not_found(key, exc)
        except PreconditionError:
            raise CorruptedData(
                f"object {key!r} in {self.url} was replaced while it was being read; "
                "objects are written once, so something outside Branchwater rewrote it"
            ) from None
        except InvalidPathError:
            raise _Unlistable from None
        except (PermissionDeniedError, UnauthenticatedError) as exc:
            raise Unavailable(
                f"S3 object store {self.url} refused our credentials or access "
                f"({_status(exc) or 'denied'})"
            ) from None
        except BaseError as exc:
            self._raise_error(exc)
        self._bucket_seen = True
        return result

    def _raise_not_found(self, key: str | None, exc: Exception) -> NoReturn:
        code = _code(exc)
        if code == "NoSuchBucket":
            raise self._missing_bucket() from None
        unsure = key is not None and code != "NoSuchKey" and not self._bucket_seen
        if unsure and not self._bucket_exists():
            raise self._missing_bucket() from None
        raise NotFound(f"object {key!r} not found in {self.url}") from None

    def _raise_error(self, exc: BaseException) -> NoReturn:
        raise self._error(exc) from None

    def _error(self, exc: BaseException) -> BranchwaterError:
        """The typed error of an obstore error, saying what to do. Throttling and 5xx come
        after obstore's own retries (`S3Timeouts`) ran out."""
        code = _code(exc)
        if code == "NoSuchBucket":
            return self._missing_bucket()
        if code == "KeyTooLongError":
            return InvalidArgument(
                f"S3 object store {self.url} refused a key as too long (KeyTooLongError; "
                "S3 takes 1024 bytes, some S3-compatible servers fewer); shorten it"
            )
        status = _status(exc)
        if status is None and any(s in _message(exc) for s in _UNREACHABLE):
            return Unavailable(
                f"cannot reach S3 object store {self.url} at "
                f"{redact_url(self.endpoint_url or 'AWS')}: {_message(exc)}"
            )
        return refusal(self.url, status, code, _message(exc))

    def _bucket_exists(self) -> bool:
        """Tell a missing bucket from a missing key: HEAD errors carry no body to say which.

        Anything but a clear "no such bucket" counts as existing: a policy may allow object
        reads yet deny listing, and then the missing key is the honest answer.
        """
        try:
            next(iter(obstore.list(self._s3, None, chunk_size=1)), None)
        except BaseError as exc:
            return _code(exc) != "NoSuchBucket"
        self._bucket_seen = True
        return True

    def _missing_bucket(self) -> BucketNotFound:
        return BucketNotFound(
            f"S3 bucket {self.bucket!r} of object store {self.url} does not exist; "
            "create it or fix the URL"
        )


class _Unlistable(Exception):
    """obstore's listing met a key it cannot address: boto3 lists instead."""


class _LostReply(Exception):
    """A conditional PUT got no reply that settles it: it may have been applied."""

    def __init__(self, cause: BranchwaterError) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _reply_lost(exc: BaseException) -> bool:
    """Whether a request that failed may have run: no reply came back (a dropped
    connection, a timeout), or a 5xx or 408 did. Not a refusal (4xx), nor throttling, which
    refuses a request before it runs."""
    status, code = _status(exc), _code(exc)
    if status == "429" or code in THROTTLED:
        return False
    if status is None:
        return any(s in _message(exc) for s in _UNREACHABLE)
    return status.startswith("5") or status == "408"


class _Counted:
    """The chunks of a stream, counted as obstore draws them; a stream longer than S3's
    parts can hold is refused (`InvalidArgument`) before its upload completes."""

    def __init__(self, chunks: Iterator[bytes], limit: int, url: str, key: str) -> None:
        self._chunks = chunks
        self._limit = limit
        self._where = f"{key!r} in {url}"
        self.size = 0

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        chunk = next(self._chunks)
        self.size += len(chunk)
        if self.size > self._limit:
            raise InvalidArgument(
                f"object {self._where} is larger than the {self._limit >> 30} GiB an S3 upload "
                "of its part size holds; give its size (put_stream's size=, or a seekable "
                "file) so parts are sized for it, or split it into several objects"
            )
        return chunk


class _ReadAside:
    """The chunks of a stream, read by a thread of their own, at most one ahead of the
    upload. obstore draws a multipart upload's stream from inside its runtime, where a
    source that reads through obstore itself (a copy of an S3 object: `Ref.open`, the
    filesystem's `cp`) cannot start its own read: obstore panicked ("Cannot start a runtime
    from within a runtime") and left the upload open."""

    def __init__(self, chunks: Iterator[bytes]) -> None:
        self._queue: queue.Queue[bytes | BaseException | None] = queue.Queue(maxsize=1)
        self._stopped = threading.Event()
        threading.Thread(
            target=self._read, args=(chunks,), name="s3-upload-source", daemon=True
        ).start()

    def __iter__(self) -> Iterator[bytes]:
        return self

    def __next__(self) -> bytes:
        item = self._queue.get()
        if item is None:
            raise StopIteration
        if isinstance(item, BaseException):
            raise item
        return item

    def stop(self) -> None:
        """Let the reading thread end at its next chunk: the upload drew its last, or failed."""
        self._stopped.set()

    def _read(self, chunks: Iterator[bytes]) -> None:
        try:
            for chunk in chunks:
                if not self._offer(chunk):
                    return
        except BaseException as exc:
            self._offer(exc)
            return
        self._offer(None)

    def _offer(self, item: bytes | BaseException | None) -> bool:
        while not self._stopped.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False


def part_plan(size: int | None, where: str = "the object") -> tuple[int, int]:
    """The part size and parts in flight of a multipart upload of `size` bytes (None:
    unknown). S3 takes at most `MAX_PARTS` parts, so parts grow past `PART_SIZE` (in whole
    MiB) for objects above 78 GiB; obstore cannot grow them during an upload, so a stream of
    unknown length gets `STREAM_PART`. Fewer parts go at once as they grow, one at the
    least: a 5 TiB object holds about two 525 MiB parts in memory."""
    if size is not None and size > MAX_OBJECT:
        raise InvalidArgument(
            f"object {where} has {size} bytes, more than the 5 TiB an S3 object holds; "
            "split it into several objects"
        )
    if size is None:
        part = STREAM_PART
    else:
        fewest = -(-size // MAX_PARTS)
        part = max(PART_SIZE, -(-fewest // (1 << 20)) << 20)
    in_flight = max(1, min(PARTS_IN_FLIGHT, UPLOAD_MEMORY // part - 1))
    return part, in_flight


def _called(store: S3ObjectStore, pages: Iterator[T]) -> Iterator[T]:
    """`pages`, each drawn through `store._call`: listing requests go page by page."""
    while (page := store._call(None, lambda: next(pages, None))) is not None:
        yield page


def _plain(key: object) -> bool:
    return isinstance(key, str) and _PLAIN_KEY.fullmatch(key) is not None


def _message(exc: BaseException) -> str:
    """obstore's message without its debug dump (which repeats it at length)."""
    return str(exc).split("\n\nDebug source", 1)[0].split("\n", 1)[0].strip()


def _status(exc: BaseException) -> str | None:
    found = _STATUS.search(str(exc))
    return found[1] if found else None


def _code(exc: BaseException) -> str | None:
    found = _CODE.search(str(exc))
    return found[1] if found else None


def _etag(meta: ObjectMeta) -> str | None:
    return (meta.get("e_tag") or "").strip('"') or None


_runtime_started_in: int | None = None
"""The process whose request started obstore's runtime (the first this process or an
ancestor made)."""


def _runtime_usable(url: str) -> None:
    """`ConfigurationError` in a process forked after obstore's runtime was started."""
    global _runtime_started_in
    pid = os.getpid()
    if _runtime_started_in is None:
        _runtime_started_in = pid
    elif _runtime_started_in != pid:
        raise ConfigurationError(
            f"S3 object store {url} cannot be used in this process: it was forked from process "
            f"{_runtime_started_in}, which had made S3 requests already, and the S3 client's "
            "runtime does not survive a fork (its requests would hang). Start worker processes "
            "with the 'spawn' or 'forkserver' method (multiprocessing.get_context('spawn')), "
            "or fork them before the first S3 request."
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


def _key_ordered(tables: Iterable[pa.Table], shared: int) -> Iterator[pa.Table]:
    """Byte order from listing pages sorted path by path, as a store built on directories
    lists.

    Such a store lists all of `a/` where `a` sorts, before siblings like `a-c` or `a.d`
    that S3 puts first. After each page, the held keys below every key a later page could
    still sort before (`_unsettled`) are released, sorted; the rest wait. Every key shares
    its first `shared` characters."""
    held: pa.Table | None = None
    for table in tables:
        held = table if held is None else pa.concat_tables([held, table])
        keys = held["key"]
        waiting = [pc.starts_with(keys, p) for p in _unsettled(table["key"][-1].as_py(), shared)]
        mask = reduce(pc.or_, waiting) if waiting else None
        if mask is not None and pc.any(mask).as_py():
            bound = pc.min(pc.filter(keys, mask))
            ready, held = (
                held.filter(pc.less(keys, bound)),
                held.filter(pc.greater_equal(keys, bound)),
            )
        else:
            ready, held = held, None
        if len(ready):
            yield ready.sort_by("key")
    if held is not None:
        yield held.sort_by("key")


def _unsettled(latest: str, shared: int) -> tuple[str, ...]:
    """Prefixes of the keys a path-by-path listing may still list one before, once it has
    listed `latest` (every key shares its first `shared` characters): the keys in `latest`'s
    first folder below those, and those in a folder whose name `latest`'s first name extends
    with a character below `/` (with `a-c` listed, `a-d` may follow and sorts before `a/b`).
    """
    slash = latest.find("/", shared)
    end = len(latest) if slash < 0 else slash
    found = [latest[:i] + "/" for i in range(shared, end) if latest[i] < "/"]
    if slash >= 0:
        found.append(latest[: slash + 1])
    return tuple(found)


def _listed(page: Any, prefix: str) -> pa.Table:
    """An obstore listing page (Arrow) as `LIST_SCHEMA`, only the keys under `prefix`."""
    batch = pa.record_batch(page)
    etags = pc.utf8_trim(batch["e_tag"], '"')
    columns = {
        "key": batch["path"],
        "size": batch["size"].cast(pa.int64()),
        "mtime": batch["last_modified"].cast(LIST_SCHEMA.field("mtime").type),
        "etag": pc.if_else(pc.equal(etags, ""), pa.scalar(None, pa.string()), etags),
    }
    table = pa.table(columns, schema=LIST_SCHEMA)
    return table.filter(pc.starts_with(table["key"], prefix)) if prefix else table


def _table_of(infos: list[ObjectInfo]) -> pa.Table:
    columns = {
        "key": [i.key for i in infos],
        "size": [i.size for i in infos],
        "mtime": [i.mtime for i in infos],
        "etag": [i.etag for i in infos],
    }
    return pa.table(columns, schema=LIST_SCHEMA)


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


def _epoch_ns(moment: datetime) -> int:
    return epoch_micros(moment) * 1000


def _utc(moment: datetime) -> datetime:
    return moment.astimezone(UTC)


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
        data = memoryview(self._store._get_range(self._key, self._etag, self._pos, stop))
        view[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def readall(self) -> bytes:
        if self._pos >= self._size:
            return b""
        data = bytes(self._store._get_range(self._key, self._etag, self._pos, None))
        self._pos += len(data)
        return data
