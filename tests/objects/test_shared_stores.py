"""`shared_object_store`: one open store per URL, options and process, for code that runs many
short tasks in one process (Spark's Python workers)."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

from branchwater.engine.objects import shared_object_store
from tests.fixtures.s3 import S3Server


def test_one_store_per_url_and_options(tmp_path: Path, s3_server: S3Server, s3_bucket: str) -> None:
    url = f"s3://{s3_bucket}/shared"
    store = shared_object_store(url, **s3_server.options)
    assert shared_object_store(url, **s3_server.options) is store
    assert shared_object_store(url, **s3_server.options, aws_session_token=None) is store
    other = shared_object_store(url, **{**s3_server.options, "region_name": "eu-west-1"})
    assert other is not store
    assert shared_object_store(f"s3://{s3_bucket}/elsewhere", **s3_server.options) is not store
    store.put("a", b"a")
    assert shared_object_store(url, **s3_server.options).get("a") == b"a"
    local = shared_object_store(f"file://{tmp_path}")
    assert local is shared_object_store(f"file://{tmp_path}") and local is not store


def _opened_in_child(url: str, inherited: int, answer: mp.Queue) -> None:
    answer.put(id(shared_object_store(url)) != inherited)


def test_a_forked_child_opens_its_own(tmp_path: Path) -> None:
    """Clients and their connection pools do not survive a fork: the child must not be
    handed the store its parent opened."""
    url = f"file://{tmp_path}"
    inherited = id(shared_object_store(url))
    context = mp.get_context("fork")
    answer = context.Queue()
    child = context.Process(target=_opened_in_child, args=(url, inherited, answer))
    child.start()
    try:
        assert answer.get(timeout=60) is True
    finally:
        child.join(60)
        if child.is_alive():
            child.kill()
    assert child.exitcode == 0
