"""`Branch.transaction`: writes staged on a `tx/` branch of their own land on the branch as
one commit when the block ends, nothing when it raises; other processes' writes to the
branch meanwhile survive, a conflicting one fails the landing with nothing landed; a
process killed inside the block or while landing leaves the branch as it was (or landed),
and running the block again ends where one uninterrupted run ends."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from branchwater.engine import (
    BranchProtected,
    InvalidArgument,
    Lake,
    MergeConflict,
    NotFound,
    failpoints,
)
from branchwater.engine.api import Repository
from branchwater.engine.graveler.transactions import PREFIX, TRANSACTION_KEY
from tests.helpers.servers import Exited, forked_run, unique_name


def another_process(kv_url: str, action: str) -> str:
    """What the other process does: the transaction (whether it landed), or a commit on main
    and a write staged above it."""
    with Lake.connect(kv_url, range_cache_bytes=0) as lake:
        main = lake.repository("sales").branch("main")
        if action == "transaction":
            with main.transaction("load orders") as tx:
                tx.upload("orders/1.csv", b"id\n1\n")
                with contextlib.suppress(NotFound):
                    tx.delete("base.txt")
            return "landed" if tx.landed else "unchanged"
        main.upload("theirs.txt", b"theirs")
        main.commit("another process")
        main.upload("pending.txt", b"staged by another process")
        return "committed"


@dataclass
class TxLake:
    lake: Lake
    repo: Repository
    kv_url: str
    base: str
    """The commit main starts on: `base.txt` and `keep.txt`."""

    def run(self, action: str, env: dict[str, str] | None = None) -> Exited:
        """`another_process` in a process of its own, `env` over this one's environment."""
        return forked_run(another_process, self.kv_url, action, env=env)

    def leftovers(self) -> list[str]:
        return [b.name for b in self.repo.branches() if b.name.startswith(PREFIX)]


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def tx_lake(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TxLake]:
    if request.param == "sqlite":
        kv_url = f"sqlite:///{tmp_path}/lake.db"
    else:
        kv_url = f"{request.getfixturevalue('postgres_url')}?table={unique_name('tx_')}"
    with Lake.connect(kv_url, range_cache_bytes=0) as lake:
        repo = lake.create_repository("sales", f"file://{tmp_path}/sales")
        main = repo.branch("main")
        main.upload("base.txt", b"base")
        main.upload("keep.txt", b"keep")
        yield TxLake(lake, repo, kv_url, main.commit("base").id)


def test_a_transaction_lands_its_writes_as_one_commit(tx_lake: TxLake) -> None:
    main = tx_lake.repo.branch("main")
    with main.transaction("load orders", {"airflow.dag_id": "orders"}) as tx:
        assert tx.name.startswith(PREFIX) and tx.target == "main"
        tx.upload("orders/1.csv", b"id\n1\n")
        tx.delete("base.txt")
        assert tx.read("orders/1.csv") == b"id\n1\n"
        with pytest.raises(NotFound):
            tx.stat("base.txt")
        assert main.commit_id == tx_lake.base and list(main.uncommitted()) == []
        tx.message = "load orders, day 1"
    head = main.head()
    assert tx.landed is not None and head.id == tx.landed.id
    assert head.parents == (tx_lake.base,)
    assert head.message == "load orders, day 1"
    assert head.metadata["airflow.dag_id"] == "orders"
    assert head.metadata[TRANSACTION_KEY] == tx.name
    assert main.read("orders/1.csv") == b"id\n1\n" and main.read("keep.txt") == b"keep"
    with pytest.raises(NotFound):
        main.stat("base.txt")
    assert list(main.uncommitted()) == [] and tx_lake.leftovers() == []


def test_a_transaction_that_raises_lands_nothing_and_leaves_no_branch(tx_lake: TxLake) -> None:
    main = tx_lake.repo.branch("main")
    with pytest.raises(RuntimeError, match="validation"), main.transaction() as tx:
        tx.upload("orders/1.csv", b"id\n1\n")
        tx.delete("base.txt")
        raise RuntimeError("validation failed")
    assert main.commit_id == tx_lake.base and list(main.uncommitted()) == []
    assert main.read("base.txt") == b"base" and tx_lake.leftovers() == []
    assert tx.landed is None


def test_a_transaction_that_changes_nothing_lands_nothing(tx_lake: TxLake) -> None:
    main = tx_lake.repo.branch("main")
    with main.transaction() as tx:
        tx.upload("base.txt", b"base")
    assert tx.landed is None and main.commit_id == tx_lake.base and tx_lake.leftovers() == []


def test_writes_from_another_process_during_the_block_survive(tx_lake: TxLake) -> None:
    """Another process commits to main and stages on it while the block is open: the
    transaction lands on that commit, and the staged write stays staged above it."""
    main = tx_lake.repo.branch("main")
    with main.transaction() as tx:
        tx.upload("orders/1.csv", b"id\n1\n")
        done = tx_lake.run("concurrent")
        assert done.code == 0 and done.returned == "committed", done
    head = main.head()
    assert tx.landed is not None and head.id == tx.landed.id and len(head.parents) == 1
    assert tx_lake.repo.commit(head.parents[0]).message == "another process"
    assert main.read("orders/1.csv") == b"id\n1\n" and main.read("theirs.txt") == b"theirs"
    assert {c.path: c.type for c in main.uncommitted()} == {"pending.txt": "added"}


def test_a_commit_landing_between_the_merge_and_its_set_survives(tx_lake: TxLake) -> None:
    """The worst interleaving, forced: another process commits to main after the landing
    merged and before its `set_if`; the landing loses that race, merges again onto the new
    HEAD and lands one commit there."""
    main = tx_lake.repo.branch("main")
    runs: list[Exited] = []

    def another_process_commits() -> None:
        if not runs:
            runs.append(tx_lake.run("concurrent"))

    with failpoints.armed("merge.before_set", another_process_commits), main.transaction() as tx:
        tx.upload("orders/1.csv", b"id\n1\n")
    assert runs and runs[0].code == 0 and runs[0].returned == "committed", runs
    head = main.head()
    assert tx.landed is not None and head.id == tx.landed.id and len(head.parents) == 1
    assert tx_lake.repo.commit(head.parents[0]).message == "another process"
    assert main.read("orders/1.csv") == b"id\n1\n" and main.read("theirs.txt") == b"theirs"
    assert {c.path: c.type for c in main.uncommitted()} == {"pending.txt": "added"}


def test_a_landing_that_lost_a_race_where_main_had_its_change_conflicts(tx_lake: TxLake) -> None:
    """Main took the transaction's value of `keep.txt` before the landing merged, and changed
    it again before its `set_if`: a landing onto that HEAD conflicts, so the retry does
    (reusing the lost attempt would land main's value and drop the transaction's)."""
    main = tx_lake.repo.branch("main")
    raced: list[str] = []

    def main_changes_it_again() -> None:
        if not raced:
            main.upload("keep.txt", b"other")
            raced.append(main.commit("main again").id)

    with (
        pytest.raises(MergeConflict, match=r"keep\.txt"),
        failpoints.armed("merge.before_set", main_changes_it_again),
        main.transaction() as tx,
    ):
        tx.upload("keep.txt", b"mine")
        tx.upload("orders/1.csv", b"id\n1\n")
        main.upload("keep.txt", b"mine")
        main.commit("main takes the same value")
    assert raced and main.commit_id == raced[0] and main.read("keep.txt") == b"other"
    assert tx_lake.leftovers() == []


def test_conflicting_writes_fail_the_landing_and_land_nothing(tx_lake: TxLake) -> None:
    main = tx_lake.repo.branch("main")
    with pytest.raises(MergeConflict, match=r"1 path\(s\): keep\.txt"), main.transaction() as tx:
        tx.upload("keep.txt", b"mine")
        main.upload("keep.txt", b"theirs")
        theirs = main.commit("concurrent").id
    assert main.commit_id == theirs and main.read("keep.txt") == b"theirs"
    with pytest.raises(MergeConflict, match=r"keep\.txt"), main.transaction() as tx:
        tx.upload("keep.txt", b"mine")
        main.upload("keep.txt", b"staged")
    assert main.commit_id == theirs and main.read("keep.txt") == b"staged"
    assert tx_lake.leftovers() == []


def test_hostile_arguments_are_refused_before_anything_is_written(tx_lake: TxLake) -> None:
    repo = tx_lake.repo
    main = repo.branch("main")
    for message, metadata in (("", None), (None, None), ("m", {"k": 1}), ("m", "k=v")):
        with pytest.raises(InvalidArgument), main.transaction(message, metadata):  # type: ignore[arg-type]
            pytest.fail("the block must not run")
    with main.transaction() as tx, pytest.raises(InvalidArgument):
        tx.metadata = {"k": None}  # type: ignore[dict-item]
    with pytest.raises(InvalidArgument), main.transaction() as tx:
        tx.upload("orders/1.csv", b"x")
        tx.message = ""
    repo.protect("main", no_direct_writes=True)
    with pytest.raises(BranchProtected), main.transaction():
        pytest.fail("the block must not run")
    assert main.commit_id == tx_lake.base and tx_lake.leftovers() == []
    assert list(main.uncommitted()) == []


@pytest.mark.slow
@pytest.mark.parametrize("tx_lake", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    "point",
    ["transaction.before_commit", "transaction.before_merge", "merge.before_set"],
)
def test_a_process_killed_before_landing_leaves_the_branch_and_a_rerun_lands(
    tx_lake: TxLake, point: str
) -> None:
    killed = tx_lake.run("transaction", {failpoints.ENV: f"{point}=kill"})
    assert killed.code == -signal.SIGKILL, killed
    main = tx_lake.repo.branch("main")
    assert main.commit_id == tx_lake.base and list(main.uncommitted()) == []
    (left,) = tx_lake.leftovers()
    assert tx_lake.repo.branch(left).read("orders/1.csv") == b"id\n1\n"
    rerun = tx_lake.run("transaction")
    assert rerun.returned == "landed", rerun
    head = main.head()
    assert head.parents == (tx_lake.base,) and main.read("orders/1.csv") == b"id\n1\n"
    assert tx_lake.leftovers() == [left]
    tx_lake.repo.delete_branch(left)
    assert main.commit_id == head.id and tx_lake.leftovers() == []


@pytest.mark.slow
@pytest.mark.parametrize("tx_lake", ["sqlite"], indirect=True)
def test_a_process_killed_after_landing_leaves_only_its_branch(tx_lake: TxLake) -> None:
    """Killed once landed, before its branch is deleted: the branch holds the commit, and
    running the block again finds its writes there and lands nothing."""
    killed = tx_lake.run("transaction", {failpoints.ENV: "branch.before_delete=kill"})
    assert killed.code == -signal.SIGKILL, killed
    main = tx_lake.repo.branch("main")
    head = main.head()
    (left,) = tx_lake.leftovers()
    assert head.parents == (tx_lake.base,) and head.metadata[TRANSACTION_KEY] == left
    rerun = tx_lake.run("transaction")
    assert rerun.returned == "unchanged", rerun
    assert main.commit_id == head.id and tx_lake.leftovers() == [left]
