"""The in-process CLI runner and what its results must show."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, Protocol

if TYPE_CHECKING:
    pass


class Run(NamedTuple):
    code: int
    out: str
    err: str


class CliLake(NamedTuple):
    """A CLI test's lake: its KV URL, its namespace URL and its directory."""

    kv: str
    namespace: str
    root: Path


class Bw(Protocol):
    """The in-process CLI runner; `kv=None` leaves the lake to `$BRANCHWATER_KV_URL` or default."""

    def __call__(self, *args: str, kv: str | None = ...) -> Run: ...


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


def make_repo(bw: Bw, lake: CliLake, name: str = "sales") -> None:
    ok(bw("repo", "create", name, "--namespace", f"{lake.namespace}/{name}"))


def local_file(lake: CliLake, name: str, data: bytes) -> str:
    path = lake.root / name
    path.write_bytes(data)
    return str(path)
