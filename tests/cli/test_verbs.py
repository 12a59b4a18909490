"""The verbs of the `branchwater` command line, end to end against a fresh lake."""

from __future__ import annotations

import io
import json
import shlex
import sys
from pathlib import Path

import pytest

from branchwater.engine.cli import main
from branchwater.engine.graveler.graveler import Graveler
from tests.helpers.cli import Bw, CliLake, assert_user_error, local_file, make_repo, ok

# ------------------------------------------------------------------------------ walk-through


def test_walk_through(bw: Bw, lake: CliLake) -> None:
    make_repo(bw, lake)
    assert "sales" in ok(bw("repo", "list")).out
    assert "'etl'" in ok(bw("branch", "create", "sales", "etl", "--source", "main")).out
    ok(bw("upload", "sales", "etl", "tables/a.csv", local_file(lake, "a.csv", b"id\n1\n")))
    ok(bw("upload", "sales", "etl", "tables/b.csv", local_file(lake, "b.csv", b"x" * 2048)))

    listing = ok(bw("ls", "sales", "etl")).out.splitlines()
    assert [line.split()[-1] for line in listing] == ["tables/a.csv", "tables/b.csv"]
    assert listing[0].split()[:2] == ["5", "B"] and listing[1].split()[:2] == ["2.0", "KiB"]
    assert ok(bw("cat", "sales", "etl", "tables/a.csv")).out == "id\n1\n"
    assert ok(bw("uncommitted", "sales", "etl")).out == "+ tables/a.csv\n+ tables/b.csv\n"

    assert "first load" in ok(bw("commit", "sales", "etl", "-m", "first load")).out
    ok(bw("rm", "sales", "etl", "tables/b.csv"))
    ok(bw("upload", "sales", "etl", "tables/a.csv", local_file(lake, "a2.csv", b"id\n2\n")))
    assert ok(bw("uncommitted", "sales", "etl")).out == "~ tables/a.csv\n- tables/b.csv\n"
    ok(bw("commit", "sales", "etl", "-m", "second load"))

    log = ok(bw("log", "sales", "etl")).out
    messages = [line.strip() for line in log.splitlines() if line.startswith("    ")]
    assert messages == ["second load", "first load", "Repository created"]
    assert log.count("commit ") == 3 and "Author: tester" in log and "Date:   " in log

    assert ok(bw("diff", "sales", "main", "etl")).out == "+ tables/a.csv\n"
    assert ok(bw("diff", "sales", "etl~1", "etl")).out == "~ tables/a.csv\n- tables/b.csv\n"
    assert ok(bw("ls", "sales", "main")).out == ""  # main never saw the branch's work

    ok(bw("tag", "create", "sales", "v1", "etl~1"))
    assert ok(bw("cat", "sales", "v1", "tables/b.csv")).out == "x" * 2048
    assert ok(bw("cat", "sales", "v1", "tables/a.csv")).out == "id\n1\n"
    assert ok(bw("cat", "sales", "etl", "tables/a.csv")).out == "id\n2\n"
    tags = ok(bw("tag", "list", "sales")).out.splitlines()
    assert tags[0].split() == ["TAG", "COMMIT"] and tags[1].split()[0] == "v1"


def test_ls_on_a_branch_includes_uncommitted_but_a_commit_does_not(bw: Bw, lake: CliLake) -> None:
    make_repo(bw, lake)
    ok(bw("upload", "sales", "main", "a", local_file(lake, "a", b"1")))
    ok(bw("commit", "sales", "main", "-m", "a"))
    ok(bw("upload", "sales", "main", "b", local_file(lake, "b", b"2")))
    head = json.loads(ok(bw("--json", "log", "sales", "main", "--limit", "1")).out)[0]["id"]
    assert [e["path"] for e in json.loads(ok(bw("--json", "ls", "sales", "main")).out)] == [
        "a",
        "b",
    ]
    by_commit = json.loads(ok(bw("--json", "ls", "sales", head[:12])).out)
    assert [e["path"] for e in by_commit] == ["a"]


def test_ls_prefix_after_and_limit(bw: Bw, lake: CliLake) -> None:
    make_repo(bw, lake)
    for path in ("x/1", "x/2", "x/3", "y/1"):
        ok(bw("upload", "sales", "main", path, local_file(lake, "f", path.encode())))

    def paths(*args: str) -> list[str]:
        return [e["path"] for e in json.loads(ok(bw("--json", "ls", "sales", "main", *args)).out)]

    assert paths("x/") == ["x/1", "x/2", "x/3"]
    assert paths("x/", "--after", "x/1") == ["x/2", "x/3"]
    assert paths("--limit", "2") == ["x/1", "x/2"]
    assert paths("y/", "--limit", "5") == ["y/1"]


def test_upload_from_stdin_round_trips_binary(
    lake: CliLake, monkeypatch: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    data = bytes(range(256)) * 3
    kv = ["--kv", lake.kv]
    assert main([*kv, "repo", "create", "bin", "--namespace", f"{lake.namespace}/bin"]) == 0
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert main([*kv, "upload", "bin", "main", "blob", "-"]) == 0
    capsysbinary.readouterr()
    assert main([*kv, "cat", "bin", "main", "blob"]) == 0
    assert capsysbinary.readouterr().out == data


def test_upload_if_absent_creates_once_then_exits_1_naming_the_path(bw: Bw, lake: CliLake) -> None:
    make_repo(bw, lake)
    file = local_file(lake, "lock", b"mine")
    ok(bw("upload", "sales", "main", "lock", file, "--if-absent"))
    assert_user_error(
        bw("upload", "sales", "main", "lock", file, "--if-absent"), 1, "'lock' exists"
    )
    ok(bw("upload", "sales", "main", "lock", file))


def test_branch_reset_and_delete_repo_delete_tag_delete(bw: Bw, lake: CliLake) -> None:
    make_repo(bw, lake)
    ok(bw("branch", "create", "sales", "dev", "--source", "main"))
    ok(bw("upload", "sales", "dev", "p", local_file(lake, "p", b"p")))
    ok(bw("branch", "reset", "sales", "dev"))
    assert ok(bw("uncommitted", "sales", "dev")).out == ""
    assert ok(bw("ls", "sales", "dev")).out == ""

    ok(bw("tag", "create", "sales", "t1", "dev"))
    ok(bw("tag", "delete", "sales", "t1"))
    assert json.loads(ok(bw("--json", "tag", "list", "sales")).out) == []

    ok(bw("branch", "delete", "sales", "dev"))
    names = [b["name"] for b in json.loads(ok(bw("--json", "branch", "list", "sales")).out)]
    assert names == ["main"]
    ok(bw("repo", "delete", "sales"))
    assert json.loads(ok(bw("--json", "repo", "list")).out) == []


# ------------------------------------------------------------------------------ refs dump


def test_refs_dump_and_restore_into_a_new_bare_repository(bw: Bw, lake: CliLake) -> None:
    """Disaster recovery: the KV store is lost, the namespace survives, the dump rebuilds it."""
    make_repo(bw, lake)
    ok(bw("branch", "create", "sales", "etl", "--source", "main"))
    for n in range(3):
        ok(bw("upload", "sales", "etl", f"f{n}", local_file(lake, f"f{n}", str(n).encode())))
        ok(bw("commit", "sales", "etl", "-m", f"load {n}"))
    ok(bw("tag", "create", "sales", "v1", "etl~1"))
    dump = str(lake.root / "refs.json")
    dumped = json.loads(ok(bw("--json", "refs", "dump", "sales", dump)).out)
    assert dumped["records"] > 0 and Path(dump).is_file()

    fresh_kv = f"sqlite:///{lake.root}/kv2/lake.db"
    namespace = f"{lake.namespace}/sales"
    ok(bw("repo", "create", "sales", "--namespace", namespace, kv=fresh_kv))
    ok(bw("refs", "restore", "sales", dump, kv=fresh_kv))

    for ref in ("etl", "v1", "main"):
        before = json.loads(ok(bw("--json", "log", "sales", ref)).out)
        after = json.loads(ok(bw("--json", "log", "sales", ref, kv=fresh_kv)).out)
        assert after == before
    assert ok(bw("cat", "sales", "v1", "f1", kv=fresh_kv)).out == "1"


def test_refs_restore_refuses_a_repository_with_history(bw: Bw, lake: CliLake) -> None:
    make_repo(bw, lake)
    dump = str(lake.root / "refs.json")
    ok(bw("refs", "dump", "sales", dump))
    ok(bw("upload", "sales", "main", "p", local_file(lake, "p", b"p")))
    ok(bw("commit", "sales", "main", "-m", "not bare any more"))
    assert_user_error(bw("refs", "restore", "sales", dump), 1)


# ------------------------------------------------------------------------------------ merge


def test_merge_then_conflict_exits_2_naming_the_path(bw: Bw, lake: CliLake) -> None:
    make_repo(bw, lake)
    ok(bw("upload", "sales", "main", "p", local_file(lake, "base", b"base")))
    ok(bw("commit", "sales", "main", "-m", "base"))
    ok(bw("branch", "create", "sales", "etl", "--source", "main"))
    ok(bw("upload", "sales", "etl", "p", local_file(lake, "etl", b"etl")))
    ok(bw("commit", "sales", "etl", "-m", "etl"))
    ok(bw("upload", "sales", "main", "q", local_file(lake, "q", b"q")))
    ok(bw("commit", "sales", "main", "-m", "q"))
    merged = json.loads(ok(bw("merge", "sales", "etl", "main", "--json")).out)
    assert merged["attempts"] == 1 and not merged["fast_forward"]
    assert ok(bw("cat", "sales", "main", "p")).out == "etl"

    ok(bw("upload", "sales", "etl", "p", local_file(lake, "etl2", b"etl2")))
    ok(bw("commit", "sales", "etl", "-m", "etl2"))
    ok(bw("upload", "sales", "main", "p", local_file(lake, "main2", b"main2")))
    ok(bw("commit", "sales", "main", "-m", "main2"))
    assert_user_error(bw("merge", "sales", "etl", "main"), 2, "conflicts on 1 path(s): p")
    ok(bw("merge", "sales", "etl", "main", "--strategy", "source-wins"))
    assert ok(bw("cat", "sales", "main", "p")).out == "etl2"


@pytest.mark.parametrize("tampered", [False, True])
def test_a_merge_that_lost_every_race_prints_the_hint_its_rerun_takes(
    bw: Bw, lake: CliLake, monkeypatch: pytest.MonkeyPatch, tampered: bool
) -> None:
    """The hint passed back resumes the merge's work; one not its own (here, its tag
    altered) is said on a warning line, and the merge is made afresh."""
    make_repo(bw, lake)
    ok(bw("branch", "create", "sales", "etl", "--source", "main"))
    ok(bw("upload", "sales", "etl", "p", local_file(lake, "p", b"p")))
    ok(bw("commit", "sales", "etl", "-m", "p"))
    ok(bw("upload", "sales", "main", "q", local_file(lake, "q", b"q")))
    ok(bw("commit", "sales", "main", "-m", "q"))
    with monkeypatch.context() as patch:
        patch.setattr(Graveler, "try_update_branch", lambda *args, **kwargs: False)
        lost = bw("merge", "sales", "etl", "main")
    assert_user_error(lost, 2, "(from the CLI: merge again with --hint ")
    hint = shlex.split(lost.err.rpartition("--hint ")[2].removesuffix(")\n"))[0]
    rerun = bw("merge", "sales", "etl", "main", "--hint", hint + "x" * tampered, "--json")
    assert rerun.code == 0, rerun.err
    warned = rerun.err.splitlines()
    if tampered:
        assert len(warned) == 1 and warned[0].startswith("branchwater: warning: merge hint")
        assert warned[0].endswith("merging afresh")
    else:
        assert warned == []
    merged = json.loads(rerun.out)
    assert merged["attempts"] == 1 and not merged["fast_forward"]
    assert ok(bw("cat", "sales", "main", "p")).out == "p"


@pytest.mark.parametrize("hint", ["garbage", "abc@def", "abc.def", "@onto.tag", "tree@.tag"])
def test_a_malformed_merge_hint_is_refused_before_merging(bw: Bw, lake: CliLake, hint: str) -> None:
    """The engine merges afresh past a hint that is not the merge's own work, with a warning;
    text no merge could have printed is a typo, refused on one line."""
    make_repo(bw, lake)
    ok(bw("branch", "create", "sales", "etl", "--source", "main"))
    ok(bw("upload", "sales", "etl", "p", local_file(lake, "p", b"p")))
    ok(bw("commit", "sales", "etl", "-m", "p"))
    head = json.loads(ok(bw("--json", "log", "sales", "main", "--limit", "1")).out)[0]["id"]
    assert_user_error(
        bw("merge", "sales", "etl", "main", "--hint", hint),
        1,
        f"argument --hint: {hint!r} is not a merge hint",
        "lost every race",
        "METARANGE@COMMIT.TAG",
    )
    assert json.loads(ok(bw("--json", "log", "sales", "main", "--limit", "1")).out)[0]["id"] == head


def test_merge_no_ff_writes_a_merge_commit_that_log_where_finds(bw: Bw, lake: CliLake) -> None:
    make_repo(bw, lake)
    ok(bw("branch", "create", "sales", "etl", "--source", "main"))
    ok(bw("upload", "sales", "etl", "p", local_file(lake, "p", b"p")))
    ok(bw("commit", "sales", "etl", "-m", "p", "--meta", "run=1"))
    merge = ["merge", "sales", "etl", "main", "--no-ff", "-m", "merge p", "--meta", "run=1"]
    merged = json.loads(ok(bw(*merge, "--json")).out)
    assert not merged["fast_forward"] and merged["message"] == "merge p"
    assert merged["parents"][1] == json.loads(ok(bw("--json", "log", "sales", "etl")).out)[0]["id"]
    assert_user_error(bw("merge", "sales", "etl", "main", "--no-ff"), 1, "already contains")

    found = json.loads(ok(bw("--json", "log", "sales", "main", "--where", "run=1")).out)
    assert [c["message"] for c in found] == ["merge p", "p"]
    both = ["--where", "run=1", "--where", "branchwater.merge.bases=" + merged["parents"][0]]
    assert [c["id"] for c in json.loads(ok(bw("--json", "log", "sales", "main", *both)).out)] == [
        merged["id"]
    ]
    assert ok(bw("log", "sales", "main", "--where", "run=2")).out == ""
    by_path = ["--json", "log", "sales", "main", "--path", "p", "--path", "q/"]
    assert [c["message"] for c in json.loads(ok(bw(*by_path)).out)] == ["merge p", "p"]
    assert ok(bw("log", "sales", "main", "--path", "q/")).out == ""
    assert_user_error(bw("log", "sales", "main", "--where", "run"), 1, "expected KEY=VALUE")
