"""Metadata of every type and checksums of every code point (hypothesis): one rule for every
operation, a typed error naming the problem, and nothing written when it is refused."""

from __future__ import annotations

import functools
import itertools
import math
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from branchwater.engine import BranchwaterError, InvalidArgument, NotFound
from branchwater.engine.api import Branch, Repository
from branchwater.engine.graveler.checksums import CHECKSUM_MAX_LENGTH
from branchwater.engine.graveler.model import METADATA_RULE, TEXT_MAX_BYTES
from tests.helpers.hostile import HOSTILE_TEXTS, bad_metadata, stored, valid_metadata

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


@pytest.mark.parametrize("operation", ["upload", "commit", "merge", "link"])
def test_metadata_over_what_a_record_holds_is_refused_before_any_write(
    repo: Repository, tmp_path: Path, operation: str
) -> None:
    """DynamoDB refused such a commit record only after the branch was sealed and its
    ranges written; every store now refuses it first."""
    large = {"notes": "x" * TEXT_MAX_BYTES}
    error = refused(repo, tmp_path, operations(repo, large)[operation])
    assert "over the 96 KiB a record holds" in str(error)


@pytest.mark.parametrize("argument", ["message", "committer"])
@pytest.mark.parametrize(
    ("value", "said"),
    [("é" * (TEXT_MAX_BYTES // 2 + 1), "KiB a record holds"), ("bad \udcff", "lone surrogate")],
    ids=["too-long", "lone-surrogate"],
)
def test_a_commit_message_or_committer_no_record_holds_is_refused_before_sealing(
    repo: Repository, tmp_path: Path, argument: str, value: str, said: str
) -> None:
    """A lone surrogate was recorded, and every `log` after failed to encode it. The dev
    commit's staging rows are dropped in the background: awaited, so the merge's refusal is
    judged on rows nothing else is changing."""
    main = repo.branch("main")
    main.upload("a", b"a")
    arguments = {"message": "m", "committer": "c", argument: value}
    assert said in str(refused(repo, tmp_path, lambda: main.commit(**arguments)))
    if argument == "message":
        repo.create_branch("dev").upload("b", b"b")
        repo.branch("dev").commit("b")
        repo.lake.wait_for_cleanup()
        merging = lambda: repo.merge("dev", into="main", message=value)  # noqa: E731
        assert said in str(refused(repo, tmp_path, merging))


def flag_calls(repo: Repository) -> dict[str, tuple[str, Callable[[Any], object]]]:
    """Every public call that takes a bool flag, by flag, each ready to change something but
    for it: `main` has a commit and a staged object, `dev` a commit to merge."""
    main = repo.branch("main")
    main.upload("a.csv", b"1")
    main.commit("load")
    main.upload("staged", b"2")
    dev = repo.create_branch("dev")
    dev.upload("b.csv", b"3")
    dev.commit("on dev")
    repo.lake.wait_for_cleanup()
    return {
        "upload": ("if_absent", lambda v: main.upload("new", b"x", if_absent=v)),
        "upload_file": ("if_absent", lambda v: main.upload_file("new", __file__, if_absent=v)),
        "commit": ("allow_empty", lambda v: main.commit("m", allow_empty=v)),
        "merge": ("fast_forward", lambda v: repo.merge("dev", into="main", fast_forward=v)),
        "merge preview": ("preview", lambda v: repo.merge("dev", into="main", preview=v)),
        "revert": ("allow_dirty", lambda v: repo.revert("main", "main", allow_dirty=v)),
        "cherry_pick": ("allow_dirty", lambda v: repo.cherry_pick("main", "dev", allow_dirty=v)),
        "compact": ("if_needed", lambda v: main.compact(if_needed=v)),
        "protect": ("no_delete", lambda v: repo.protect("main", no_delete=v)),
        "record_check": ("passed", lambda v: repo.record_check("main", "q", v)),
        "log": ("first_parent", lambda v: repo.log("main", first_parent=v)),
        "read": ("verify", lambda v: main.read("a.csv", verify=v)),
        "open": ("verify", lambda v: main.open("a.csv", verify=v)),
    }


@pytest.mark.parametrize("flag", ["False", "", 0, 1, None])
def test_a_flag_that_is_not_a_bool_is_refused_before_any_write(
    repo: Repository, tmp_path: Path, flag: Any
) -> None:
    """Text such as "False" would count as true: make a plain upload exclusive, a merge
    never fast-forward, a revert run on a dirty branch."""
    for call, (name, operation) in flag_calls(repo).items():
        error = refused(repo, tmp_path, functools.partial(operation, flag))
        assert f"{name} must be True or False, not {flag!r}" in str(error), call


def test_a_progress_that_cannot_be_called_is_refused_before_any_write(
    repo: Repository, tmp_path: Path
) -> None:
    """It would fail the operation at its first report, midway: a commit's branch sealed."""
    main = repo.branch("main")
    main.upload("a", b"1")
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f").write_text("x")
    repo.lake.wait_for_cleanup()
    for operation in (
        lambda: main.commit("m", progress="every 100"),
        lambda: main.import_objects(f"file://{tmp_path}/src/", progress="every 100"),
        lambda: repo.prepare_uncommitted_for_gc(progress="every 100"),
    ):
        error = refused(repo, tmp_path, operation)
        assert "progress must be a function called with a count, not str" in str(error)


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


NOT_AWARE_TIMES = (datetime(2026, 1, 1), datetime.max, datetime.min)
"""Naive times: compared with a commit's UTC date they raised `TypeError`."""
HOSTILE_VALUES: list[object] = [
    *HOSTILE_TEXTS,
    *(None, 0, -1, 10**30, math.nan, math.inf, True, b"x", [], ["a"], {"a": 1}, {"a": "b"}),
    *(timedelta(days=-1), object()),
    *NOT_AWARE_TIMES,
    *(datetime.max.replace(tzinfo=UTC), datetime.min.replace(tzinfo=UTC)),
]
"""Values each argument of `api_calls` takes in turn: `HOSTILE_TEXTS`, wrong types, huge and
non-finite numbers, times without a zone or at the calendar's ends."""
LOCAL_FILE_CALLS = {"dump_refs", "restore_refs"}
"""Calls on a local file, which may also raise the file system's own `OSError` (a name
too long), as Python's file functions do."""


def api_calls(repo: Repository, root: Path) -> dict[str, Callable[[Any], object]]:
    """One public call per argument, the others valid, on a lake with history on two
    branches, a source folder to import, a protected pattern and GC rules."""
    lake, main = repo.lake, repo.branch("main")
    dev = repo.create_branch("dev")
    repo.set_gc_rules({"default_retention_days": 30})
    (root / "src").mkdir()
    (root / "src" / "f").write_text("x")

    def token() -> str:
        return dev.get_physical_address().token

    return {
        "create_repository": lambda v: lake.create_repository(v, f"file://{root}/o"),
        "create_repository ns": lambda v: lake.create_repository("other", v),
        "repository": lambda v: lake.repository(v),
        "delete_repository": lambda v: lake.delete_repository(v),
        "create_branch": lambda v: repo.create_branch(v, source="main"),
        "create_branch source": lambda v: repo.create_branch("b2", source=v),
        "branch": lambda v: repo.branch(v).head(),
        "ref": lambda v: repo.ref(v),
        "delete_branch": lambda v: repo.delete_branch(v),
        "branches after": lambda v: repo.branches(after=v),
        "branches limit": lambda v: repo.branches(limit=v),
        "tags after": lambda v: repo.tags(after=v),
        "tags limit": lambda v: repo.tags(limit=v),
        "tag": lambda v: repo.tag(v, "main"),
        "tag ref": lambda v: repo.tag("t1", v),
        "delete_tag": lambda v: repo.delete_tag(v),
        "log": lambda v: list(repo.log(v)),
        "log limit": lambda v: list(repo.log("main", limit=v)),
        "log depth": lambda v: list(repo.log("main", depth=v)),
        "log after": lambda v: list(repo.log("main", after=v)),
        "log where": lambda v: list(repo.log("main", where=v)),
        "log paths": lambda v: list(repo.log("main", paths=v)),
        "diff": lambda v: list(repo.diff("main", v)),
        "merge source": lambda v: repo.merge(v, into="main"),
        "merge into": lambda v: repo.merge("dev", into=v),
        "merge strategy": lambda v: repo.merge("dev", into="main", strategy=v),
        "merge message": lambda v: repo.merge("dev", into="main", message=v),
        "merge metadata": lambda v: repo.merge("dev", into="main", metadata=v),
        "merge hint": lambda v: repo.merge("dev", into="main", hint=v),
        "revert": lambda v: repo.revert("dev", v),
        "revert parent": lambda v: repo.revert("dev", "main", parent=v),
        "cherry_pick": lambda v: repo.cherry_pick("dev", v),
        "protect": lambda v: repo.protect(v, no_delete=True),
        "protect checks": lambda v: repo.protect("zz", required_checks=v),
        "protect flag": lambda v: repo.protect("zz", no_delete=v),
        "protect by": lambda v: repo.protect("zz", no_delete=True, by=v),
        "unprotect": lambda v: repo.unprotect(v),
        "record_check commit": lambda v: repo.record_check(v, "q", True),
        "record_check name": lambda v: repo.record_check("main", v, True),
        "record_check passed": lambda v: repo.record_check("main", "q2", v),
        "record_check details": lambda v: repo.record_check("main", "q3", True, v),
        "checks": lambda v: repo.checks(v),
        "set_gc_rules": lambda v: repo.set_gc_rules(v),
        "retention now": lambda v: repo.retention(v),
        "lock_gc_run holder": lambda v: repo.lock_gc_run(v).release(),
        "lock_gc_run ttl": lambda v: repo.lock_gc_run("h", v).release(),
        "dump_refs": lambda v: repo.dump_refs(v),
        "restore_refs": lambda v: repo.restore_refs(v),
        "provenance": lambda v: repo.provenance(v),
        "uncommitted_gc_run": lambda v: repo.uncommitted_gc_run(v),
        "upload path": lambda v: dev.upload(v, b"1"),
        "upload data": lambda v: dev.upload("p", v),
        "upload metadata": lambda v: dev.upload("p", b"1", metadata=v),
        "upload_file": lambda v: dev.upload_file("p", v),
        "delete": lambda v: dev.delete(v),
        "copy source": lambda v: dev.copy(v, "y"),
        "copy destination": lambda v: dev.copy("a.csv", v),
        "read": lambda v: dev.read(v),
        "stat": lambda v: dev.stat(v),
        "open": lambda v: dev.open(v).close(),
        "list prefix": lambda v: list(dev.list(v)),
        "list after": lambda v: list(dev.list("", after=v)),
        "commit message": lambda v: dev.commit(v, allow_empty=True),
        "commit metadata": lambda v: dev.commit("m", v, allow_empty=True),
        "commit committer": lambda v: dev.commit("m", committer=v, allow_empty=True),
        "reset": lambda v: dev.reset(to=v),
        "restore paths": lambda v: dev.restore(v, source="main"),
        "restore source": lambda v: dev.restore("a.csv", source=v),
        "link token": lambda v: dev.link_physical_address("l", v, size=1, checksum="c"),
        "link size": lambda v: dev.link_physical_address("l", token(), size=v, checksum="c"),
        "link checksum": lambda v: dev.link_physical_address("l", token(), size=1, checksum=v),
        "compact": lambda v: repo.branch(v).compact(),
        "compact policy": lambda v: dev.compact(policy=v),
        "compaction_status policy": lambda v: dev.compaction_status(v),
        "wait_for_cleanup": lambda v: lake.wait_for_cleanup(v),
        "commit progress": lambda v: dev.commit("m", allow_empty=True, progress=v),
        "import progress": lambda v: dev.import_objects(f"file://{root}/src/", progress=v),
        "prepare progress": lambda v: repo.prepare_uncommitted_for_gc(progress=v),
        "import source": lambda v: dev.import_objects(v),
        "import prefix": lambda v: dev.import_objects(f"file://{root}/src/", prefix=v),
        "prepare run": lambda v: repo.prepare_uncommitted_for_gc(v),
        "main read": lambda v: main.read(v),
    }


def test_every_call_refuses_a_hostile_argument_with_a_typed_error(
    repo: Repository, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each public call, each value in each argument: it succeeds or raises a
    `BranchwaterError`, never an error of the parts below (`ValueError`, `RecursionError`,
    `OverflowError`, `TypeError` …)."""
    monkeypatch.chdir(tmp_path)
    main = repo.branch("main")
    main.upload("a.csv", b"1")
    main.commit("load")
    failures = []
    for name, call in api_calls(repo, tmp_path).items():
        for value in HOSTILE_VALUES:
            try:
                call(value)
            except BranchwaterError:
                pass
            except OSError as exc:
                if name not in LOCAL_FILE_CALLS:
                    failures.append(f"{name}({value!r:.40}): {exc!r:.200}")
            except Exception as exc:
                failures.append(f"{name}({value!r:.40}): {exc!r:.200}")
    assert failures == []


@pytest.mark.parametrize(
    ("now", "said"),
    [
        (0, "not int"),
        ("2026-01-01", "not str"),
        *((naive, "not a naive one") for naive in NOT_AWARE_TIMES),
        (datetime.max.replace(tzinfo=UTC), "days from the calendar's ends"),
        (datetime.min.replace(tzinfo=UTC), "days from the calendar's ends"),
    ],
    ids=repr,
)
def test_a_retention_time_that_is_not_an_aware_datetime_is_refused(
    repo: Repository, now: object, said: str
) -> None:
    """Naive times and text raised `TypeError`, the calendar's ends `OverflowError`, and 0
    was taken for the GC clock's time."""
    main = repo.branch("main")
    main.upload("a", b"1")
    main.commit("load")
    repo.set_gc_rules({"default_retention_days": 1})
    with pytest.raises(InvalidArgument, match="now must be a") as raised:
        repo.retention(now)  # type: ignore[arg-type]
    assert said in str(raised.value)
    assert repo.retention() is not None
