"""Metadata of every type and checksums of every code point (hypothesis): one rule for every
operation, a typed error naming the problem, and nothing written when it is refused."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from branchwater.engine import InvalidArgument, NotFound
from branchwater.engine.api import Branch, Repository
from branchwater.engine.graveler.checksums import CHECKSUM_MAX_LENGTH
from branchwater.engine.graveler.model import METADATA_RULE
from tests.helpers.hostile import bad_metadata, stored, valid_metadata

HYPOTHESIS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
VALID_METADATA = valid_metadata()
CHECKSUM_CHARACTERS = set("0123456789+/=._:-abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_counter = itertools.count()


BAD_METADATA = bad_metadata()


def unique(prefix: str) -> str:
    return f"{prefix}-{next(_counter)}"


def linkable(branch: Branch, data: bytes = b"linked") -> str:
    """A token for an address that already holds `data` (written outside the engine)."""
    physical = branch.get_physical_address()
    repo = branch.repository
    repo.lake.graveler.objects(repo.storage_namespace).put(physical.address, data)
    return physical.token


def refused(repo: Repository, root: Path, operation: Callable[[], object]) -> InvalidArgument:
    """Run `operation`, which must be refused with `InvalidArgument` and write nothing."""
    before = stored(repo.lake.graveler.kv, root)
    with pytest.raises(InvalidArgument) as caught:
        operation()
    assert stored(repo.lake.graveler.kv, root) == before
    return caught.value


def operations(repo: Repository, metadata: Any) -> dict[str, Callable[[], object]]:
    """Every operation that takes metadata, each ready to change something but for it."""
    main = repo.branch("main")
    main.upload(unique("staged"), b"to commit")
    if "source" not in {b.name for b in repo.branches()}:
        repo.create_branch("source")
    source = repo.branch("source")
    source.upload(unique("merged"), b"to merge")
    source.commit("on source")
    token = linkable(main)
    repo.lake.wait_for_cleanup()
    return {
        "upload": lambda: main.upload(unique("up"), b"data", metadata=metadata),
        "commit": lambda: main.commit("message", metadata=metadata),
        "merge": lambda: repo.merge("source", into="main", metadata=metadata),
        "link": lambda: main.link_physical_address(
            unique("ln"), token, size=6, checksum="c", metadata=metadata
        ),
    }


@HYPOTHESIS
@given(metadata=BAD_METADATA, operation=st.sampled_from(["upload", "commit", "merge", "link"]))
def test_metadata_that_is_not_strings_to_strings_is_refused_before_any_write(
    repo: Repository, tmp_path: Path, metadata: Any, operation: str
) -> None:
    error = refused(repo, tmp_path, operations(repo, metadata)[operation])
    assert METADATA_RULE in str(error)


@HYPOTHESIS
@given(metadata=VALID_METADATA)
def test_metadata_of_any_text_is_stored_exactly(repo: Repository, metadata: dict[str, str]) -> None:
    main = repo.branch("main")
    path = unique("exact")
    assert main.upload(path, b"data", metadata=metadata).metadata == metadata
    linked = unique("linked")
    main.link_physical_address(linked, linkable(main), size=6, checksum="c", metadata=metadata)
    commit = main.commit("exact metadata", metadata=metadata)
    assert repo.commit(commit.id).metadata == metadata
    assert repo.ref(commit.id).stat(path).metadata == metadata
    assert repo.ref(commit.id).stat(linked).metadata == metadata


def test_integer_keys_are_refused_not_turned_into_strings(repo: Repository) -> None:
    main = repo.branch("main")
    main.upload("a", b"a")
    with pytest.raises(InvalidArgument, match="key 1 is of type int"):
        main.commit("m", metadata={1: "a"})  # type: ignore[dict-item]


@pytest.mark.parametrize(
    ("message", "committer", "names"), [(b"m", "", "message"), ("m", 7, "committer")]
)
def test_commit_arguments_of_the_wrong_type_are_refused_before_sealing(
    repo: Repository, tmp_path: Path, message: Any, committer: Any, names: str
) -> None:
    main = repo.branch("main")
    main.upload("a", b"a")
    error = refused(repo, tmp_path, lambda: main.commit(message, committer=committer))
    assert names in str(error)


@HYPOTHESIS
@given(checksum=st.text(min_size=1, max_size=CHECKSUM_MAX_LENGTH + 2))
def test_a_checksum_of_any_code_point_is_linked_or_refused_and_the_branch_keeps_working(
    repo: Repository, tmp_path: Path, checksum: str
) -> None:
    main = repo.branch("main")
    token = linkable(main)
    repo.lake.wait_for_cleanup()
    path = unique("checked")
    valid = set(checksum) <= CHECKSUM_CHARACTERS and len(checksum) <= CHECKSUM_MAX_LENGTH
    if valid:
        assert (
            main.link_physical_address(path, token, size=6, checksum=checksum).checksum == checksum
        )
    else:
        error = refused(
            repo,
            tmp_path,
            lambda: main.link_physical_address(path, token, size=6, checksum=checksum),
        )
        assert "checksum" in str(error)
        main.link_physical_address(path, token, size=6, checksum="sha")
    assert path in {c.path for c in main.uncommitted()}
    assert path in {e.path for e in main.list()}
    main.commit("after a hostile checksum")
    assert main.stat(path).checksum == (checksum if valid else "sha")


@pytest.mark.parametrize("checksum", ["a\x00b", "\ud800", "", "abc\n", 7, None])
def test_checksums_the_issue_names_are_refused(
    repo: Repository, tmp_path: Path, checksum: Any
) -> None:
    main = repo.branch("main")
    token = linkable(main)
    refused(
        repo, tmp_path, lambda: main.link_physical_address("p", token, size=6, checksum=checksum)
    )
    with pytest.raises(NotFound):
        main.stat("p")
