"""The in-process CLI runner and the helpers the `branchwater` tests share.

Most tests drive `main([...])` in-process (fast, and capsys sees exactly what a user would);
the subprocess tests prove the installed entry points exit with the same codes.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple, Protocol

import pytest

from branchwater.engine.cli import main
from branchwater.engine.cli.commits import COMMITTER_ENV
from branchwater.engine.cli.verbs import KV_ENV


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
    monkeypatch.delenv(KV_ENV, raising=False)
    monkeypatch.setenv(COMMITTER_ENV, "tester")
    return Lake(f"sqlite:///{tmp_path}/kv/lake.db", f"file://{tmp_path}/ns", tmp_path)


@pytest.fixture
def bw(lake: Lake, capsys: pytest.CaptureFixture[str]) -> Bw:
    """Run the CLI in-process against `lake`; returns exit code, stdout and stderr."""

    def run(*args: str, kv: str | None = lake.kv) -> Run:
        argv = ["--kv", kv, *args] if kv else list(args)
        code = main(argv)
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
