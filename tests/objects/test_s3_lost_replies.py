"""S3 requests whose replies are lost, refused or late, forced through a relay in front of
SeaweedFS (`http_relay`): the server really runs each request the relay forwards.

A conditional PUT (`put_if_absent`) whose reply is lost was applied, and obstore sends it
again by itself: the copy's 412 must not be reported as another writer's object. One that no
reply ever settles is `OutcomeUnknown`, never a definite answer. A DeleteObjects batch whose
reply is lost is sent again; a key its reply says was not deleted is an error that names it,
never counted as deleted. Throttling and a server that stops answering are `Unavailable`
after bounded retries, saying what to do. A multipart upload whose start was answered twice
leaves an upload no listing shows, which the sweep of abandoned writes discards; one the
server forgets before answering its completion is `OutcomeUnknown` where the key holds an
object, and discarded where it does not, never "not found".
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from branchwater.engine.errors import ConfigurationError, OutcomeUnknown, Unavailable
from branchwater.engine.objects import s3 as s3_module
from branchwater.engine.objects.s3 import S3ObjectStore
from tests.fixtures.s3 import S3Server
from tests.helpers.http_relay import (
    HttpRelay,
    Picks,
    multipart_completion,
    reply,
    request_to,
    s3_error,
)

pytestmark = pytest.mark.s3

RETRIES = s3_module.S3Timeouts().retries
INTERNAL = s3_error(500, "Internal Server Error", "InternalError")


@pytest.fixture
def store(s3_server: S3Server, s3_bucket: str, s3_relay: HttpRelay) -> Iterator[S3ObjectStore]:
    """The S3 driver on a fresh bucket, talking to SeaweedFS through `s3_relay`."""
    opened = S3ObjectStore(
        f"s3://{s3_bucket}", **{**s3_server.options, "endpoint_url": s3_relay.endpoint_url}
    )
    opened.put("warm", b"-")  # credentials and the connection pool, before any rule
    yield opened
    opened.close()


@pytest.fixture
def quick_timeouts(monkeypatch: pytest.MonkeyPatch) -> None:
    """A request unanswered for a second times out; no retry starts after three (set as a
    user would, before the store is made)."""
    monkeypatch.setenv(s3_module.READ_TIMEOUT_ENV, "1")
    monkeypatch.setenv(s3_module.RETRY_TIMEOUT_ENV, "3")


def conditional_put(key: str) -> Picks:
    return request_to("PUT", f"/{key}", "if-none-match")


def sent(s3_relay: HttpRelay, method: str, part: str) -> int:
    """Requests of `method` whose request line holds `part` the relay saw."""
    return sum(
        1
        for r in s3_relay.requests
        if r.startswith(method.encode() + b" ") and part.encode() in r.split(b"\r\n", 1)[0]
    )


def test_a_conditional_put_whose_reply_is_lost_counts_as_written(
    store: S3ObjectStore, s3_relay: HttpRelay
) -> None:
    """The server wrote the object and the reply was cut: obstore sent the PUT again, whose
    412 was reported as "taken" (False) to the very writer that wrote it."""
    s3_relay.cut_reply_to(conditional_put("r1"))

    assert store.put_if_absent("r1", lambda: b"mine") is True
    assert s3_relay.picked == 1 and sent(s3_relay, "PUT", "/r1") == 2
    assert store.get("r1") == b"mine"


def test_another_writers_object_is_still_taken_after_a_lost_reply(
    store: S3ObjectStore, s3_relay: HttpRelay, s3_server: S3Server, s3_bucket: str
) -> None:
    """Settling a 412 by the bytes held keeps the race's answer: a key another writer took
    with other bytes (of the same size, so they are compared) is not this call's write."""
    s3_server.client().put_object(Bucket=s3_bucket, Key="r2", Body=b"theirs")
    s3_relay.cut_reply_to(conditional_put("r2"))

    assert store.put_if_absent("r2", lambda: b"minee!") is False
    assert store.get("r2") == b"theirs"


def test_a_key_holding_these_bytes_under_an_etag_other_than_their_md5_counts_as_written(
    store: S3ObjectStore, s3_server: S3Server, s3_bucket: str
) -> None:
    """A multipart object's ETag is no MD5 of its bytes (nor is one under KMS keys on AWS):
    the bytes themselves are compared."""
    body = bytes(range(256)) * (24 << 10)  # 6 MiB: two parts, and one conditional PUT
    client = s3_server.client()
    upload = client.create_multipart_upload(Bucket=s3_bucket, Key="r3")["UploadId"]
    parts = [
        {
            "PartNumber": n,
            "ETag": client.upload_part(
                Bucket=s3_bucket, Key="r3", UploadId=upload, PartNumber=n, Body=chunk
            )["ETag"],
        }
        for n, chunk in ((1, body[: 5 << 20]), (2, body[5 << 20 :]))
    ]
    client.complete_multipart_upload(
        Bucket=s3_bucket, Key="r3", UploadId=upload, MultipartUpload={"Parts": parts}
    )
    assert "-" in store.stat("r3").etag  # type: ignore[operator]

    assert store.put_if_absent("r3", lambda: body) is True
    assert store.put_if_absent("r3", lambda: body[:-1] + b"x") is False


def test_a_conditional_put_whose_reply_stays_lost_is_outcome_unknown(
    store: S3ObjectStore, s3_relay: HttpRelay
) -> None:
    """Every reply cut, obstore's resends and this call's own: the object was written, and
    the call must not say it was not (it said `Unavailable`, as for a server not reached).
    The next call, answered, finds these bytes and counts them as written."""
    s3_relay.cut_reply_to(conditional_put("r4"), times=100)

    with pytest.raises(OutcomeUnknown, match="may or may not have been applied"):
        store.put_if_absent("r4", lambda: b"mine")
    assert sent(s3_relay, "PUT", "/r4") == 2 * (RETRIES + 1)

    s3_relay.clear()
    assert store.put_if_absent("r4", lambda: b"mine") is True
    assert store.get("r4") == b"mine"


def test_a_conditional_put_answered_with_5xx_after_it_ran_is_settled_by_sending_it_again(
    store: S3ObjectStore, s3_relay: HttpRelay
) -> None:
    """The first PUT ran and its reply was cut; obstore's resends all met a 500. The PUT
    may have run: sent once more, its 412 and the bytes held settle it."""
    s3_relay.cut_reply_to(conditional_put("r5"))
    s3_relay.answer(conditional_put("r5"), INTERNAL, times=RETRIES)

    assert store.put_if_absent("r5", lambda: b"mine") is True
    assert sent(s3_relay, "PUT", "/r5") == RETRIES + 2


@pytest.mark.usefixtures("quick_timeouts")
def test_a_conditional_put_that_times_out_after_it_ran_is_settled_by_sending_it_again(
    store: S3ObjectStore, s3_relay: HttpRelay
) -> None:
    """The server took the PUT and never answered: obstore does not send a conditional
    PUT again after a timeout, and the call said `Unavailable` for an object it wrote."""
    s3_relay.stall(conditional_put("r6"))

    assert store.put_if_absent("r6", lambda: b"mine") is True
    assert store.get("r6") == b"mine"


def test_a_throttled_conditional_put_is_unavailable_saying_so(
    store: S3ObjectStore, s3_relay: HttpRelay
) -> None:
    """Throttling refuses a request before it runs: `Unavailable` saying what to do, after
    obstore's bounded retries, with nothing written and nothing sent again blindly."""
    s3_relay.answer(conditional_put("r7"), s3_error(503, "Slow Down", "SlowDown"), times=100)

    started = time.monotonic()
    with pytest.raises(Unavailable, match=r"throttling requests.*SlowDown.*fewer tasks") as error:
        store.put_if_absent("r7", lambda: b"mine")
    assert not isinstance(error.value, OutcomeUnknown)
    assert time.monotonic() - started < 30
    assert sent(s3_relay, "PUT", "/r7") == RETRIES + 1
    s3_relay.clear()
    assert not store.exists("r7")


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (s3_error(503, "Slow Down", "SlowDown"), "throttling requests.*fewer tasks"),
        (s3_error(429, "Too Many Requests", "TooManyRequests"), "throttling requests"),
        (INTERNAL, r"unavailable \(500 InternalError\).*try again later"),
    ],
    ids=["503-slowdown", "429", "500"],
)
def test_a_server_refusing_for_good_is_unavailable_after_bounded_retries(
    store: S3ObjectStore, s3_relay: HttpRelay, answer: bytes, says: str
) -> None:
    """A 429 was "rejected the request", an untyped `BranchwaterError`."""
    s3_relay.answer(request_to("PUT", "/t1"), answer, times=100)

    started = time.monotonic()
    with pytest.raises(Unavailable, match=says):
        store.put("t1", b"data")
    assert time.monotonic() - started < 30
    assert sent(s3_relay, "PUT", "/t1") == RETRIES + 1


@pytest.mark.usefixtures("quick_timeouts")
def test_a_server_that_stops_answering_is_unavailable_without_hanging(
    store: S3ObjectStore, s3_relay: HttpRelay
) -> None:
    s3_relay.stall(request_to("GET", "/warm"), times=100)

    started = time.monotonic()
    with pytest.raises(Unavailable, match="cannot reach"):
        store.get("warm")
    assert time.monotonic() - started < 15


@pytest.mark.usefixtures("quick_timeouts")
def test_a_server_that_stops_answering_the_boto3_fallback_is_unavailable_within_its_bound(
    store: S3ObjectStore, s3_relay: HttpRelay
) -> None:
    """A key obstore cannot address goes through boto3, which waited 60 s a read and tried
    five times (five minutes); it now keeps the store's timeouts and retry budget (1 s
    reads, no retry after 3 s here), so it gives up after about 3 + 1 s, having retried:
    each attempt waits out its 1 s read, so no fourth one starts."""
    s3_relay.stall(request_to("HEAD", "/odd"), times=100)

    started = time.monotonic()
    with pytest.raises(Unavailable, match=r"cannot reach S3 object store .*try again later"):
        store.stat("odd\x01key")
    assert time.monotonic() - started < 10
    assert 2 <= sent(s3_relay, "HEAD", "/odd") <= 3 < RETRIES + 1


@pytest.mark.parametrize("value", ["soon", "0", "-1", "inf", "nan"])
def test_a_timeout_setting_that_is_no_positive_number_is_refused_naming_it(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(s3_module.READ_TIMEOUT_ENV, value)
    with pytest.raises(ConfigurationError, match=rf"\$BRANCHWATER_S3_READ_TIMEOUT .*{value!r}"):
        S3ObjectStore("s3://bucket")


def test_a_delete_batch_whose_reply_is_lost_is_sent_again(
    store: S3ObjectStore, s3_relay: HttpRelay
) -> None:
    for key in ("d1", "d2"):
        store.put(key, b"x")
    s3_relay.cut_reply_to(request_to("POST", "?delete"))

    store.delete(["d1", "d2"])
    assert sent(s3_relay, "POST", "?delete") == 2
    assert not store.exists("d1") and not store.exists("d2")


def delete_result(failed: str, code: str, *deleted: str) -> bytes:
    body = "".join(f"<Deleted><Key>{key}</Key></Deleted>" for key in deleted)
    body += f"<Error><Key>{failed}</Key><Code>{code}</Code><Message>refused</Message></Error>"
    return reply(200, "OK", f"<DeleteResult>{body}</DeleteResult>")


def test_a_key_a_delete_batch_could_not_delete_is_unavailable_naming_it(
    store: S3ObjectStore, s3_relay: HttpRelay
) -> None:
    """The reply lists a key as not deleted, to obstore and then to the batch sent again:
    the error counts and names it (it was an untyped "rejected the request"), so GC cannot
    count it as deleted, and the key is still there."""
    for key in ("d3", "d4"):
        store.put(key, b"x")
    s3_relay.answer(request_to("POST", "?delete"), delete_result("d4", "AccessDenied", "d3"), 2)

    with pytest.raises(Unavailable, match=r"could not delete 1 of 2 .*'d4'.*AccessDenied"):
        store.delete(["d3", "d4"])
    assert store.exists("d4")


def test_a_key_a_delete_batch_failed_once_is_deleted_by_sending_the_batch_again(
    store: S3ObjectStore, s3_relay: HttpRelay
) -> None:
    for key in ("d5", "d6"):
        store.put(key, b"x")
    s3_relay.answer(request_to("POST", "?delete"), delete_result("d6", "AccessDenied", "d5"))

    store.delete(["d5", "d6"])
    assert not store.exists("d5") and not store.exists("d6")


def test_a_delete_batch_reporting_an_absent_key_as_missing_is_no_error(
    store: S3ObjectStore, s3_relay: HttpRelay
) -> None:
    """Some S3-compatible servers say `NoSuchKey` for an absent key, where AWS says it was
    deleted: absent keys are no error (`ObjectStore.delete`), yet obstore raised."""
    store.put("d7", b"x")
    s3_relay.answer(request_to("POST", "?delete"), delete_result("gone", "NoSuchKey", "d7"), 2)

    store.delete(["d7", "gone"])


def test_an_upload_whose_start_was_answered_twice_is_discarded_by_the_sweep(
    store: S3ObjectStore, s3_relay: HttpRelay, s3_server: S3Server, s3_bucket: str
) -> None:
    """CreateMultipartUpload's reply cut: obstore asks again and uploads under the second
    id, and the first stays open with no part, which no listing shows. The object is whole;
    the sweep of abandoned writes is what reclaims the first (its cutoff leaves room for the
    longest upload, so it cannot abort it at once)."""
    s3_relay.cut_reply_to(request_to("POST", "?uploads"))
    body = bytes(s3_module.PART_SIZE + 1)

    store.put_stream("m1", [body])

    assert sent(s3_relay, "POST", "?uploads") == 2
    assert store.get("m1") == body
    open_uploads = s3_server.client().list_multipart_uploads(Bucket=s3_bucket).get("Uploads", [])
    assert [u["Key"] for u in open_uploads] == ["m1"]
    later = datetime.now(UTC) + timedelta(minutes=1)
    assert store.discard_abandoned_writes("", later).writes == 1
    assert store.get("m1") == body


def test_an_upload_whose_completion_reply_is_lost_and_then_forgotten_is_outcome_unknown(
    store: S3ObjectStore, s3_relay: HttpRelay
) -> None:
    """The completion ran and its reply was cut; the server answers the one obstore sent
    again with NoSuchUpload, as a server that forgets completed uploads does. The object is
    there, and the write said "object not found" (`NotFound`)."""
    s3_relay.cut_reply_to(multipart_completion)
    s3_relay.answer(multipart_completion, s3_error(404, "Not Found", "NoSuchUpload"))
    body = bytes(s3_module.PART_SIZE + 1)

    with pytest.raises(OutcomeUnknown, match="may or may not have completed"):
        store.put_stream("m3", [body])
    assert store.get("m3") == body


def test_an_upload_the_sweep_aborts_under_way_says_it_was_discarded(
    store: S3ObjectStore, s3_relay: HttpRelay, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep of abandoned writes aborts an upload still under way: it publishes nothing,
    and said "object not found" (`NotFound`) for a write."""
    monkeypatch.setattr(s3_module, "STREAM_PART", s3_module.PART_SIZE)

    def chunks() -> Iterator[bytes]:
        yield bytes(s3_module.PART_SIZE)
        yield bytes(s3_module.PART_SIZE)
        deadline = time.monotonic() + 30
        while not sent(s3_relay, "PUT", "partNumber=1") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (
            store.discard_abandoned_writes("", datetime.now(UTC) + timedelta(minutes=1)).writes == 1
        )
        yield bytes(s3_module.PART_SIZE)

    with pytest.raises(Unavailable, match="aborted before it completed") as error:
        store.put_stream("m4", chunks())
    assert not isinstance(error.value, OutcomeUnknown)
    assert not store.exists("m4")


def test_a_part_that_fails_for_good_aborts_the_upload(
    store: S3ObjectStore, s3_relay: HttpRelay, s3_server: S3Server, s3_bucket: str
) -> None:
    """The last part failed after the stream ended, every retry with a 500: the upload is
    aborted, no object and no open upload."""
    s3_relay.answer(request_to("PUT", "partNumber=2"), INTERNAL, times=100)

    with pytest.raises(Unavailable, match="500 InternalError"):
        store.put_stream("m2", [bytes(s3_module.PART_SIZE + 1)])

    assert not store.exists("m2")
    assert not s3_server.client().list_multipart_uploads(Bucket=s3_bucket).get("Uploads")


SLOW_DOWN = s3_error(503, "Slow Down", "SlowDown")


@pytest.mark.parametrize("answer", [SLOW_DOWN, INTERNAL], ids=["throttled", "5xx"])
def test_the_boto3_requests_refused_by_an_overloaded_server_are_unavailable(
    store: S3ObjectStore, s3_relay: HttpRelay, answer: bytes
) -> None:
    """A server-side copy and the listing of open uploads go through boto3: throttling and
    5xx after its retries are `Unavailable` saying what to do, as obstore's requests are."""
    store.put("src", b"x" * 100)
    s3_relay.answer(request_to("PUT", "/dst", "x-amz-copy-source"), answer, 100)
    s3_relay.answer(request_to("GET", "?uploads"), answer, 100)
    with pytest.raises(Unavailable, match="try again later"):
        store.copy("src", "dst")
    with pytest.raises(Unavailable, match="try again later"):
        store.discard_abandoned_writes("", datetime.now(UTC))
    assert not store.exists("dst")
