"""A transaction that fails, or whose process is killed, between its writes and the merge
that lands them: the branch it wrote to is never changed and never staged on. A failure
deletes the transaction's branch; a kill leaves it (`tx/…`), which can be deleted."""

from __future__ import annotations

import signal
from typing import Any

import fsspec
import pytest

from branchwater.engine import BranchwaterFileSystem, InvalidArgument, failpoints
from branchwater.engine.failpoints import FailpointHit
from branchwater.engine.filesystem import PROTOCOL
from branchwater.engine.graveler.transactions import PREFIX as TRANSACTION_PREFIX
from tests.filesystem.conftest import FsLake
from tests.helpers.servers import forked_run

POINTS = ["transaction.before_commit", "transaction.before_merge"]


def transaction_in_another_process(options: dict[str, Any]) -> str:
    """A transaction through a filesystem of this process's own: a write and a delete."""
    if PROTOCOL not in fsspec.available_protocols():
        fsspec.register_implementation(PROTOCOL, BranchwaterFileSystem)
    fs = fsspec.filesystem(PROTOCOL, **options)
    with fs.transaction:
        fs.pipe("sales/main/orders/1.csv", b"id\n1\n")
        fs.rm("sales/main/base.txt")
    return "landed"


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
    env = {failpoints.ENV: f"{point}=kill"}
    child = forked_run(transaction_in_another_process, fs_lake.options, env=env)
    assert child.code == -signal.SIGKILL, child
    assert_untouched(fs_lake, base)
    (left,) = [b for b in fs_lake.repo.branches() if b.name.startswith(TRANSACTION_PREFIX)]
    assert left.read("orders/1.csv") == b"id\n1\n"
    fs_lake.repo.delete_branch(left.name)
    assert [b.name for b in fs_lake.repo.branches()] == ["main"]
    child = forked_run(transaction_in_another_process, fs_lake.options)
    assert child.code == 0 and child.returned == "landed", child
    main = fs_lake.repo.branch("main")
    assert main.head().parents == (base,)
    assert main.read("orders/1.csv") == b"id\n1\n" and not fs_lake.fs.exists("sales/main/base.txt")


def test_a_file_still_open_when_the_transaction_ends_lands_nothing(
    fs_lake: FsLake, base: str
) -> None:
    """What a file still open holds may be short of what its writer wrote (a text or
    compression wrapper keeps some), so the transaction refuses to land rather than land
    without it or with part of it; its late close then does nothing."""
    fs = fs_lake.fs
    refused = pytest.raises(InvalidArgument, match=r"still open .*sales/main/open\.bin")
    with refused, fs.transaction as tx:
        fs.pipe("sales/main/piped.bin", b"p")
        with fs.open("sales/main/closed.bin", "wb") as closed:
            closed.write(b"closed in time")
        f = fs.open("sales/main/open.bin", "wb")
        f.write(b"payload")
    assert tx.landed == []
    assert_untouched(fs_lake, base)
    assert [b.name for b in fs_lake.repo.branches()] == ["main"]
    f.close()
    assert_untouched(fs_lake, base)
    assert not fs._intrans
