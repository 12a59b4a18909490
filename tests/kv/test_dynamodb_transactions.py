"""DynamoDB cancels a guarded step's transaction that meets a concurrent request on one of
its items (`TransactionConflict`, which moto never reports, so it is answered here in its
place): the step is tried again rather than reported as a failed guard or an outage."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse

from branchwater.engine.errors import Unavailable
from branchwater.engine.kv.dynamodb import TRANSACTION_TRIES, DynamoDBStore
from tests.kv.conftest import GUARD

pytestmark = pytest.mark.s3

CANCELLED = {
    "Error": {
        "Code": "TransactionCanceledException",
        "Message": "Transaction cancelled [None, TransactionConflict]",
    },
    "CancellationReasons": [{"Code": "None"}, {"Code": "TransactionConflict"}],
    "ResponseMetadata": {"HTTPStatusCode": 400},
}


@pytest.fixture
def store(dynamodb_store: DynamoDBStore) -> DynamoDBStore:
    return dynamodb_store


def conflicting(store: DynamoDBStore, times: int) -> list[int]:
    """Answer the next `times` transactions with DynamoDB's cancellation for a conflict;
    returns the count of transactions sent, which the list's one item tracks."""
    sent = [0]

    def answer(**_: Any) -> tuple[AWSResponse, dict[str, Any]] | None:
        sent[0] += 1
        if sent[0] > times:
            return None
        return AWSResponse("", 400, {}, None), CANCELLED

    store._client.meta.events.register("before-call.dynamodb.TransactWriteItems", answer)
    return sent


Step = Callable[[DynamoDBStore], bool]
STEPS: dict[str, Step] = {
    "create": lambda s: s.create_guarded(b"staging", b"p", b"v", GUARD, b"record"),
    "delete": lambda s: s.delete_guarded(b"staging", b"p", GUARD, b"record"),
}


@pytest.mark.parametrize("step", STEPS)
def test_a_transaction_cancelled_for_a_conflict_is_tried_again(
    store: DynamoDBStore, step: str
) -> None:
    if step == "delete":
        store.set(b"staging", b"p", b"v")
    sent = conflicting(store, TRANSACTION_TRIES - 1)
    assert STEPS[step](store) is True
    assert sent[0] == TRANSACTION_TRIES
    held = [value for _, value in store.scan(b"staging")]
    assert held == ([b"v"] if step == "create" else [])


@pytest.mark.parametrize("step", STEPS)
def test_a_conflict_that_does_not_pass_is_an_outage_and_writes_nothing(
    store: DynamoDBStore, step: str
) -> None:
    sent = conflicting(store, TRANSACTION_TRIES)
    with pytest.raises(Unavailable, match="conflicting requests"):
        STEPS[step](store)
    assert sent[0] == TRANSACTION_TRIES
    assert list(store.scan(b"staging")) == []
