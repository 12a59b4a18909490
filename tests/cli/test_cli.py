"""The `branchwater` command line: verbs, output formats and the exit-code contract.

Most tests drive `main([...])` in-process (fast, and capsys sees exactly what a user would);
the subprocess tests prove the installed entry points exit with the same codes.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple, Protocol

import pytest

from branchwater.engine import api, cli
from branchwater.engine.errors import Conflict, TooManyTries


class Run(NamedTuple):
    code: int
    out: str
    err: str


class Lake(NamedTuple):
    kv: str
    namespace: str
    root: Path


class Bw(Protocol):
    """The in-process CLI runner; `kv=None` leaves the lake to `$BRANCHWATER_KV_URL` or default."""

    def __call__(self, *args: str, kv: str | None = ...) -> Run: ...


@pytest.fixture
def lake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Lake:
    """A fresh SQLite lake and file:// namespace; the cwd and env cannot leak another lake."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(cli.KV_ENV, raising=False)
    monkeypatch.setenv(cli.COMMITTER_ENV, "tester")
    return Lake(f"sqlite:///{tmp_path}/kv/lake.db", f"file://{tmp_path}/ns", tmp_path)


@pytest.fixture
def bw(lake: Lake, capsys: pytest.CaptureFixture[str]) -> Bw:
    """Run the CLI in-process against `lake`; returns exit code, stdout and stderr."""

    def run(*args: str, kv: str | None = lake.kv) -> Run:
        argv = ["--kv", kv, *args] if kv else list(args)
        code = cli.main(argv)
        captured = capsys.readouterr()
        return Run(code, captured.out, captured.err)

    return run


def ok(result: Run) -> Run:
    assert result.code == 0, result.err
    assert result.err == ""
    return result


def assert_user_error(result: Run, code: int, *fragments: str) -> None:
    """The error contract: the code, one stderr line in the fixed format, nothing on stdout."""
    assert result.code == code, result
    assert result.out == ""
    assert "Traceback" not in result.err
    lines = result.err.splitlines()
    assert len(lines) == 1, result.err
    assert lines[0].startswith("branchwater: error: ")
    for fragment in fragments:
        assert fragment in lines[0]


def make_repo(bw, lake: Lake, name: str = "sales") -> None:
    ok(bw("repo", "create", name, "--namespace", f"{lake.namespace}/{name}"))


def local_file(lake: Lake, name: str, data: bytes) -> str:
    path = lake.root / name
    path.write_bytes(data)
    return str(path)


# ------------------------------------------------------------------------------ walk-through


def test_walk_through(bw: Bw, lake: Lake) -> None:
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


def test_ls_on_a_branch_includes_uncommitted_but_a_commit_does_not(bw: Bw, lake: Lake) -> None:
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


def test_ls_prefix_after_and_limit(bw: Bw, lake: Lake) -> None:
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
    lake: Lake, monkeypatch: pytest.MonkeyPatch, capsysbinary: pytest.CaptureFixture[bytes]
) -> None:
    data = bytes(range(256)) * 3
    kv = ["--kv", lake.kv]
    assert cli.main([*kv, "repo", "create", "bin", "--namespace", f"{lake.namespace}/bin"]) == 0
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    assert cli.main([*kv, "upload", "bin", "main", "blob", "-"]) == 0
    capsysbinary.readouterr()
    assert cli.main([*kv, "cat", "bin", "main", "blob"]) == 0
    assert capsysbinary.readouterr().out == data


def test_branch_reset_and_delete_repo_delete_tag_delete(bw: Bw, lake: Lake) -> None:
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


# --------------------------------------------------------------------------------- progress


def staged_two(bw: Bw, lake: Lake) -> None:
    make_repo(bw, lake)
    for name in ("a.csv", "b.csv"):
        ok(bw("upload", "sales", "main", name, local_file(lake, name, b"1\n")))


def test_progress_goes_to_stderr_when_asked_and_results_stay_on_stdout(
    bw: Bw, lake: Lake, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli, "PROGRESS_DELAY", 0.0)
    staged_two(bw, lake)

    result = bw("--progress", "commit", "sales", "main", "-m", "two")

    assert result.code == 0 and result.out.startswith("[main ")
    lines = result.err.split("\n")
    assert lines[0] == "\rApplying staged entries: 2, done."
    assert set(lines[1:-1]) <= {"\rDropping committed staging entries, done."}
    assert lines[-1] == ""


def test_quick_work_and_no_progress_stay_quiet(
    bw: Bw, lake: Lake, monkeypatch: pytest.MonkeyPatch
) -> None:
    staged_two(bw, lake)
    ok(bw("--progress", "commit", "sales", "main", "-m", "quick"))  # done within the delay
    monkeypatch.setattr(cli, "PROGRESS_DELAY", 0.0)
    ok(bw("upload", "sales", "main", "c.csv", local_file(lake, "c.csv", b"2\n")))
    ok(bw("--progress", "commit", "sales", "main", "-m", "off", "--no-progress"))


def test_a_failure_ends_the_progress_line_before_the_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    progress = cli.Progress(enabled=True)
    with pytest.raises(RuntimeError), progress:
        progress.update("Working", 1_500)
        raise RuntimeError("boom")
    assert capsys.readouterr().err == "\rWorking: 1,500\n"


# ------------------------------------------------------------------------------------- JSON


def test_json_output_has_the_documented_fields(bw: Bw, lake: Lake) -> None:
    repo = json.loads(
        ok(bw("--json", "repo", "create", "sales", "--namespace", lake.namespace)).out
    )
    assert repo["name"] == "sales" and repo["default_branch"] == "main"
    assert repo["storage_namespace"] == lake.namespace

    entry = json.loads(
        ok(bw("--json", "upload", "sales", "main", "a.txt", local_file(lake, "a", b"abc"))).out
    )
    assert entry["path"] == "a.txt" and entry["size"] == 3
    assert entry["checksum"] == "900150983cd24fb0d6963f7d28e17f72"  # md5("abc")
    assert {"address", "mtime", "metadata"} <= entry.keys()

    commit = json.loads(
        ok(bw("--json", "commit", "sales", "main", "-m", "load", "--meta", "dag=etl")).out
    )
    assert commit["message"] == "load" and commit["metadata"] == {"dag": "etl"}
    assert commit["committer"] == "tester" and len(commit["parents"]) == 1

    log = json.loads(ok(bw("--json", "log", "sales", "main")).out)
    assert log[0]["id"] == commit["id"] and log[1]["id"] == commit["parents"][0]

    diff = json.loads(ok(bw("--json", "diff", "sales", log[1]["id"], "main")).out)
    assert diff == [{"path": "a.txt", "type": "added", "entry": entry}]

    branches = json.loads(ok(bw("--json", "branch", "list", "sales")).out)
    assert branches == [{"name": "main", "commit_id": commit["id"]}]


def test_json_flag_is_accepted_after_the_verb(bw: Bw, lake: Lake) -> None:
    make_repo(bw, lake)
    listed = json.loads(ok(bw("repo", "list", "--json")).out)
    assert [r["name"] for r in listed] == ["sales"]


# ----------------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("args", "fragments"),
    [
        (("ls", "nosuch", "main"), ("nosuch",)),
        (("repo", "create", "Bad_Name", "--namespace", "file:///tmp/x"), ("Bad_Name",)),
        (("upload", "sales", "main", "p", "/definitely/not/here.csv"), ("not/here.csv",)),
        (("commit", "sales", "main", "-m", "nothing"), ("nothing to commit",)),
        (("cat", "sales", "main", "missing.txt"), ("missing.txt",)),
        (("branch", "create", "sales", "dev", "--source", "nope"), ("nope",)),
        (("refs", "restore", "sales", "/no/such/dump.json"), ("dump.json",)),
    ],
)
def test_user_errors_exit_1_with_one_line(
    bw: Bw, lake: Lake, args: tuple[str, ...], fragments: tuple[str, ...]
) -> None:
    make_repo(bw, lake)
    assert_user_error(bw(*args), 1, *fragments)


def test_unknown_kv_scheme_is_a_user_error(bw: Bw) -> None:
    assert_user_error(bw("repo", "list", kv="redis://localhost/0"), 1, "redis")


@pytest.mark.parametrize(
    "args",
    [
        ("commit", "sales", "main"),  # -m is required
        ("commit", "sales", "main", "-m", "x", "--meta", "novalue"),
        ("ls", "sales", "main", "--limit", "0"),
        ("frobnicate",),
        ("repo",),
    ],
)
def test_usage_errors_exit_1_with_one_line(bw: Bw, args: tuple[str, ...]) -> None:
    assert_user_error(bw(*args), 1, "see 'branchwater")


@pytest.mark.parametrize("error", [Conflict("they disagree"), TooManyTries("lost races")])
def test_conflicts_exit_2(
    bw: Bw, lake: Lake, monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    make_repo(bw, lake)
    ok(bw("upload", "sales", "main", "p", local_file(lake, "p", b"p")))

    def lose(*_args: object, **_kwargs: object) -> None:
        raise error

    monkeypatch.setattr(api.Branch, "commit", lose)
    assert_user_error(bw("commit", "sales", "main", "-m", "x"), 2, str(error))


def test_keyboard_interrupt_exits_130_quietly(bw: Bw, monkeypatch: pytest.MonkeyPatch) -> None:
    def interrupted(_self: object) -> list[object]:
        raise KeyboardInterrupt

    monkeypatch.setattr(api.Lake, "repositories", interrupted)
    assert bw("repo", "list") == Run(130, "", "")


def test_lake_is_closed_on_success_and_on_error(bw: Bw, monkeypatch: pytest.MonkeyPatch) -> None:
    closed: list[bool] = []
    real_close = api.Lake.close

    def close(self: api.Lake) -> None:
        closed.append(True)
        real_close(self)

    monkeypatch.setattr(api.Lake, "close", close)
    ok(bw("repo", "list"))
    assert bw("ls", "nosuch", "main").code == 1
    assert closed == [True, True]


# ------------------------------------------------------------------------ choosing the lake


def test_env_var_selects_the_lake(bw: Bw, lake: Lake, monkeypatch: pytest.MonkeyPatch) -> None:
    env_url = f"sqlite:///{lake.root}/from-env/lake.db"
    monkeypatch.setenv(cli.KV_ENV, env_url)
    ok(bw("repo", "create", "viaenv", "--namespace", lake.namespace, kv=None))
    assert (lake.root / "from-env" / "lake.db").is_file()
    assert "viaenv" in ok(bw("repo", "list", kv=env_url)).out
    assert ok(bw("repo", "list", kv=lake.kv)).out == ""  # --kv wins over the env var
    assert not (lake.root / ".branchwater").exists()


def test_default_lake_is_created_under_the_cwd(bw: Bw, lake: Lake) -> None:
    ok(bw("repo", "create", "local", "--namespace", lake.namespace, kv=None))
    assert (lake.root / ".branchwater" / "lake.db").is_file()
    assert "local" in ok(bw("repo", "list", kv=None)).out


# ------------------------------------------------------------------------------ refs dump


def test_refs_dump_and_restore_into_a_new_bare_repository(bw: Bw, lake: Lake) -> None:
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


def test_refs_restore_refuses_a_repository_with_history(bw: Bw, lake: Lake) -> None:
    make_repo(bw, lake)
    dump = str(lake.root / "refs.json")
    ok(bw("refs", "dump", "sales", dump))
    ok(bw("upload", "sales", "main", "p", local_file(lake, "p", b"p")))
    ok(bw("commit", "sales", "main", "-m", "not bare any more"))
    assert_user_error(bw("refs", "restore", "sales", dump), 1)


# ---------------------------------------------------------------------------- entry points


def run_module(lake: Lake, *args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if k != cli.KV_ENV}
    return subprocess.run(
        [sys.executable, "-m", "branchwater.engine.cli", "--kv", lake.kv, *args],
        input=stdin,
        capture_output=True,
        cwd=lake.root,
        env=env,
        timeout=120,
        check=False,
    )


def test_module_entry_point_exit_codes_and_stdin(lake: Lake) -> None:
    created = run_module(lake, "repo", "create", "proc", "--namespace", lake.namespace)
    assert created.returncode == 0, created.stderr
    uploaded = run_module(lake, "upload", "proc", "main", "in.bin", "-", stdin=b"\x00\xffdata")
    assert uploaded.returncode == 0, uploaded.stderr
    assert run_module(lake, "cat", "proc", "main", "in.bin").stdout == b"\x00\xffdata"

    missing = run_module(lake, "ls", "nosuch", "main")
    assert missing.returncode == 1
    assert missing.stderr.decode().startswith("branchwater: error: ")
    assert b"Traceback" not in missing.stderr and missing.stderr.count(b"\n") == 1

    usage = run_module(lake, "commit", "proc", "main")
    assert usage.returncode == 1 and b"Traceback" not in usage.stderr


def test_console_script_is_installed() -> None:
    script = Path(sys.executable).with_name("branchwater")
    if not script.exists():
        pytest.skip(f"console script not installed next to {sys.executable}")
    result = subprocess.run(
        [str(script), "--version"], capture_output=True, timeout=60, check=False
    )
    assert result.returncode == 0
    assert result.stdout.decode().startswith("branchwater ")
    bad = subprocess.run(
        [str(script), "--kv", "bogus://x", "repo", "list"],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 1 and b"bogus" in bad.stderr and b"Traceback" not in bad.stderr


def test_merge_then_conflict_exits_2_naming_the_path(bw: Bw, lake: Lake) -> None:
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
