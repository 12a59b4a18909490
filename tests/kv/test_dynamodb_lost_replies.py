"""DynamoDB requests whose reply is lost after the server applied them, and throttling.

A conditional write (`set_if`, `delete_if`) that reached DynamoDB and was applied, but whose
reply never came back (a read timeout, a connection reset, a 500), must not be sent again:
the retry would find its own write and report `PredicateFailed`, a definite failure for a
write that landed (a commit would then unlist the tokens it let go of and report that a
concurrent commit recorded its changes). It raises `OutcomeUnknown`: the write may have
been applied. A throttled request was refused, so it is tried again within a bound.

moto applies each request here; `before-send` handlers, which botocore runs inside its
retry loop, stand in for the network: they forward a request to moto and then lose the
reply, or answer for DynamoDB where moto never refuses (throttling, cancellation reasons).
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from botocore.awsrequest import AWSPreparedRequest, AWSResponse
from botocore.exceptions import ConnectionClosedError, ReadTimeoutError

from branchwater.engine import Lake, NoChanges, failpoints
from branchwater.engine.errors import InvalidArgument, OutcomeUnknown, PredicateFailed, Unavailable
from branchwater.engine.kv import EXISTS
from branchwater.engine.kv.dynamodb import (
    MAX_ATTEMPTS,
    TRANSACTION_TRIES,
    WRITE_TRIES,
    DynamoDBStore,
)
from tests.helpers.servers import unique_name
from tests.helpers.views import committed
from tests.kv.conftest import GUARD

pytestmark = pytest.mark.s3

FAILURES = ["read-timeout", "connection-reset", "internal-error"]


@pytest.fixture
def store(dynamodb_store: DynamoDBStore) -> DynamoDBStore:
    dynamodb_store.set(b"p", b"k", b"old")
    return dynamodb_store


class _Body:
    """The raw body of a response made here (what `AWSResponse.content` reads)."""

    def __init__(self, body: bytes) -> None:
        self._body = body

    def stream(self, **_: Any) -> Iterator[bytes]:
        yield self._body


def _reply(request: AWSPreparedRequest, status: int, body: dict[str, Any]) -> AWSResponse:
    headers = {"x-amzn-RequestId": "test", "Content-Type": "application/x-amz-json-1.0"}
    return AWSResponse(request.url, status, headers, _Body(json.dumps(body).encode()))


def _answering(
    store: DynamoDBStore, operation: str, answer: Callable[[AWSPreparedRequest, Any], Any]
) -> list[int]:
    """Route every `operation` request of the store's clients through `answer(request,
    endpoint)`; returns the count of requests sent, which the list's one item tracks."""
    sent = [0]
    for client in (store._client, store._once_client):
        endpoint = client._endpoint

        def handler(request: AWSPreparedRequest, endpoint: Any = endpoint, **_: Any) -> Any:
            sent[0] += 1
            return answer(request, endpoint)

        client.meta.events.register(f"before-send.dynamodb.{operation}", handler)
    return sent


def lose_first_reply(store: DynamoDBStore, operation: str, failure: str) -> list[int]:
    """The first `operation` request reaches moto and is applied; its reply is lost."""

    def answer(request: AWSPreparedRequest, endpoint: Any) -> AWSResponse | None:
        if answered[0]:
            return None
        answered[0] = True
        endpoint.http_session.send(request)
        if failure == "read-timeout":
            raise ReadTimeoutError(endpoint_url=request.url)
        if failure == "connection-reset":
            raise ConnectionClosedError(endpoint_url=request.url)
        error = {"__type": "com.amazonaws.dynamodb.v20120810#InternalServerError"}
        return _reply(request, 500, {**error, "message": "Internal server error"})

    answered = [False]
    return _answering(store, operation, answer)


Write = Callable[[DynamoDBStore], object]
CONDITIONAL: dict[str, tuple[str, Write, bytes | None]] = {
    "create": ("PutItem", lambda s: s.set_if(b"p", b"new", b"ours", None), b"ours"),
    "replace": ("PutItem", lambda s: s.set_if(b"p", b"k", b"ours", EXISTS), b"ours"),
    "swap": ("PutItem", lambda s: s.set_if(b"p", b"k", b"ours", b"old"), b"ours"),
    "delete_if": ("DeleteItem", lambda s: s.delete_if(b"p", b"k", b"old"), None),
}


def _stored(store: DynamoDBStore, write: str) -> bytes | None:
    key = b"new" if write == "create" else b"k"
    return dict(store.scan(b"p")).get(key)


@pytest.mark.parametrize("failure", FAILURES)
@pytest.mark.parametrize("write", CONDITIONAL)
def test_a_conditional_write_whose_reply_was_lost_is_unknown_not_failed(
    store: DynamoDBStore, write: str, failure: str
) -> None:
    """Applied, reply lost: `OutcomeUnknown`, never a
    `PredicateFailed` from sending it again (which botocore's retries did)."""
    operation, run, applied = CONDITIONAL[write]
    sent = lose_first_reply(store, operation, failure)
    with pytest.raises(BaseException) as caught:
        run(store)
    assert not isinstance(caught.value, PredicateFailed), "a landed write reported as failed"
    assert isinstance(caught.value, OutcomeUnknown), caught.value
    assert "may or may not have been applied" in str(caught.value)
    assert sent[0] == 1, "a conditional write was sent again"
    assert _stored(store, write) == applied


@pytest.mark.parametrize("failure", FAILURES)
@pytest.mark.parametrize("step", ["create", "delete"])
def test_a_guarded_step_whose_reply_was_lost_is_resent_as_itself(
    store: DynamoDBStore, step: str, failure: str
) -> None:
    """A guarded step's transaction carries an idempotency token, so sending it again is
    safe: DynamoDB answers the repeat with the first one's success. (moto does not keep
    tokens, so its repeat of the creation finds the row; what matters here is that the
    repeat is the same request, token and all.)"""
    tokens: list[str] = []

    def answer(request: AWSPreparedRequest, endpoint: Any) -> AWSResponse | None:
        tokens.append(json.loads(request.body)["ClientRequestToken"])
        if len(tokens) > 1:
            return None
        endpoint.http_session.send(request)
        raise ReadTimeoutError(endpoint_url=request.url)

    _answering(store, "TransactWriteItems", answer)
    if step == "delete":
        store.set(b"staging", b"row", b"v")
        assert store.delete_guarded(b"staging", b"row", GUARD, b"record") is True
    else:
        store.create_guarded(b"staging", b"row", b"v", GUARD, b"record")
    assert len(tokens) == 2 and tokens[0] == tokens[1]


def test_a_guarded_step_whose_every_reply_was_lost_is_unknown(store: DynamoDBStore) -> None:
    """Once botocore's retries are spent, each sent with the first one's token, the
    outcome is unknown: `OutcomeUnknown`, not a plain outage."""
    tokens: list[str] = []

    def answer(request: AWSPreparedRequest, endpoint: Any) -> AWSResponse | None:
        tokens.append(json.loads(request.body)["ClientRequestToken"])
        endpoint.http_session.send(request)
        raise ConnectionClosedError(endpoint_url=request.url)

    _answering(store, "TransactWriteItems", answer)
    with pytest.raises(OutcomeUnknown, match="may or may not have been applied"):
        store.create_guarded(b"staging", b"row", b"v", GUARD, b"record")
    assert len(tokens) == MAX_ATTEMPTS + 1 and len(set(tokens)) == 1
    assert dict(store.scan(b"staging")) == {b"row": b"v"}


THROTTLED = {
    "__type": "com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",
    "message": "The level of configured provisioned throughput for the table was exceeded.",
}


def throttle(store: DynamoDBStore, operation: str, times: int) -> list[int]:
    """Refuse the next `times` `operation` requests as DynamoDB throttles them."""

    def answer(request: AWSPreparedRequest, _: Any) -> AWSResponse | None:
        return _reply(request, 400, THROTTLED) if sent[0] <= times else None

    sent = _answering(store, operation, answer)
    return sent


@pytest.mark.parametrize("write", CONDITIONAL)
def test_a_throttled_conditional_write_is_tried_again(store: DynamoDBStore, write: str) -> None:
    operation, run, applied = CONDITIONAL[write]
    sent = throttle(store, operation, WRITE_TRIES - 1)
    run(store)
    assert sent[0] == WRITE_TRIES
    assert _stored(store, write) == applied


@pytest.mark.parametrize("write", CONDITIONAL)
def test_a_conditional_write_throttled_every_time_is_unavailable_and_writes_nothing(
    store: DynamoDBStore, write: str
) -> None:
    operation, run, _ = CONDITIONAL[write]
    sent = throttle(store, operation, WRITE_TRIES)
    with pytest.raises(Unavailable, match="ProvisionedThroughputExceeded"):
        run(store)
    assert sent[0] == WRITE_TRIES
    assert _stored(store, write) == (None if write == "create" else b"old")


def cancel(store: DynamoDBStore, reason: str, times: int) -> list[int]:
    """Cancel the next `times` transactions, their guard check for `reason`."""
    cancelled = {
        "__type": "com.amazonaws.dynamodb.v20120810#TransactionCanceledException",
        "message": f"Transaction cancelled, please refer cancellation reasons [{reason}, None]",
        "CancellationReasons": [{"Code": reason}, {"Code": "None"}],
    }

    def answer(request: AWSPreparedRequest, _: Any) -> AWSResponse | None:
        return _reply(request, 400, cancelled) if sent[0] <= times else None

    sent = _answering(store, "TransactWriteItems", answer)
    return sent


@pytest.mark.parametrize("reason", ["ThrottlingError", "ProvisionedThroughputExceeded"])
def test_a_guarded_step_cancelled_for_throttling_is_tried_again(
    store: DynamoDBStore, reason: str
) -> None:
    """Throttling cancels a transaction having written nothing, as a conflict does."""
    sent = cancel(store, reason, TRANSACTION_TRIES - 1)
    assert store.create_guarded(b"staging", b"row", b"v", GUARD, b"record") is True
    assert sent[0] == TRANSACTION_TRIES
    assert dict(store.scan(b"staging")) == {b"row": b"v"}


def test_a_guarded_step_cancelled_as_invalid_is_an_invalid_argument(
    store: DynamoDBStore,
) -> None:
    """Cancelled for a `ValidationError` (an item over 400 KB, say): no retry helps, so it
    is the caller's `InvalidArgument`, as the same refusal of a `PutItem` is."""
    sent = cancel(store, "ValidationError", TRANSACTION_TRIES)
    with pytest.raises(InvalidArgument):
        store.create_guarded(b"staging", b"row", b"v", GUARD, b"record")
    assert sent[0] == 1
    assert list(store.scan(b"staging")) == []


def test_a_commit_whose_branch_swap_reply_was_lost_has_landed_once(
    dynamodb_endpoint: str, tmp_path: Path
) -> None:
    """The lake's view of a lost reply: the commit's last `set_if` applied, its reply lost.
    Sent again, it failed its condition; the commit took that for a lost race, unlisted the
    token it had let go of (never dropped after) and reported `AlreadyRecorded`, saying
    nothing of its message was recorded, naming its own commit. Now it reads the branch,
    finds its record and succeeds; the next commit finds nothing to record, and the token is
    dropped."""
    url = f"dynamodb://{unique_name('lake-')}?endpoint_url={dynamodb_endpoint}&region=us-east-1"
    with Lake.connect(url) as lake:
        repo = lake.create_repository("lost", storage_namespace=f"file://{tmp_path}/ns")
        main = repo.branch("main")
        main.upload("a", b"a")
        before = main.head().id
        record = lake.graveler.refs.get_repository("lost")
        token = lake.graveler.read_branch(record, "main").staging_token
        store = lake.graveler.kv
        assert isinstance(store, DynamoDBStore)

        def arm() -> None:
            current = store.get(record.partition, b"branches/main").value
            expected = base64.b64encode(current).decode()

            def answer(request: AWSPreparedRequest, endpoint: Any) -> AWSResponse | None:
                if cut[0] or expected not in request.body.decode():
                    return None
                cut[0] = True
                endpoint.http_session.send(request)
                raise ReadTimeoutError(endpoint_url=request.url)

            _answering(store, "PutItem", answer)

        cut = [False]
        with failpoints.armed("commit.before_set", arm):
            landed = main.commit("a")
        assert cut[0]
        assert main.head() == landed
        assert landed.parents == (before,) and landed.message == "a"
        assert committed(repo, "main") == ["a"]
        with pytest.raises(NoChanges) as again:
            main.commit("a")
        assert type(again.value) is NoChanges, again.value
        assert lake.wait_for_cleanup(30)
        lake.graveler.collect_dropped_partitions()
        assert list(store.scan(token.encode())) == [], "the landed commit's token was kept"
