"""boto3 for what obstore cannot do: address keys with ASCII control characters, and list
or abort multipart uploads.

obstore (Rust's `object_store`) refuses such a key as a path, and fails a whole listing that
meets one. Other tools write them, and an import reads them where they are, so the S3 driver
reads, deletes and lists them through boto3 instead; Branchwater itself never writes one.
obstore aborts the multipart uploads it sees fail, but one whose process was killed stays
open with its parts; only ListMultipartUploads finds it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from datetime import UTC
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

from branchwater.engine.errors import (
    BranchwaterError,
    CorruptedData,
    NotFound,
    Unavailable,
    lake_closed,
)
from branchwater.engine.objects.store import ObjectInfo
from branchwater.engine.per_process import PerProcess

if TYPE_CHECKING:
    from branchwater.engine.objects.s3 import S3Timeouts

T = TypeVar("T")

UPLOADS_PAGE = 1000
"""Open multipart uploads asked per ListMultipartUploads page: S3's most, and its default."""


THROTTLED = ("SlowDown", "TooManyRequests", "RequestLimitExceeded", "Throttling")
"""Codes of a server that refuses requests for their rate: it did not run them."""


def refusal(url: str, status: str | None, code: str | None, message: str) -> BranchwaterError:
    """The typed error of an S3 reply that was no success, once the client's own retries
    ran out, saying what to do; obstore's and boto3's errors alike."""
    detail = " ".join(filter(None, (status, code)))
    retried = "still after retrying"
    if status in ("401", "403"):
        return Unavailable(f"S3 object store {url} refused our credentials or access ({detail})")
    if status == "429" or code in THROTTLED:
        return Unavailable(
            f"S3 object store {url} is throttling requests ({detail}), {retried}: "
            "run fewer tasks against it at once, or try again later"
        )
    if (status or "").startswith("5") or status == "408" or code == "RequestTimeout":
        return Unavailable(
            f"S3 object store {url} is unavailable ({detail}), {retried}; try again later"
        )
    return BranchwaterError(f"S3 object store {url} rejected the request ({detail or message})")


def addressable(key: str) -> bool:
    """Whether obstore can address `key`: no ASCII control character in it."""
    return not any(ord(c) < 0x20 or ord(c) == 0x7F for c in key)


_STARTED = "branchwater_started"
"""Where a request's context holds when its first attempt began (`_within`)."""


class Boto3Keys:
    """A boto3 client on the driver's bucket and prefix, made on first use in each process
    (`PerProcess`), waiting and retrying as the store's obstore client does (`timeouts`)."""

    def __init__(
        self,
        url: str,
        bucket: str,
        prefix: str,
        options: dict[str, str | None],
        timeouts: S3Timeouts,
    ) -> None:
        self._url = url
        self._bucket = bucket
        self._prefix = prefix
        self._options = options
        self._timeouts = timeouts
        self._closed = False
        self._clients: PerProcess[Any] = PerProcess(self._new_client)

    @property
    def client(self) -> Any:
        """The client; none once closed, as a closed one would open connections again."""
        if self._closed:
            raise lake_closed()
        return self._clients.get()

    def _new_client(self) -> Any:
        """botocore's standard retries, `timeouts.retries` of them, but none started once
        `timeouts.retry` seconds have passed since the request's first attempt, as obstore
        does: without that bound, five attempts at a server that stopped answering each
        waited out the read timeout."""
        import boto3
        from botocore.config import Config

        timeouts = self._timeouts
        config = Config(
            connect_timeout=timeouts.connect,
            read_timeout=timeouts.read,
            retries={"mode": "standard", "max_attempts": timeouts.retries + 1},
        )
        client = boto3.session.Session().client("s3", config=config, **self._options)
        client.meta.events.register("before-call.s3", _started)
        client.meta.events.register_first("needs-retry.s3", _within(timeouts.retry))
        return client

    def head(self, key: str) -> ObjectInfo:
        response = self._call(
            key, lambda: self.client.head_object(Bucket=self._bucket, Key=self._prefix + key)
        )
        etag = response.get("ETag", "").strip('"') or None
        return ObjectInfo(
            key, response["ContentLength"], response["LastModified"].astimezone(UTC), etag
        )

    def get_range(self, key: str, etag: str, start: int, stop: int | None) -> bytes:
        wanted = f"bytes={start}-" + ("" if stop is None else str(stop - 1))
        response = self._call(
            key,
            lambda: self.client.get_object(
                Bucket=self._bucket, Key=self._prefix + key, Range=wanted, IfMatch=f'"{etag}"'
            ),
        )
        return self._call(key, response["Body"].read)

    def copy(self, src: str, dst: str, threshold: int, part: int, in_flight: int) -> None:
        """boto3's managed copy of `src` to `dst` (CopyObject, or UploadPartCopy parts of
        `part` bytes at least, `in_flight` at once, above `threshold`)."""
        from boto3.s3.transfer import TransferConfig

        config = TransferConfig(
            multipart_threshold=threshold,
            multipart_chunksize=part,
            max_concurrency=in_flight,
            use_threads=in_flight > 1,
        )
        self._call(
            src,
            lambda: self.client.copy(
                {"Bucket": self._bucket, "Key": self._prefix + src},
                self._bucket,
                self._prefix + dst,
                Config=config,
            ),
        )

    def delete(self, keys: list[str]) -> None:
        objects = [{"Key": self._prefix + key} for key in keys]
        response = self._call(
            None,
            lambda: self.client.delete_objects(
                Bucket=self._bucket, Delete={"Objects": objects, "Quiet": True}
            ),
        )
        failures = [e for e in response.get("Errors", ()) if e.get("Code") != "NoSuchKey"]
        if failures:
            first = failures[0]
            raise Unavailable(
                f"S3 object store {self._url} could not delete {len(failures)} of "
                f"{len(keys)} object(s) (first: {first.get('Key')!r}: {first.get('Code')}: "
                f"{first.get('Message')}); they are still there: delete them again once "
                "the cause is gone"
            )

    def pages(self, full_prefix: str, delimiter: str = "") -> Iterator[dict[str, Any]]:
        """ListObjectsV2 pages of `full_prefix` (below the bucket, the driver's prefix
        included), as boto3 returns them."""
        extra = {"Delimiter": delimiter} if delimiter else {}
        paginator = self.client.get_paginator("list_objects_v2")
        pages = iter(paginator.paginate(Bucket=self._bucket, Prefix=full_prefix, **extra))
        while (page := self._call(None, lambda: next(pages, None))) is not None:
            yield page

    def multipart_uploads(self, full_prefix: str) -> Iterator[dict[str, Any]]:
        """The open multipart uploads of keys under `full_prefix` (below the bucket, the
        driver's prefix included), every page of ListMultipartUploads, as boto3 gives them
        (`Key`, `UploadId`, `Initiated`). boto3's paginator asks each page from the last
        one's `NextKeyMarker` and `NextUploadIdMarker` (SeaweedFS gives only the latter): a
        position, so uploads aborted while the pages are read, the marker's among them, do
        not lose it."""
        paginator = self.client.get_paginator("list_multipart_uploads")
        pages = iter(
            paginator.paginate(
                Bucket=self._bucket,
                Prefix=full_prefix,
                PaginationConfig={"PageSize": UPLOADS_PAGE},
            )
        )
        while (page := self._call(None, lambda: next(pages, None))) is not None:
            yield from page.get("Uploads", ())

    def upload_bytes(self, full_key: str, upload_id: str) -> int:
        """The bytes the parts of an open upload hold, every page of ListParts; `NotFound`
        once it was completed or aborted."""
        paginator = self.client.get_paginator("list_parts")
        pages = iter(paginator.paginate(Bucket=self._bucket, Key=full_key, UploadId=upload_id))
        total = 0
        while (page := self._call(full_key, lambda: next(pages, None))) is not None:
            total += sum(int(part["Size"]) for part in page.get("Parts", ()))
        return total

    def abort_upload(self, full_key: str, upload_id: str) -> None:
        """Abort an open upload, dropping its parts; `NotFound` once it was completed or
        aborted."""
        self._call(
            full_key,
            lambda: self.client.abort_multipart_upload(
                Bucket=self._bucket, Key=full_key, UploadId=upload_id
            ),
        )

    def close(self) -> None:
        self._closed = True
        client = self._clients.made_here()
        if client is not None:
            client.close()

    def _call(self, key: str | None, request: Callable[[], T]) -> T:
        from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError

        try:
            return request()
        except ClientError as exc:
            self._raise(key, exc)
        except HTTPClientError as exc:
            raise Unavailable(
                f"cannot reach S3 object store {self._url}: {exc} (retried for up to "
                f"{self._timeouts.retry:g} s); try again later"
            ) from None
        except BotoCoreError as exc:
            raise Unavailable(f"S3 object store {self._url}: {exc}") from None

    def _raise(self, key: str | None, exc: Any) -> NoReturn:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        if code in ("NoSuchKey", "404", "NotFound"):
            raise NotFound(f"object {key!r} not found in {self._url}") from None
        if code == "NoSuchUpload":
            raise NotFound(f"no open multipart upload of {key!r} in {self._url}") from None
        if code == "PreconditionFailed":
            raise CorruptedData(
                f"object {key!r} in {self._url} was replaced while it was being read; "
                "objects are written once, so something outside Branchwater rewrote it"
            ) from None
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        raise refusal(self._url, str(status) if status else None, code, str(exc)) from None


def _started(context: dict[str, Any], **_: Any) -> None:
    context.setdefault(_STARTED, time.monotonic())


def _within(budget: float) -> Callable[..., bool | None]:
    """A `needs-retry` handler, run before botocore's own: False (no retry) once `budget`
    seconds have passed since the request's first attempt; None leaves it to botocore."""

    def needs_retry(request_dict: dict[str, Any], **_: Any) -> bool | None:
        started = request_dict.get("context", {}).get(_STARTED)
        if started is not None and time.monotonic() - started >= budget:
            return False
        return None

    return needs_retry
