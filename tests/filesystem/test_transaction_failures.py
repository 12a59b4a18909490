"""A transaction that fails, or whose process is killed, between its writes and the merge
that lands them: the branch it wrote to is never changed and never staged on. A failure
deletes the transaction's branch; a kill leaves it (`tx/…`), which can be deleted."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import pytest

from branchwater.engine import failpoints
from branchwater.engine.failpoints import FailpointHit
from branchwater.engine.graveler.transactions import PREFIX as TRANSACTION_PREFIX
from tests.filesystem.conftest import FsLake

POINTS = ["transaction.before_commit", "transaction.before_merge"]

CHILD = textwrap.dedent(
    """
    import json, sys
    import fsspec
    from branchwater.engine import BranchwaterFileSystem

    if "branchwater" not in fsspec.available_protocols():
        fsspec.register_implementation("branchwater", BranchwaterFileSystem)
    fs = fsspec.filesystem("branchwater", **json.loads(sys.argv[1]))
    with fs.transaction:
        fs.pipe("sales/main/orders/1.csv", b"id\\n1\\n")
        fs.rm("sales/main/base.txt")
    print("landed")
    """
)


@pytest.fixture
def base(fs_lake: FsLake) -> str:
    main = fs_lake.repo.branch("main")
    main.upload("base.txt", b"base")
    return main.commit("base").id


def assert_untouched(fs_lake: FsLake, head: str) -> None:
    main = fs_lake.repo.branch("main")
    assert main.commit_id == head
    assert list(main.uncommitted()) == []
    assert main.read("base.txt") == b"base"


@pytest.mark.parametrize("point", POINTS)
def test_a_failure_before_landing_leaves_the_branch_as_it_was(
    fs_lake: FsLake, base: str, point: str
) -> None:
    fs = fs_lake.fs

    def fail() -> None:
        raise FailpointHit(point)

    with failpoints.armed(point, fail), pytest.raises(FailpointHit), fs.transaction:
        fs.pipe("sales/main/orders/1.csv", b"id\n1\n")
        fs.rm("sales/main/base.txt")
    assert_untouched(fs_lake, base)
    assert [b.name for b in fs_lake.repo.branches()] == ["main"]
    assert not fs._intrans


@pytest.mark.slow
@pytest.mark.parametrize("point", POINTS)
def test_a_process_killed_before_landing_leaves_the_branch_as_it_was(
    fs_lake: FsLake, base: str, point: str
) -> None:
    env = {**os.environ, failpoints.ENV: f"{point}=kill"}
    child = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(fs_lake.options)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr[-2000:]
    assert_untouched(fs_lake, base)
    (left,) = [b for b in fs_lake.repo.branches() if b.name.startswith(TRANSACTION_PREFIX)]
    assert left.read("orders/1.csv") == b"id\n1\n"
    fs_lake.repo.delete_branch(left.name)
    assert [b.name for b in fs_lake.repo.branches()] == ["main"]
    child = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(fs_lake.options)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.stdout.strip() == "landed", child.stderr[-2000:]
    main = fs_lake.repo.branch("main")
    assert main.head().parents == (base,)
    assert main.read("orders/1.csv") == b"id\n1\n" and not fs_lake.fs.exists("sales/main/base.txt")
