"""The in-process CLI runner fixtures of the `branchwater` tests (helpers: `tests.helpers.cli`).

Most tests drive `main([...])` in-process (fast, and capsys sees exactly what a user would);
the subprocess tests prove the installed entry points exit with the same codes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from branchwater.engine.cli import main
from branchwater.engine.cli.commits import COMMITTER_ENV
from branchwater.engine.cli.verbs import KV_ENV
from tests.helpers.cli import Bw, CliLake, Run


@pytest.fixture
def lake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> CliLake:
    """A fresh SQLite lake and file:// namespace; the cwd and env cannot leak another lake."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(KV_ENV, raising=False)
    monkeypatch.setenv(COMMITTER_ENV, "tester")
    return CliLake(f"sqlite:///{tmp_path}/kv/lake.db", f"file://{tmp_path}/ns", tmp_path)


@pytest.fixture
def bw(lake: CliLake, capsys: pytest.CaptureFixture[str]) -> Bw:
    """Run the CLI in-process against `lake`; returns exit code, stdout and stderr."""

    def run(*args: str, kv: str | None = lake.kv) -> Run:
        argv = ["--kv", kv, *args] if kv else list(args)
        code = main(argv)
        captured = capsys.readouterr()
        return Run(code, captured.out, captured.err)

    return run
