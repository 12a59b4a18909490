"""Identity is content: rewrites of equal bytes change nothing, anywhere a change is counted."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from branchwater.engine import Lake, NoChanges
from branchwater.engine.graveler.committed import RangePolicy
from branchwater.engine.graveler.graveler import RetryPolicy
from branchwater.engine.graveler.model import Entry
from branchwater.engine.graveler.writes import stage_entry


@pytest.fixture
def lake() -> Lake:
    policy = RangePolicy(target_entries=4, max_entries=16)
    with Lake.connect("memory://", range_policy=policy, retry=RetryPolicy(base_delay=0)) as lake:
        yield lake


@pytest.fixture
def repo(lake: Lake, tmp_path: Path):
    return lake.create_repository("identity", storage_namespace=f"file://{tmp_path}/ns")


def data_objects(lake: Lake, repo) -> list[str]:
    objects = lake.graveler.objects(repo.storage_namespace)
    return [info.key for info in objects.list_objects("data/")]


def rewrite(lake: Lake, repo, branch: str, path: str) -> Entry:
    """Stage what `branch` shows at `path` again at a new address: what a writer that does not
    compare content first (an older engine, a link of the same bytes) leaves behind."""
    current = repo.branch(branch).stat(path)
    again = current._replace(address=f"{current.address}-again")
    stage_entry(lake.graveler, repo.record, branch, again)
    return again


# --- uploads ----------------------------------------------------------------------------


def test_upload_checksum_is_sha256(repo) -> None:
    entry = repo.branch("main").upload("a", b"abc")
    assert entry.checksum == hashlib.sha256(b"abc").hexdigest()


def test_upload_of_what_the_branch_shows_writes_and_stages_nothing(lake: Lake, repo) -> None:
    main = repo.branch("main")
    committed = main.upload("a", b"1", metadata={"k": "v"})
    main.commit("a")
    written = data_objects(lake, repo)

    assert main.upload("a", b"1", metadata={"k": "v"}) == committed
    assert data_objects(lake, repo) == written
    assert list(main.uncommitted()) == []
    with pytest.raises(NoChanges):
        main.commit("again")

    staged = main.upload("b", b"2")
    assert main.upload("b", b"2") == staged
    assert len(data_objects(lake, repo)) == len(written) + 1


def test_upload_of_other_bytes_or_metadata_is_a_change(repo) -> None:
    main = repo.branch("main")
    main.upload("a", b"1")
    main.upload("b", b"2")
    main.commit("base")
    main.upload("a", b"1", metadata={"k": "v"})
    main.upload("b", b"3")
    assert sorted((c.path, c.type) for c in main.uncommitted()) == [
        ("a", "changed"),
        ("b", "changed"),
    ]


def test_upload_after_a_delete_restores_the_path(repo) -> None:
    main = repo.branch("main")
    main.upload("a", b"1")
    main.commit("a")
    main.delete("a")
    main.upload("a", b"1")
    assert main.read("a") == b"1"
    assert list(main.uncommitted()) == []


def test_upload_recognises_its_content_in_an_md5_entry_written_before(lake: Lake, repo) -> None:
    """Entries uploaded before SHA-256 carry an MD5: a retried upload after an upgrade is still
    no change."""
    main = repo.branch("main")
    fresh = main.upload("a", b"legacy bytes")
    legacy = fresh._replace(checksum=hashlib.md5(b"legacy bytes").hexdigest())
    stage_entry(lake.graveler, repo.record, "main", legacy)
    main.commit("written by an older engine")
    assert main.upload("a", b"legacy bytes") == legacy
    assert main.upload("a", b"other bytes!") != legacy
