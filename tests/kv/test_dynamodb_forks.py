"""A DynamoDB store used before a fork: the child makes its own client, since the inherited
one's pooled connections are its parent's sockets (a reply read by the wrong process would
answer another's request). moto's server closes every connection after its reply, so the
mix-up itself cannot happen here; the test checks which client each process uses."""

from __future__ import annotations

from typing import Any

import pytest

from branchwater.engine.kv import open_store
from branchwater.engine.kv.dynamodb import DynamoDBStore
from tests.helpers.servers import child_answer, unique_name

pytestmark = pytest.mark.s3


def _in_child(store: DynamoDBStore, inherited: Any, answers: Any) -> None:
    try:
        store.set(b"fork", b"child", b"written by child")
        answers.put((store._client is not inherited, store.get(b"fork", b"parent").value))
    except Exception as exc:
        answers.put((False, repr(exc)))


def test_a_forked_child_uses_a_client_of_its_own(dynamodb_endpoint: str) -> None:
    url = f"dynamodb://{unique_name('kv-')}?endpoint_url={dynamodb_endpoint}&region=us-east-1"
    with open_store(url) as store:
        assert isinstance(store, DynamoDBStore)
        store.set(b"fork", b"parent", b"written by parent")
        parent_client = store._client
        answer = child_answer(_in_child, store, parent_client)
        assert answer == (True, b"written by parent")
        assert store._client is parent_client
        assert store.get(b"fork", b"child").value == b"written by child"
