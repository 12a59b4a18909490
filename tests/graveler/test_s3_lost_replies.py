"""Engine writes to S3 whose replies are lost, through a relay in front of SeaweedFS
(`s3_relay`): a commit's range, an upload's or a deep copy's completion. Nothing refers to
such an object yet, so the write that needed it has recorded nothing: `Unavailable` (try
again), never the store's `OutcomeUnknown`, whose "read the key" no caller of a commit, an
upload or a copy can act on.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from branchwater.engine import Lake, NotFound, OutcomeUnknown, Unavailable
from branchwater.engine.api import Repository
from branchwater.engine.objects import s3 as s3_module
from tests.fixtures.s3 import S3Server
from tests.helpers.http_relay import HttpRelay, multipart_completion, request_to, s3_error

pytestmark = pytest.mark.s3

RANGE_PUT = request_to("PUT", "/_branchwater/ranges/")


@pytest.fixture
def repo(
    s3_server: S3Server, s3_bucket: str, s3_relay: HttpRelay, tmp_path: Path
) -> Iterator[Repository]:
    options = {**s3_server.options, "endpoint_url": s3_relay.endpoint_url}
    with Lake.connect(f"sqlite:///{tmp_path}/kv.db", s3_options=options) as lake:
        yield lake.create_repository("sales", storage_namespace=f"s3://{s3_bucket}/sales")


def test_a_commit_whose_range_replies_are_lost_records_nothing_and_says_try_again(
    repo: Repository, s3_relay: HttpRelay
) -> None:
    main = repo.branch("main")
    main.upload("a", b"a")
    before = main.head().id
    s3_relay.cut_reply_to(RANGE_PUT, times=100)
    with pytest.raises(Unavailable, match=r"nothing was recorded.*try again") as failed:
        main.commit("a")
    assert not isinstance(failed.value, OutcomeUnknown)
    assert main.head().id == before
    s3_relay.clear()
    assert main.commit("a").parents == (before,)
    assert [e.path for e in repo.ref("main").list()] == ["a"]


def test_an_upload_whose_completion_is_lost_stages_nothing_and_says_upload_again(
    repo: Repository, s3_relay: HttpRelay
) -> None:
    s3_relay.cut_reply_to(multipart_completion)
    s3_relay.answer(multipart_completion, s3_error(404, "Not Found", "NoSuchUpload"))
    main = repo.branch("main")
    with pytest.raises(Unavailable, match="nothing was staged: upload it again") as failed:
        main.upload("big", bytes(s3_module.PART_SIZE + 1))
    assert not isinstance(failed.value, OutcomeUnknown)
    assert list(main.uncommitted()) == []


def test_a_deep_copy_whose_completion_is_lost_stages_nothing_and_says_copy_again(
    repo: Repository, s3_relay: HttpRelay
) -> None:
    """Copying a committed object writes it anew, as an upload does (`write_fresh`)."""
    main = repo.branch("main")
    main.upload("big", bytes(s3_module.PART_SIZE + 1))
    main.commit("big")
    s3_relay.cut_reply_to(multipart_completion)
    s3_relay.answer(multipart_completion, s3_error(404, "Not Found", "NoSuchUpload"))
    says = r"copying 'big' to 'copy' .* got no reply, so nothing was staged: copy it again"
    with pytest.raises(Unavailable, match=says) as failed:
        main.copy("big", "copy")
    assert not isinstance(failed.value, OutcomeUnknown)
    assert list(main.uncommitted()) == []
    with pytest.raises(NotFound):
        main.stat("copy")
    s3_relay.clear()
    assert main.copy("big", "copy").size == s3_module.PART_SIZE + 1
