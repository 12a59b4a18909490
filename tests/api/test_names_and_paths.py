"""Hostile names and paths through the public API: a typed error naming them, nothing written;
and refs named like commit ids, which must never take a pinned commit's place."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from branchwater.engine import InvalidArgument, InvalidName, Lake
from branchwater.engine.api import Repository
from branchwater.engine.graveler import writes
from branchwater.engine.graveler.model import BranchRecord, Tag
from branchwater.engine.graveler.names import MAX_PATH_BYTES
from branchwater.engine.graveler.staging import new_staging_token
from tests.helpers.hostile import hostile_names, hostile_paths, stored

EXAMPLES = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
HOSTILE_NAMES = hostile_names()
HOSTILE_PATHS = hostile_paths()


@pytest.fixture
def history(repo: Repository) -> list[str]:
    """Commit ids of `main`, newest first (two commits on the first), and a branch `other`
    one commit ahead."""
    main = repo.branch("main")
    for n in range(2):
        main.upload(f"data/{n}.csv", b"n\n%d\n" % n)
        main.commit(f"commit {n}")
    repo.create_branch("other", source="main")
    other = repo.branch("other")
    other.upload("data/other.csv", b"other\n")
    other.commit("other's commit")
    assert repo.lake.wait_for_cleanup(10)  # the commits' staging rows, dropped in the background
    return [c.id for c in repo.log("main")]


def refused(error: type[Exception], what: object, call: Callable[[], object]) -> None:
    """`call` raises `error` naming `what`."""
    with pytest.raises(error, match=re.escape(repr(what))):
        result = call()
        if hasattr(result, "__next__"):
            next(iter(result))  # type: ignore[call-overload]


# Refs named like commit ids ----------------------------------------------------------------


@EXAMPLES
@given(which=st.integers(0, 3), fake=st.from_regex(r"[0-9a-f]{64}", fullmatch=True))
def test_no_branch_or_tag_can_be_named_like_a_commit_id(
    lake: Lake, repo: Repository, tmp_path: Path, history: list[str], which: int, fake: str
) -> None:
    commit_id = [*history, fake][which]
    before = stored(lake.graveler.kv, tmp_path)
    with pytest.raises(InvalidName, match="full commit id"):
        repo.create_branch(commit_id, source="other")
    with pytest.raises(InvalidName, match="full commit id"):
        repo.tag(commit_id, "other")
    assert stored(lake.graveler.kv, tmp_path) == before


def test_a_full_commit_id_resolves_to_its_commit_before_any_ref_of_that_name(
    lake: Lake, repo: Repository, history: list[str]
) -> None:
    """Refs made before names were checked: the commit id still reads the commit."""
    g, record = lake.graveler, repo.record
    newest, older, _ = history
    other = repo.branch("other").commit_id
    g.refs.insert_branch(record, BranchRecord(newest, other, new_staging_token(record, newest)))
    g.refs.insert_tag(record, Tag(older, other))
    assert repo.ref(newest).commit_id == newest
    assert repo.ref(older).commit_id == older
    assert repo.ref(f"{newest}~1").commit_id == older
    assert [c.id for c in repo.log(newest)] == history
    assert [e.path for e in repo.ref(older).list()] == ["data/0.csv"]
    assert repo.branch(newest).commit_id == other


# Hostile names -----------------------------------------------------------------------------


@EXAMPLES
@given(name=HOSTILE_NAMES)
def test_a_name_that_cannot_be_one_is_invalid_name_everywhere_and_writes_nothing(
    lake: Lake, repo: Repository, tmp_path: Path, name: object
) -> None:
    calls: list[Callable[[], object]] = [
        lambda: lake.repository(name),  # type: ignore[arg-type]
        lambda: lake.create_repository(name, f"file://{tmp_path}/new"),  # type: ignore[arg-type]
        lambda: lake.create_repository("fresh", f"file://{tmp_path}/new", name),  # type: ignore[arg-type]
        lambda: lake.delete_repository(name),  # type: ignore[arg-type]
        lambda: repo.branch(name),  # type: ignore[arg-type]
        lambda: repo.create_branch(name, source="main"),  # type: ignore[arg-type]
        lambda: repo.delete_branch(name),  # type: ignore[arg-type]
        lambda: repo.tag(name, "main"),  # type: ignore[arg-type]
        lambda: repo.tag("fresh", name),  # type: ignore[arg-type]
        lambda: repo.delete_tag(name),  # type: ignore[arg-type]
        lambda: repo.ref(name),  # type: ignore[arg-type]
        lambda: repo.commit(name),  # type: ignore[arg-type]
        lambda: repo.log(name),  # type: ignore[arg-type]
        lambda: repo.diff("main", name),  # type: ignore[arg-type]
        lambda: repo.merge(name, "main"),  # type: ignore[arg-type]
        lambda: repo.merge("main", name),  # type: ignore[arg-type]
        lambda: repo.merge_base("main", name),  # type: ignore[arg-type]
    ]
    if name is not None:  # the default branch
        calls.append(lambda: repo.create_branch("fresh", source=name))  # type: ignore[arg-type]
    before = stored(lake.graveler.kv, tmp_path)
    for call in calls:
        refused(InvalidName, name, call)
    assert stored(lake.graveler.kv, tmp_path) == before


@EXAMPLES
@given(name=st.from_regex(r"[a-z0-9][a-z0-9-]{1,30}[a-z0-9]", fullmatch=True))
def test_a_repository_name_with_a_trailing_newline_is_refused(
    lake: Lake, tmp_path: Path, name: str
) -> None:
    before = stored(lake.graveler.kv, tmp_path)
    with pytest.raises(InvalidName, match="invalid repository name"):
        lake.create_repository(f"{name}\n", f"file://{tmp_path}/{name}")
    assert stored(lake.graveler.kv, tmp_path) == before


# Hostile paths -----------------------------------------------------------------------------


@EXAMPLES
@given(path=HOSTILE_PATHS)
def test_a_path_that_cannot_be_one_is_invalid_argument_everywhere_and_writes_nothing(
    lake: Lake, repo: Repository, tmp_path: Path, path: object
) -> None:
    main = repo.branch("main")
    physical = main.get_physical_address()
    lake.graveler.objects(repo.storage_namespace).put(physical.address, b"x")
    pinned = repo.ref(main.commit_id)
    calls: list[Callable[[], object]] = [
        lambda: main.stat(path),  # type: ignore[arg-type]
        lambda: main.read(path),  # type: ignore[arg-type]
        lambda: main.delete(path),  # type: ignore[arg-type]
        lambda: main.upload(path, b"data"),  # type: ignore[arg-type]
        lambda: main.copy(path, "dst"),  # type: ignore[arg-type]
        lambda: main.copy("src", path),  # type: ignore[arg-type]
        lambda: main.link_physical_address(path, physical.token, size=1, checksum="c"),  # type: ignore[arg-type]
        lambda: pinned.stat(path),  # type: ignore[arg-type]
        lambda: pinned.read(path),  # type: ignore[arg-type]
    ]
    if path != "":
        for ref in (main, pinned):
            calls.append(lambda ref=ref: ref.list(prefix=path))  # type: ignore[misc]
            calls.append(lambda ref=ref: ref.list(after=path))  # type: ignore[misc]
    before = stored(lake.graveler.kv, tmp_path)
    for call in calls:
        refused(InvalidArgument, path, call)
    assert stored(lake.graveler.kv, tmp_path) == before
    main.link_physical_address("linked", physical.token, size=1, checksum="c")


def test_a_path_longer_than_an_s3_key_is_refused_by_every_write_and_writes_nothing(
    lake: Lake, repo: Repository, tmp_path: Path
) -> None:
    main = repo.branch("main")
    main.upload("src", b"s")
    physical = main.get_physical_address()
    lake.graveler.objects(repo.storage_namespace).put(physical.address, b"x")
    longest, too_long = "é" * (MAX_PATH_BYTES // 2), "é" * (MAX_PATH_BYTES // 2) + "a"
    writes: list[Callable[[str], object]] = [
        lambda path: main.upload(path, b"data"),
        lambda path: main.copy("src", path),
        lambda path: main.link_physical_address(path, physical.token, size=1, checksum="c"),
    ]
    before = stored(lake.graveler.kv, tmp_path)
    for write in writes:
        with pytest.raises(InvalidArgument, match="1,025 bytes long, and a path may be at most"):
            write(too_long)
    assert stored(lake.graveler.kv, tmp_path) == before
    for write in writes[:2]:
        write(longest)
        assert main.stat(longest).path == longest
        main.delete(longest)


def test_a_path_staged_before_the_limit_stays_readable_and_removable(repo: Repository) -> None:
    main = repo.branch("main")
    entry = main.upload("short", b"old lake")
    long_path = "p/" + "x" * 2000
    writes.stage_entry(repo.lake.graveler, repo.record, "main", entry._replace(path=long_path))
    assert main.read(long_path) == b"old lake"
    assert [e.path for e in main.list(prefix="p/")] == [long_path]
    main.delete(long_path)
    assert [e.path for e in main.list(prefix="p/")] == []


def test_an_import_making_a_path_too_long_commits_nothing(repo: Repository, tmp_path: Path) -> None:
    source = tmp_path / "source"
    source.mkdir()
    (source / "part-0.csv").write_bytes(b"a\n")
    main = repo.branch("main")
    head = main.commit_id
    with pytest.raises(InvalidArgument, match=r"cannot be imported .*nothing was committed"):
        main.import_objects(f"file://{source}/", prefix="d" * MAX_PATH_BYTES + "/")
    assert main.commit_id == head
    assert list(main.uncommitted()) == []
