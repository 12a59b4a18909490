"""The public Lake API on the in-memory KV and a local namespace: behaviour a user relies on."""

from __future__ import annotations

import dataclasses
import json
import multiprocessing as mp
import re
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from branchwater.engine import (
    AlreadyExists,
    BranchProtected,
    ConfigurationError,
    CorruptedData,
    InvalidArgument,
    InvalidName,
    Lake,
    NoChanges,
    NotFound,
)
from branchwater.engine.errors import LakeNotFound
from branchwater.engine.graveler import commit as commit_ops
from branchwater.engine.graveler.graveler import ABANDONED_DROP_S, LET_GO_DROP_S, Graveler
from branchwater.engine.graveler.iterators import reporting
from branchwater.engine.graveler.model import Entry
from branchwater.engine.graveler.refs import BranchGuard
from branchwater.engine.graveler.writes import stage_entry
from tests.helpers.hostile import dumped_and_recreated
from tests.helpers.views import listed


def test_walk_through(repo) -> None:
    main = repo.branch("main")
    main.upload("tables/a.parquet", b"aaa")
    main.upload("tables/b.parquet", b"bbb", metadata={"owner": "etl"})
    first = main.commit("load a and b", metadata={"source": "test"})
    assert first.metadata == {"source": "test"}
    assert listed(main) == ["tables/a.parquet", "tables/b.parquet"]

    dev = repo.create_branch("etl", source="main")
    dev.upload("tables/c.parquet", b"ccc")
    dev.delete("tables/a.parquet")
    assert listed(dev) == ["tables/b.parquet", "tables/c.parquet"]
    assert listed(main) == ["tables/a.parquet", "tables/b.parquet"]
    assert {(c.path, c.type) for c in dev.uncommitted()} == {
        ("tables/a.parquet", "removed"),
        ("tables/c.parquet", "added"),
    }
    second = dev.commit("add c, drop a")
    assert list(dev.uncommitted()) == []
    assert second.parents == (first.id,)
    assert [c.message for c in repo.log("etl")] == [
        "add c, drop a",
        "load a and b",
        "Repository created",
    ]
    assert {(c.path, c.type) for c in repo.diff("main", "etl")} == {
        ("tables/a.parquet", "removed"),
        ("tables/c.parquet", "added"),
    }
    assert dev.read("tables/c.parquet") == b"ccc"
    assert dev.stat("tables/b.parquet").metadata == {"owner": "etl"}


def test_overwrite_shows_latest_and_commits_as_changed(repo) -> None:
    main = repo.branch("main")
    main.upload("x", b"1")
    main.commit("one")
    main.upload("x", b"22")
    assert main.read("x") == b"22"
    assert [(c.path, c.type) for c in main.uncommitted()] == [("x", "changed")]
    main.commit("two")
    assert repo.ref("main~1").read("x") == b"1"
    assert main.read("x") == b"22"


@pytest.mark.parametrize(
    "ref",
    ["main~²", "main~\u0661", "main~ 1", "main~+1", "main~" + "9" * 5000],
    ids=["superscript", "arabic-indic", "space", "plus", "5000 digits"],
)
def test_ancestry_counts_are_ascii_digits_as_in_git(repo, ref: str) -> None:
    """`str.isdigit` took `²` (then `int` raised ValueError) and other scripts' digits (read
    as a count); a count of thousands of digits raised ValueError from `int`."""
    main = repo.branch("main")
    for i in range(2):
        main.upload("x", str(i).encode())
        main.commit(str(i))
    assert repo.ref("main~1").commit_id == repo.ref("main^").commit_id
    with pytest.raises(NotFound):
        repo.ref(ref)


@pytest.mark.parametrize(
    ("ref", "says"),
    [
        ("main^2", "`^N` is not read"),
        ("main~-1", "`~N` and `^` step back"),
        ("abc12", "at least 6 hex digits"),
        ("x" * 20_000, "… (20,000 characters) not found"),
    ],
)
def test_a_ref_not_found_says_what_it_may_have_meant_in_one_short_line(
    repo, ref: str, says: str
) -> None:
    with pytest.raises(NotFound) as raised:
        repo.ref(ref)
    assert says in str(raised.value)
    assert len(str(raised.value)) < 300


def test_log_pages_with_limit_and_after(repo) -> None:
    main = repo.branch("main")
    for i in range(5):
        main.upload("f", str(i).encode())
        main.commit(f"c{i}")
    first = list(repo.log("main", limit=2))
    assert [c.message for c in first] == ["c4", "c3"]
    rest = list(repo.log("main", limit=2, after=first[-1].id))
    assert [c.message for c in rest] == ["c2", "c1"]
    with pytest.raises(NotFound):
        list(repo.log("main", after="0" * 64))


def test_log_where_keeps_commits_whose_metadata_matches(repo) -> None:
    main = repo.branch("main")
    for day in ("01", "02", "03"):
        for task in ("load", "check"):
            main.upload(f"{day}/{task}", b"x")
            main.commit(f"{task} {day}", {"dag": "daily", "task": task, "day": day})
    loads = list(repo.log("main", where={"task": "load"}))
    assert [c.message for c in loads] == ["load 03", "load 02", "load 01"]
    assert [c.message for c in repo.log("main", where={"task": "load", "day": "02"})] == ["load 02"]
    assert list(repo.log("main", where={"task": "load"}, limit=1)) == loads[:1]
    assert list(repo.log("main", where={"task": "load"}, after=loads[0].id)) == loads[1:]
    assert list(repo.log("main", where={"task": "nope"})) == []
    assert list(repo.log("main", where={})) == list(repo.log("main"))


def test_log_depth_bounds_the_walk_before_the_filter(repo) -> None:
    main = repo.branch("main")
    for i in range(6):
        main.upload("f", str(i).encode())
        main.commit(f"c{i}", {"even": str(i % 2 == 0)})
    assert [c.message for c in repo.log("main", depth=3)] == ["c5", "c4", "c3"]
    assert [c.message for c in repo.log("main", where={"even": "True"}, depth=3)] == ["c4"]
    assert list(repo.log("main", where={"even": "True"}, depth=1)) == []
    for bad in (-1, 1.5, True, "3"):
        with pytest.raises(InvalidArgument, match="depth must be a number of commits"):
            repo.log("main", depth=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidArgument, match="limit must be a number of commits"):
            repo.log("main", limit=bad)  # type: ignore[arg-type]


def test_log_paths_keeps_commits_that_change_a_path_under_a_prefix(repo) -> None:
    main = repo.branch("main")
    for path in ("orders/1", "customers/1", "orders/2", "orders-archive/1", "orders"):
        main.upload(path, b"x")
        main.commit(f"add {path}")
    main.delete("orders/1")
    main.commit("drop orders/1")
    feature = repo.create_branch("feature")
    feature.upload("customers/2", b"y")
    feature.commit("add customers/2")
    main.upload("orders/3", b"z")
    main.commit("add orders/3")
    repo.merge("feature", into="main", message="merge customers")

    def messages(**kwargs: object) -> list[str]:
        return [c.message for c in repo.log("main", **kwargs)]  # type: ignore[arg-type]

    assert messages(paths=["orders/"]) == [
        "add orders/3",
        "drop orders/1",
        "add orders/2",
        "add orders/1",
    ]
    assert messages(paths=["customers/"]) == [
        "merge customers",
        "add customers/2",
        "add customers/1",
    ]
    assert messages(paths=["orders"]) == [  # a prefix, not a folder: orders-archive too
        "add orders/3",
        "drop orders/1",
        "add orders",
        "add orders-archive/1",
        "add orders/2",
        "add orders/1",
    ]
    assert messages(paths=["orders/2", "customers/1"]) == ["add orders/2", "add customers/1"]
    assert messages(paths=["orders/"], limit=1) == ["add orders/3"]
    assert messages(paths=["nothing/"]) == []
    assert messages(paths=["customers/"], where={"none": "such"}) == []
    with pytest.raises(InvalidArgument, match="list of path prefixes"):
        repo.log("main", paths="orders/")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="non-empty strings"):
        repo.log("main", paths=[""])


def test_log_where_is_text_to_text(repo) -> None:
    with pytest.raises(InvalidArgument, match="where filters on text"):
        repo.log("main", where={"day": 2})  # type: ignore[dict-item]
    with pytest.raises(InvalidArgument, match="where must map"):
        repo.log("main", where=["day"])  # type: ignore[arg-type]


def test_log_stops_at_the_first_match_it_needs(repo, monkeypatch) -> None:
    """Streaming: the commits past the `limit`-th match are never read."""
    main = repo.branch("main")
    for i in range(20):
        main.upload("f", str(i).encode())
        main.commit(f"c{i}", {"i": str(i)})
    refs = repo.lake.graveler.refs
    original = refs.get_commit
    read: list[str] = []

    def counting(record, commit_id):
        read.append(commit_id)
        return original(record, commit_id)

    monkeypatch.setattr(refs, "get_commit", counting)
    (found,) = repo.log("main", where={"i": "17"}, limit=1)
    assert found.message == "c17"
    assert len(read) <= 4


def test_s3_options_given_as_a_function_are_asked_for_by_the_first_s3_namespace(
    tmp_path: Path,
) -> None:
    """A lake of local namespaces never calls it; the first S3 namespace does, once."""
    asked: list[int] = []

    def options() -> dict[str, str | None]:
        asked.append(1)
        return {"endpoint_url": "http://127.0.0.1:9", "region_name": "eu-west-1"}

    with Lake.connect("memory://", s3_options=options) as lake:
        local = lake.create_repository("local", f"file://{tmp_path}/local")
        local.branch("main").upload("a", b"a")
        local.branch("main").commit("a")
        assert asked == []
        first = lake.graveler.objects("s3://bucket/one")
        lake.graveler.objects("s3://bucket/two")
        assert asked == [1]
        assert first.endpoint_url == "http://127.0.0.1:9"  # type: ignore[attr-defined]


def test_s3_options_that_cannot_be_resolved_fail_where_s3_is_used(tmp_path: Path) -> None:
    def no_credentials() -> dict[str, str | None]:
        raise ConfigurationError("no credentials for S3")

    with Lake.connect("memory://", s3_options=no_credentials) as lake:
        lake.create_repository("local", f"file://{tmp_path}/local").branch("main").commit(
            "empty", allow_empty=True
        )
        for _ in range(2):
            with pytest.raises(ConfigurationError, match="no credentials for S3"):
                lake.graveler.objects("s3://bucket/one")


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"s3_options": "endpoint=x"}, ConfigurationError, "S3 options must be a dict"),
        ({"s3_options": {"region": "eu"}}, ConfigurationError, "unknown S3 option 'region'"),
        (
            {"s3_options": {"aws_secret_access_key": 1234}},
            ConfigurationError,
            "aws_secret_access_key must be a string, not int$",
        ),
        ({"range_cache_dir": 5}, InvalidArgument, "range_cache_dir takes a local path"),
        ({"retry": {"attempts": 3}}, InvalidArgument, "retry must be a RetryPolicy, not dict"),
        ({"gc": "7d"}, InvalidArgument, "gc must be a GCSettings, not str"),
        ({"range_policy": 1}, InvalidArgument, "range_policy must be a RangePolicy, not int"),
        ({"create": "False"}, InvalidArgument, "create must be True or False, not 'False'$"),
    ],
)
def test_connect_options_of_the_wrong_kind_are_refused_at_the_call(
    tmp_path: Path, options: dict[str, object], error: type[Exception], message: str
) -> None:
    """Each is used later (S3 options at the first S3 namespace), where Python's own error
    would not say which option was wrong; a secret's value is never shown."""
    with pytest.raises(error, match=message):
        Lake.connect(f"sqlite:///{tmp_path}/lake.db", **options)  # type: ignore[arg-type]


def test_connect_without_create_opens_only_a_lake_that_is_there(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/kv/lake.db"
    with pytest.raises(LakeNotFound, match="the file does not exist; check the URL"):
        Lake.connect(url, create=False)
    assert not (tmp_path / "kv").exists()
    with Lake.connect(url) as lake:
        lake.create_repository("sales", f"file://{tmp_path}/sales")
    with Lake.connect(url, create=False) as lake:
        assert [r.name for r in lake.repositories()] == ["sales"]


def test_s3_options_a_function_gives_are_checked_when_it_is_called() -> None:
    def options() -> dict[str, str]:
        return {"endpoint": "http://127.0.0.1:9"}

    with (
        Lake.connect("memory://", s3_options=options) as lake,
        pytest.raises(ConfigurationError, match="unknown S3 option 'endpoint'"),
    ):
        lake.graveler.objects("s3://bucket/one")


def test_tags_and_refs_are_read_only_views(repo) -> None:
    main = repo.branch("main")
    main.upload("a", b"A")
    c = main.commit("c")
    repo.tag("v1", "main")
    main.upload("a", b"B")
    main.commit("d")
    assert repo.ref("v1").read("a") == b"A"
    assert repo.ref(c.id[:8]).read("a") == b"A"
    assert repo.ref("main").read("a") == b"B"
    assert [t.name for t in repo.tags()] == ["v1"]
    with pytest.raises(AlreadyExists):
        repo.tag("v1", "main")
    assert not hasattr(repo.ref("v1"), "upload")


def test_listing_pages_prefix_and_after(repo) -> None:
    main = repo.branch("main")
    for i in range(30):
        main.upload(f"d/{i:03d}", b"x")
    main.commit("thirty")
    for i in range(30, 40):
        main.upload(f"d/{i:03d}", b"y")
    main.delete("d/005")
    shown = listed(main)
    assert shown == [f"d/{i:03d}" for i in range(40) if i != 5]
    assert [e.path for e in main.list(after="d/035")] == ["d/036", "d/037", "d/038", "d/039"]
    assert [e.path for e in main.list(prefix="d/03")][:2] == ["d/030", "d/031"]


def test_delete_only_tombstones_when_needed(lake: Lake, repo) -> None:
    """A path only staged is dropped, not hidden under a tombstone; one HEAD holds gets
    its tombstone."""
    main = repo.branch("main")
    main.upload("committed", b"c")
    main.commit("committed")
    main.upload("staged-only", b"s")
    main.delete("staged-only")
    token = lake.graveler.read_branch(repo.record, "main").staging_token
    assert list(lake.graveler.staging.scan(token)) == []
    assert list(main.uncommitted()) == []
    main.delete("committed")
    assert list(lake.graveler.staging.scan(token)) == [("committed", None)]
    main.reset()
    with pytest.raises(NoChanges):
        main.commit("nothing")
    with pytest.raises(NotFound):
        main.delete("never-existed")


def test_reset_drops_uncommitted(repo) -> None:
    main = repo.branch("main")
    main.upload("a", b"1")
    main.commit("a")
    main.upload("b", b"2")
    main.delete("a")
    main.reset()
    assert listed(main) == ["a"]
    assert list(main.uncommitted()) == []


def test_same_content_same_metarange(lake: Lake, repo) -> None:
    """Restaging exactly what a commit held gives that commit's metarange id back."""
    main = repo.branch("main")
    main.upload("a", b"1")
    entry = main.stat("a")
    first = main.commit("first")
    dev = repo.create_branch("dev", source="main")
    dev.delete("a")
    assert dev.commit("drop").metarange_id != first.metarange_id
    stage_entry(lake.graveler, repo.record, "dev", entry)
    assert dev.commit("restore").metarange_id == first.metarange_id


def test_commit_with_nothing_staged_is_no_changes(repo) -> None:
    with pytest.raises(NoChanges):
        repo.branch("main").commit("empty")
    allowed = repo.branch("main").commit("empty", allow_empty=True)
    assert allowed.message == "empty"


@pytest.mark.parametrize("name", ["", "ab", "Sales", "-abc", "abc-", "a_b_c", "x" * 64])
def test_invalid_repository_names(lake: Lake, tmp_path: Path, name: str) -> None:
    with pytest.raises(InvalidName):
        lake.create_repository(name, storage_namespace=f"file://{tmp_path}/x")


@pytest.mark.parametrize(
    "name", ["", "a..b", "a b", "-x", "x/", "x.lock", "a~1", "a:b", "@", ".hidden"]
)
def test_invalid_branch_names(repo, name: str) -> None:
    with pytest.raises(InvalidName):
        repo.create_branch(name, source="main")


def test_missing_things_are_not_found(lake: Lake, repo) -> None:
    with pytest.raises(NotFound, match="repository 'nope'"):
        lake.repository("nope")
    with pytest.raises(NotFound, match="branch 'nope'"):
        repo.branch("nope")
    with pytest.raises(NotFound, match="ref 'nope'"):
        repo.ref("nope")
    with pytest.raises(NotFound, match="path 'missing'"):
        repo.branch("main").stat("missing")
    with pytest.raises(NotFound):
        repo.create_branch("x", source="nope")


def test_existing_things_are_already_exists(lake: Lake, repo, tmp_path: Path) -> None:
    with pytest.raises(AlreadyExists):
        lake.create_repository("sales", storage_namespace=f"file://{tmp_path}/other")
    with pytest.raises(AlreadyExists, match="already used by repository 'sales'"):
        lake.create_repository("other", storage_namespace=f"file://{tmp_path}/sales")
    repo.create_branch("dev", source="main")
    with pytest.raises(AlreadyExists):
        repo.create_branch("dev", source="main")


def test_bad_arguments(lake: Lake, repo) -> None:
    with pytest.raises(ConfigurationError):
        lake.create_repository("abc", storage_namespace="/no/scheme")
    with pytest.raises(InvalidArgument):
        repo.branch("main").upload("", b"x")
    with pytest.raises(InvalidArgument):
        repo.branch("main").upload("a", "text")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        repo.branch("main").commit("  ")
    with pytest.raises(InvalidArgument, match="default branch"):
        repo.delete_branch("main")


def test_missing_range_file_is_corrupted_data_naming_it(repo, tmp_path: Path) -> None:
    main = repo.branch("main")
    main.upload("a", b"1")
    main.commit("a")
    ranges = list((tmp_path / "sales" / "_branchwater" / "ranges").iterdir())
    assert ranges
    for r in ranges:
        r.unlink()
    uncached = Lake(Graveler(repo.lake.graveler.kv))
    with pytest.raises(CorruptedData, match=ranges[0].name):
        list(uncached.repository("sales").branch("main").list())


def test_delete_repository_hides_it_at_once_and_drops_partitions(lake: Lake, repo) -> None:
    main = repo.branch("main")
    main.upload("a", b"1")
    main.commit("a")
    main.upload("b", b"2")
    partition = repo.record.partition
    lake.delete_repository("sales")
    with pytest.raises(NotFound):
        lake.repository("sales")
    lake.graveler.wait_for_background()
    kv = lake.graveler.kv
    assert list(kv.scan(partition)) == []
    assert list(lake.graveler.refs.partitions_to_delete()) == []


def test_refs_dump_and_restore(lake: Lake, repo, tmp_path: Path) -> None:
    dump = tmp_path / "refs.json"
    restored, expected = dumped_and_recreated(lake, repo, dump)
    restored.restore_refs(dump)
    assert [c.id for c in restored.log("dev")] == expected
    assert restored.ref("v1").read("b") == b"2"
    with pytest.raises(InvalidArgument, match="not bare"):
        restored.restore_refs(dump)


def test_restoring_refs_onto_a_branch_that_refuses_resets_is_refused_before_any_write(
    lake: Lake, repo, tmp_path: Path
) -> None:
    """Restoring moves the bare repository's default branch as a reset would."""
    dump = tmp_path / "refs.json"
    restored, expected = dumped_and_recreated(lake, repo, dump)
    restored.protect("main", no_reset=True)
    head = restored.branch("main").commit_id
    with pytest.raises(BranchProtected, match="no_reset"):
        restored.restore_refs(dump)
    assert restored.branch("main").commit_id == head
    assert [b.name for b in restored.branches()] == ["main"]
    assert len(list(restored.log("main"))) == 1
    restored.unprotect("main")
    restored.restore_refs(dump)
    assert [c.id for c in restored.log("dev")] == expected


def test_a_dump_holding_a_commit_larger_than_new_commits_may_be_restores(
    lake: Lake, repo, tmp_path: Path
) -> None:
    """Lakes took any commit message before records were bounded: their dumps restore."""
    g, main = lake.graveler, repo.branch("main")
    head = g.refs.get_commit(repo.record, main.commit_id)
    large = g.refs.add_commit(repo.record, (head,), head.metarange_id, "x" * 200_000)
    branch, predicate = g.refs.get_branch(repo.record, "main")
    g.refs.set_branch_if(repo.record, dataclasses.replace(branch, commit_id=large.id), predicate)
    dump = tmp_path / "refs.json"
    repo.dump_refs(dump)
    lake.delete_repository("sales")
    lake.graveler.wait_for_background()
    restored = lake.create_repository("sales", storage_namespace=repo.storage_namespace)
    restored.restore_refs(dump)
    assert restored.branch("main").head().message == "x" * 200_000


def _damage(document: dict, how: str) -> None:
    commits, tags, branches = document["commits"], document["tags"], document["branches"]
    if how == "edited commit":
        commits[-1]["message"] = "rewritten"
    elif how == "commit without a field":
        del commits[-1]["metarange_id"]
    elif how == "commits not a list":
        document["commits"] = 5
    elif how == "parent left out":
        child = next(c for c in commits if c["parents"])
        commits.remove(next(c for c in commits if c["id"] == child["parents"][0]))
    elif how == "tag on a commit left out":
        tags[0]["commit_id"] = "0" * 64
    elif how == "branch named badly":
        branches[-1]["name"] = "two words"


@pytest.mark.parametrize(
    ("how", "says"),
    [
        ("edited commit", "does not hold the content its id was computed from"),
        ("commit without a field", "argument: 'metarange_id'"),
        ("commits not a list", "is damaged"),
        ("parent left out", "is not in it"),
        ("tag on a commit left out", "'tag v1' points at commit 000000000000"),
        ("branch named badly", "invalid branch name 'two words'"),
    ],
)
def test_a_damaged_refs_dump_is_refused_before_anything_is_restored(
    lake: Lake, repo, tmp_path: Path, how: str, says: str
) -> None:
    dump = tmp_path / "refs.json"
    restored, expected = dumped_and_recreated(lake, repo, dump)
    document = json.loads(dump.read_text())
    _damage(document, how)
    damaged = tmp_path / "damaged.json"
    damaged.write_text(json.dumps(document))

    with pytest.raises(CorruptedData, match=re.escape(says)):
        restored.restore_refs(damaged)

    restored.restore_refs(dump)
    assert [c.id for c in restored.log("dev")] == expected


def test_writer_is_not_blocked_while_a_commit_applies(lake: Lake, repo, monkeypatch) -> None:
    """A write completes while a commit is stuck inside its slow apply phase."""
    main = repo.branch("main")
    for i in range(50):
        main.upload(f"big/{i}", b"x")
    committed = lake.graveler.committed(repo.record)
    entered, release = threading.Event(), threading.Event()
    original_apply = committed.apply_rows

    def slow_apply(base, changes, head):
        entered.set()
        assert release.wait(10)
        return original_apply(base, changes, head)

    monkeypatch.setattr(committed, "apply_rows", slow_apply)
    result: dict[str, object] = {}
    committer = threading.Thread(target=lambda: result.setdefault("c", main.commit("big")))
    committer.start()
    assert entered.wait(10)
    main.upload("during", b"w")
    assert main.read("during") == b"w"
    release.set()
    committer.join(10)
    assert result["c"].message == "big"
    assert [c.path for c in main.uncommitted()] == ["during"]
    assert len(list(repo.ref("main").list(prefix="big/"))) == 50


def test_concurrent_earlier_commit_is_reused_not_lost(lake: Lake, repo) -> None:
    """Two commits racing: the loser commits only what is left, on top of the winner."""
    main = repo.branch("main")
    main.upload("a", b"1")
    g, record = lake.graveler, repo.record
    first_tokens = commit_ops.seal(g, record, "main")
    main.upload("b", b"2")
    second = main.commit("second")
    assert {e.path for e in repo.ref(second.id).list()} == {"a", "b"}
    with pytest.raises(NoChanges, match="concurrent commit"):
        commit_ops._finish(g, record, "main", first_tokens, "first", {}, "", False)
    assert [c.message for c in repo.log("main")] == ["second", "Repository created"]


def test_concurrent_commit_that_took_part_of_our_tokens(lake: Lake, repo) -> None:
    """An earlier commit finishes first with its tokens; ours rebuilds on it with the rest."""
    main = repo.branch("main")
    g, record = lake.graveler, repo.record
    main.upload("a", b"1")
    earlier = commit_ops.seal(g, record, "main")
    main.upload("b", b"2")
    later = commit_ops.seal(g, record, "main")
    assert later.tokens[1:] == earlier.tokens
    first = commit_ops._finish(g, record, "main", earlier, "earlier", {}, "", False)
    second = commit_ops._finish(g, record, "main", later, "later", {}, "", False)
    assert second.parents == (first.id,)
    assert {e.path for e in repo.ref(first.id).list()} == {"a"}
    assert {e.path for e in repo.ref(second.id).list()} == {"a", "b"}
    assert g.read_branch(record, "main").sealed_tokens == ()


def test_background_drops_survive_a_crash(lake: Lake, repo) -> None:
    main = repo.branch("main")
    main.upload("a", b"1")
    token = lake.graveler.read_branch(repo.record, "main").staging_token
    lake.graveler.refs.mark_partitions_for_deletion("tokens/crashed", [token.encode()])
    assert lake.graveler.collect_dropped_partitions() == 1
    assert list(lake.graveler.kv.scan(token.encode())) == []


@pytest.mark.parametrize("guarded", [False, True], ids=["listed", "let-go"])
def test_the_next_drop_finishes_the_drops_old_enough_to_be_abandoned(
    lake: Lake, repo, guarded: bool
) -> None:
    """The next commit's cleanup finishes a listed drop over `ABANDONED_DROP_S` old (a
    recent one may still be under way in its own process), and a guarded one whose branch
    has let go of its tokens once it is `LET_GO_DROP_S` old: younger, the process that
    listed it drops it right after its update. A call with no ages finishes every one at
    once."""
    g = lake.graveler
    guard = BranchGuard(repo.record.partition, "main") if guarded else None
    age = LET_GO_DROP_S if guarded else ABANDONED_DROP_S
    for name in ("old", "recent"):
        g.staging.put(f"orphan-{name}", "x", None)
    g.refs.mark_partitions_for_deletion("tokens/old", [b"orphan-old"], time.time() - age - 1, guard)
    g.refs.mark_partitions_for_deletion("tokens/recent", [b"orphan-recent"], guard=guard)

    main = repo.branch("main")
    main.upload("a", b"1")
    main.commit("a")
    assert lake.wait_for_cleanup(timeout=30)

    assert list(g.kv.scan(b"orphan-old")) == []
    assert len(list(g.kv.scan(b"orphan-recent"))) == 1
    assert [m.mark for m in g.refs.partitions_to_delete()] == ["tokens/recent"]
    assert g.collect_dropped_partitions() == 1
    assert list(g.kv.scan(b"orphan-recent")) == []


def test_a_guarded_drop_waits_until_its_branch_lets_go_of_the_tokens(lake: Lake, repo) -> None:
    """Tokens listed before the update that lets go of them: a lost race unlists them, and a
    listing whose branch still names them is left alone, however old, until it does not."""
    g, record = lake.graveler, repo.record
    main = repo.branch("main")
    main.upload("a", b"1")
    branch, _ = g.refs.get_branch(record, "main")
    token = branch.staging_token
    assert not g.update_branch_dropping(record, branch, b"not the stored record", (token,))
    assert list(g.refs.partitions_to_delete()) == []

    guard = BranchGuard(record.partition, "main")
    old = time.time() - 2 * 3600
    g.refs.mark_partitions_for_deletion("tokens/in-use", [token.encode()], old, guard)
    assert g.collect_dropped_partitions() == 0
    assert main.read("a") == b"1"

    main.commit("a")
    assert lake.wait_for_cleanup(timeout=30)
    assert list(g.kv.scan(token.encode())) == []
    assert list(g.refs.partitions_to_delete()) == []


def test_commit_reports_progress_and_cleanup_can_be_awaited(tmp_path: Path) -> None:
    """`progress` hears every 10,000 staged entries and the total; `wait_for_cleanup` returns
    once the committed token's rows are gone."""
    mtime = datetime(2026, 11, 1, tzinfo=timezone.utc)
    seen: list[int] = []
    with Lake.connect("memory://") as lake:
        repo = lake.create_repository("bulk", storage_namespace=f"file://{tmp_path}/bulk")
        token = lake.graveler.read_branch(repo.record, "main").staging_token
        for i in range(25_000):
            path = f"p/{i:06d}"
            lake.graveler.staging.put(token, path, Entry(path, f"data/{i}", 1, "c", mtime))

        repo.branch("main").commit("bulk", progress=seen.append)

        assert seen == [10_000, 20_000, 25_000]
        assert lake.wait_for_cleanup(timeout=30)
        assert list(lake.graveler.kv.scan(token.encode())) == []
        assert lake.wait_for_cleanup(timeout=0)


def test_reporting_counts_in_batches_and_ends_with_the_total() -> None:
    seen: list[int] = []
    assert list(reporting(iter("abcdefg"), seen.append, 3)) == list("abcdefg")
    assert seen == [3, 6, 7]
    seen.clear()
    assert list(reporting("abcdef", seen.append, 3)) == list("abcdef")
    assert seen == [3, 6]
    seen.clear()
    assert list(reporting([], seen.append, 3)) == []
    assert seen == []


def _commit_in_child(lake: Lake, answer: mp.Queue) -> None:
    main = lake.repository("sales").branch("main")
    main.upload("child.csv", b"2")
    answer.put(main.commit("from the child").id)
    lake.close()
    answer.put("closed")


def test_a_lake_used_before_a_fork_commits_and_closes_in_the_child(tmp_path: Path) -> None:
    """The child has none of its parent's threads: it stores ranges and drops committed tokens
    on threads of its own, and waits for none of its parent's work."""
    with Lake.connect(f"sqlite:///{tmp_path}/lake.db") as lake:
        main = lake.create_repository("sales", f"file://{tmp_path}/sales").branch("main")
        main.upload("parent.csv", b"1")
        main.commit("from the parent")
        context = mp.get_context("fork")
        answer = context.Queue()
        child = context.Process(target=_commit_in_child, args=(lake, answer))
        child.start()
        try:
            commit_id = answer.get(timeout=60)
            assert answer.get(timeout=60) == "closed"
        finally:
            child.join(60)
            if child.is_alive():
                child.kill()
        assert child.exitcode == 0
        assert main.head().id == commit_id
        assert [entry.path for entry in main.list()] == ["child.csv", "parent.csv"]
