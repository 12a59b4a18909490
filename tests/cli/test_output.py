"""What `branchwater` prints: progress on stderr, results on stdout, `--json` documents."""

from __future__ import annotations

import errno
import json
import sys

import pytest

from branchwater.engine.cli import app, main
from branchwater.engine.cli.progress import Progress
from tests.helpers.cli import Bw, CliLake, assert_user_error, local_file, make_repo, ok

# --------------------------------------------------------------------------------- progress


def staged_two(bw: Bw, lake: CliLake) -> None:
    make_repo(bw, lake)
    for name in ("a.csv", "b.csv"):
        ok(bw("upload", "sales", "main", name, local_file(lake, name, b"1\n")))


def test_progress_goes_to_stderr_when_asked_and_results_stay_on_stdout(
    bw: Bw, lake: CliLake, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(app, "PROGRESS_DELAY", 0.0)
    staged_two(bw, lake)

    result = bw("--progress", "commit", "sales", "main", "-m", "two")

    assert result.code == 0 and result.out.startswith("[main ")
    lines = result.err.split("\n")
    assert lines[0] == "\rApplying staged entries: 2, done."
    assert set(lines[1:-1]) <= {"\rDropping committed staging entries, done."}
    assert lines[-1] == ""


def test_quick_work_and_no_progress_stay_quiet(
    bw: Bw, lake: CliLake, monkeypatch: pytest.MonkeyPatch
) -> None:
    staged_two(bw, lake)
    ok(bw("--progress", "commit", "sales", "main", "-m", "quick"))  # done within the delay
    monkeypatch.setattr(app, "PROGRESS_DELAY", 0.0)
    ok(bw("upload", "sales", "main", "c.csv", local_file(lake, "c.csv", b"2\n")))
    ok(bw("--progress", "commit", "sales", "main", "-m", "off", "--no-progress"))


def test_a_failure_ends_the_progress_line_before_the_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    progress = Progress(enabled=True)
    with pytest.raises(RuntimeError), progress:
        progress.update("Working", 1_500)
        raise RuntimeError("boom")
    assert capsys.readouterr().err == "\rWorking: 1,500\n"


# ------------------------------------------------------------------------------------- JSON


def test_json_output_has_the_documented_fields(bw: Bw, lake: CliLake) -> None:
    repo = json.loads(
        ok(bw("--json", "repo", "create", "sales", "--namespace", lake.namespace)).out
    )
    assert repo["name"] == "sales" and repo["default_branch"] == "main"
    assert repo["storage_namespace"] == lake.namespace

    entry = json.loads(
        ok(bw("--json", "upload", "sales", "main", "a.txt", local_file(lake, "a", b"abc"))).out
    )
    assert entry["path"] == "a.txt" and entry["size"] == 3
    assert entry["checksum"] == (  # sha256("abc")
        "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
    )
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


def test_json_flag_is_accepted_after_the_verb(bw: Bw, lake: CliLake) -> None:
    make_repo(bw, lake)
    listed = json.loads(ok(bw("repo", "list", "--json")).out)
    assert [r["name"] for r in listed] == ["sales"]


def test_a_created_branch_prints_the_form_branch_list_prints(bw: Bw, lake: CliLake) -> None:
    make_repo(bw, lake)
    created = json.loads(
        ok(bw("--json", "branch", "create", "sales", "dev", "--source", "main")).out
    )
    listed = json.loads(ok(bw("--json", "branch", "list", "sales")).out)
    assert (
        created
        == {"repository": "sales", **listed[0]}
        == {
            "repository": "sales",
            "name": "dev",
            "commit_id": listed[1]["commit_id"],
        }
    )


@pytest.mark.parametrize("argv", [["--json", "cat"], ["cat", "--json"]])
def test_cat_refuses_json_since_an_object_is_bytes(bw: Bw, lake: CliLake, argv: list[str]) -> None:
    make_repo(bw, lake)
    ok(bw("upload", "sales", "main", "a.csv", local_file(lake, "a", b"id\n1\n")))
    assert_user_error(
        bw(*argv, "sales", "main", "a.csv"), 1, "cat writes an object's bytes", "drop --json"
    )


# ----------------------------------------------------------------------- hostile text


def test_a_path_or_metadata_that_would_drive_the_terminal_is_quoted_as_git_quotes_paths(
    bw: Bw, lake: CliLake
) -> None:
    """A line break in a path would split a listing's line (`ls | while read`), an escape
    sequence would recolour or clear the terminal; `--json` carries both unchanged."""
    make_repo(bw, lake)
    hostile, plain = 'evil\x1b[2J\nfake.csv\r"q"\\\u2028', "plain name é.csv"
    quoted = '"evil\\x1b[2J\\nfake.csv\\r\\"q\\"\\\\\\u2028"'
    file = local_file(lake, "a.csv", b"1\n")
    assert ok(bw("upload", "sales", "main", hostile, file)).out.startswith(f"Uploaded {quoted} ")
    ok(bw("upload", "sales", "main", plain, file))
    assert ok(bw("uncommitted", "sales", "main")).out.splitlines() == [f"+ {quoted}", f"+ {plain}"]
    listed = ok(bw("ls", "sales", "main")).out.splitlines()
    assert [line.split("  ")[-1] for line in listed] == [quoted, plain]
    entries = json.loads(ok(bw("--json", "ls", "sales", "main")).out)
    assert [e["path"] for e in entries] == [hostile, plain]
    copied = ok(bw("cp", "sales", "main", hostile, "copy")).out
    assert copied.startswith(f"Copied {quoted} to copy ")
    assert ok(bw("rm", "sales", "main", hostile)).out.startswith(f"Removed {quoted} ")
    ok(bw("commit", "sales", "main", "-m", "m", "--meta", "k=v\x1b[0m\nMeta:   fake=1"))
    log = ok(bw("log", "sales", "main", "--limit", "1")).out
    assert 'Meta:   k="v\\x1b[0m\\nMeta:   fake=1"' in log.splitlines()
    record = ("checks", "record", "sales", "main", "q", "--passed", "--by", "gx\nq  passed")
    ok(bw(*record))
    checks = ok(bw("checks", "sales", "main")).out.splitlines()
    assert len(checks) == 2 and '"gx\\nq  passed"' in checks[1]


class ShortWrites:
    """Stdout on a disk with room for `room` bytes, as a redirected stdout behaves there:
    a write takes what fits and says so only in its count; one with no room left raises."""

    encoding = "utf-8"
    errors = "strict"

    def __init__(self, room: int) -> None:
        self.room = room
        self.taken = bytearray()
        self.buffer = self

    def write(self, data: bytes) -> int:
        if not self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        taken = bytes(data[: self.room])
        self.taken += taken
        self.room -= len(taken)
        return len(taken)

    def flush(self) -> None:
        pass


@pytest.mark.parametrize("json_output", [False, True], ids=["cat", "--json ls"])
def test_output_the_disk_takes_only_in_part_fails_the_command(
    bw: Bw,
    lake: CliLake,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    json_output: bool,
) -> None:
    """`cat … > file && ship file` must not ship a truncated file: exit 0 with 64 KiB of
    3 MB written was what a full disk gave."""
    make_repo(bw, lake)
    data = bytes(range(256)) * 400
    ok(bw("upload", "sales", "main", "big.bin", local_file(lake, "big.bin", data)))
    for i in range(60):
        ok(bw("upload", "sales", "main", f"p/{i:04d}", local_file(lake, "p", b"x")))
    full = ShortWrites(4_096)
    monkeypatch.setattr(sys, "stdout", full)
    command = (
        ["--json", "ls", "sales", "main", "p/"]
        if json_output
        else ["cat", "sales", "main", "big.bin"]
    )
    code = main(["--kv", lake.kv, *command])
    assert code == 1
    assert "No space left on device" in capsys.readouterr().err
    assert len(full.taken) == 4_096
