"""A process forked after S3 requests: obstore's runtime, started by the parent's first
request, has no threads in the child, where a request would wait for ever."""

from __future__ import annotations

from typing import Any

import pytest

from branchwater.engine.errors import ConfigurationError
from branchwater.engine.objects.s3 import S3ObjectStore, S3Timeouts
from branchwater.engine.objects.s3_fallback import Boto3Keys
from tests.fixtures.s3 import S3Server
from tests.helpers.servers import child_answer

pytestmark = pytest.mark.s3


def _put_in_child(url: str, options: dict[str, str], answers: Any) -> None:
    """A request through a store of the child's own."""
    store = S3ObjectStore(url, **options)
    try:
        store.put_stream("child", [b"2"])
        answers.put("written")
    except ConfigurationError as exc:
        answers.put(str(exc))


def test_a_child_forked_after_s3_requests_is_told_to_spawn(
    s3_server: S3Server, s3_store: S3ObjectStore
) -> None:
    s3_store.put_stream("parent", [b"1"])
    answer = child_answer(_put_in_child, s3_store.url, s3_server.options)
    assert "was forked from process" in answer and "'spawn'" in answer
    assert s3_store.get("parent") == b"1"
    assert s3_store.exists("child") is False


def test_a_spawned_child_uses_s3(s3_server: S3Server, s3_store: S3ObjectStore) -> None:
    s3_store.put_stream("parent", [b"1"])
    answer = child_answer(_put_in_child, s3_store.url, s3_server.options, method="spawn")
    assert answer == "written"
    assert s3_store.get("child") == b"2"


def _fallback_client_in_child(keys: Boto3Keys, inherited: Any, answers: Any) -> None:
    answers.put(keys.client is not inherited)


def test_the_boto3_fallback_makes_a_client_of_its_own_in_a_forked_child(
    s3_server: S3Server, s3_bucket: str
) -> None:
    """Keys obstore cannot address go through boto3, whose pooled connections are the
    parent's sockets in a child."""
    keys = Boto3Keys(f"s3://{s3_bucket}", s3_bucket, "", dict(s3_server.options), S3Timeouts())
    inherited = keys.client
    assert child_answer(_fallback_client_in_child, keys, inherited) is True
    assert keys.client is inherited
