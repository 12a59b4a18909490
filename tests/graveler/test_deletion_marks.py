"""To-delete lists longer than one KV value holds (DynamoDB: 400 KB an item): written in
parts, named by the list's record last, so a list is read whole or not at all; a process
killed part-way leaves a state the next cleanup finishes; lists written whole before parts
existed still read."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path

import pytest

from branchwater.engine import Lake, NotFound, failpoints
from branchwater.engine.errors import Unavailable
from branchwater.engine.graveler import refs as refs_module
from branchwater.engine.graveler.graveler import ABANDONED_DROP_S, Graveler, token_partitions
from branchwater.engine.graveler.model import BranchRecord, RepositoryRecord
from branchwater.engine.graveler.refs import (
    GRAVELER_PARTITION,
    MARK_PART_BYTES,
    MARK_PARTS_PREFIX,
    TO_DELETE_PREFIX,
    BranchGuard,
    RefStore,
)
from branchwater.engine.graveler.staging import new_staging_token
from branchwater.engine.kv import Store, open_store
from branchwater.engine.kv.memory import MemoryStore
from branchwater.engine.kv.store import ValueWithPredicate
from tests.helpers.servers import unique_name

DYNAMODB_ITEM_BYTES = 400 * 1024


class Killed(Unavailable):
    """A write its process died before making."""


class DyingStore(MemoryStore):
    """A memory store whose process dies at its `dies_at`-th write of a to-delete record or
    part (counting from 1): that write and every later one of them fail. None: never."""

    def __init__(self, dies_at: int | None = None) -> None:
        super().__init__()
        self.dies_at = dies_at
        self.writes = 0
        self.died = False
        self.part_ids: set[bytes] = set()
        """The parts ids written: one per list written in parts."""

    def set(self, partition: bytes, key: bytes, value: bytes) -> None:
        self._write(partition, key)
        super().set(partition, key, value)
        if key.startswith(MARK_PARTS_PREFIX):
            self.part_ids.add(key.split(b"/")[1])

    def delete(self, partition: bytes, key: bytes) -> None:
        self._write(partition, key)
        super().delete(partition, key)

    def _write(self, partition: bytes, key: bytes) -> None:
        if partition != GRAVELER_PARTITION or not key.startswith(b"to-delete"):
            return
        self.writes += 1
        if self.dies_at is not None and self.writes >= self.dies_at:
            self.died = True
            raise Killed(f"killed at to-delete write {self.writes}")


def listing_keys(kv: Store) -> list[bytes]:
    """Every to-delete record and part left in the store."""
    return [k for k, _ in kv.scan(GRAVELER_PARTITION) if k.startswith(b"to-delete")]


def part_keys(kv: Store) -> list[bytes]:
    return [k for k in listing_keys(kv) if k.startswith(MARK_PARTS_PREFIX)]


def finish_cleanup(g: Graveler, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the next processes' cleanups do: at once, and once strays are old enough."""
    g.collect_dropped_partitions()
    later = time.time() + ABANDONED_DROP_S + 1
    with monkeypatch.context() as m:
        m.setattr(time, "time", lambda: later)
        g.collect_dropped_partitions()


def seal_main(g: Graveler, record: RepositoryRecord) -> bytes:
    """What a process still holding a deleted repository does meanwhile: a commit's seal,
    moving `main` to a new token with a row in it. Returns that token."""
    branch, predicate = g.refs.get_branch(record, "main")
    token = new_staging_token(record, "main")
    g.staging.put(token, "late", None)
    sealed = (branch.staging_token, *branch.sealed_tokens)
    g.refs.set_branch_if(
        record, dataclasses.replace(branch, staging_token=token, sealed_tokens=sealed), predicate
    )
    return token.encode()


def sealing_main(g: Graveler, record: RepositoryRecord) -> tuple[Callable[[], None], list[bytes]]:
    """A failpoint action that seals `main` once, and the list its token goes in."""
    sealed: list[bytes] = []

    def action() -> None:
        if not sealed:
            sealed.append(seal_main(g, record))

    return action, sealed


# lists in parts, on every store


@pytest.fixture(
    params=[
        "memory",
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.postgres),
        pytest.param("dynamodb", marks=pytest.mark.s3),
    ]
)
def kv(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "memory":
        url = "memory://"
    elif request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'kv.db'}"
    elif request.param == "postgres":
        url = f"{request.getfixturevalue('postgres_url')}?table={unique_name('kv_')}"
    else:
        endpoint = request.getfixturevalue("dynamodb_endpoint")
        url = f"dynamodb://{unique_name('kv-')}?endpoint_url={endpoint}&region=us-east-1"
    with open_store(url) as store:
        yield store


def test_a_list_too_long_for_one_value_is_written_in_parts_and_read_whole(kv: Store) -> None:
    refs = RefStore(kv)
    partitions = [f"staging/{i:05d}-{'p' * 200}".encode() for i in range(2500)]
    assert len(json.dumps([p.decode() for p in partitions])) > DYNAMODB_ITEM_BYTES
    guard = BranchGuard(b"repo-partition", "main")
    refs.mark_partitions_for_deletion("repo/long", partitions, 1234.5, guard)
    refs.mark_partitions_for_deletion("tokens/short", [b"t1", b"t2"])

    stored = [(k, v) for k, v in kv.scan(GRAVELER_PARTITION) if k.startswith(b"to-delete")]
    assert len(part_keys(kv)) > 1
    assert max(len(v) for _, v in stored) <= MARK_PART_BYTES
    listed = {m.mark: m for m in refs.partitions_to_delete()}
    assert listed["repo/long"].partitions == partitions
    assert (listed["repo/long"].marked_at, listed["repo/long"].guard) == (1234.5, guard)
    assert listed["tokens/short"].partitions == [b"t1", b"t2"]

    refs.unmark_partitions("repo/long")
    refs.unmark_partitions("tokens/short")
    assert listing_keys(kv) == []


def test_a_list_rewritten_in_parts_replaces_the_parts_it_had(kv: Store) -> None:
    """A fence that finds more tokens lists them all again: the earlier parts go once the
    record names the new ones."""
    refs = RefStore(kv)
    first = [f"p{i:05d}-{'x' * 100}".encode() for i in range(1500)]
    refs.mark_partitions_for_deletion("repo/grows", first)
    before = set(part_keys(kv))
    grown = [*first, b"sealed-since"]
    refs.mark_partitions_for_deletion("repo/grows", grown)
    after = set(part_keys(kv))
    assert before and after and before.isdisjoint(after)
    [listed] = refs.partitions_to_delete()
    assert listed.partitions == grown
    assert refs.discard_stray_parts(0.0) == 0


# old lists


def test_lists_written_whole_before_parts_existed_still_read_and_drop(lake: Lake) -> None:
    g = lake.graveler
    g.staging.put("orphan-token", "x", None)
    old = {"partitions": ["orphan-token"], "marked_at": time.time() - 2 * ABANDONED_DROP_S}
    guarded = {"partitions": ["gone-token"], "marked_at": 5.0, "guard": ["p", "main"]}
    g.kv.set(GRAVELER_PARTITION, TO_DELETE_PREFIX + b"tokens/old", json.dumps(old).encode())
    g.kv.set(GRAVELER_PARTITION, TO_DELETE_PREFIX + b"tokens/g", json.dumps(guarded).encode())

    listed = {m.mark: m for m in g.refs.partitions_to_delete()}
    assert listed["tokens/old"].partitions == [b"orphan-token"]
    assert listed["tokens/g"].guard == BranchGuard(b"p", "main")
    assert listed["tokens/g"].marked_at == 5.0
    assert g.collect_dropped_partitions(ABANDONED_DROP_S) == 2
    assert list(g.kv.scan(b"orphan-token")) == []
    assert listing_keys(g.kv) == []


# reading while another process writes or drops


def test_a_reader_rereads_a_list_whose_parts_were_replaced_under_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    kv = MemoryStore()
    refs = RefStore(kv)
    first = [f"p{i:05d}-{'x' * 100}".encode() for i in range(1500)]
    grown = [*first, b"sealed-since"]
    refs.mark_partitions_for_deletion("repo/r", first)
    get = kv.get
    regrown: list[bool] = []

    def get_then_grow(partition: bytes, key: bytes) -> ValueWithPredicate:
        if key.startswith(MARK_PARTS_PREFIX) and not regrown:
            regrown.append(True)
            refs.mark_partitions_for_deletion("repo/r", grown)
        return get(partition, key)

    monkeypatch.setattr(kv, "get", get_then_grow)
    [listed] = refs.partitions_to_delete()
    assert regrown and listed.partitions == grown


def test_a_list_missing_a_part_is_never_dropped_in_part(lake: Lake) -> None:
    g = lake.graveler
    partitions = [f"t{i:05d}-{'x' * 100}".encode() for i in range(1500)]
    for p in partitions:
        g.kv.set(p, b"k", b"v")
    g.refs.mark_partitions_for_deletion("repo/damaged", partitions, 0.0)
    g.kv.delete(GRAVELER_PARTITION, part_keys(g.kv)[-1])

    assert list(g.refs.partitions_to_delete()) == []
    assert g.collect_dropped_partitions() == 0
    assert all(list(g.kv.scan(p)) for p in partitions)
    assert TO_DELETE_PREFIX + b"repo/damaged" in listing_keys(g.kv)


# killed part-way


def test_a_delete_killed_at_any_listing_write_is_finished_by_the_next_cleanup(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed at each write of the listing in turn (its parts, its record, the fence's
    rewrite with a token sealed meanwhile, the unlisting after the drop): no list ever reads
    as anything but one of the two whole listings, a repository whose record survived is
    intact, and the next process's delete and cleanups drop every partition and leave no
    record or part behind."""
    monkeypatch.setattr(refs_module, "MARK_PART_BYTES", 200)
    dies_at, completed = 1, False
    while not completed:
        kv = DyingStore()
        with Lake(Graveler(kv)) as lake:
            repo = lake.create_repository("sales", storage_namespace=f"file://{tmp_path}/{dies_at}")
            for name in ("dev", "ops", "qa"):
                repo.create_branch(name, source="main").upload("x", name.encode())
            kv.dies_at = kv.writes + dies_at
            g, record = lake.graveler, repo.record
            listed = [record.partition, *token_partitions(g.refs.branches(record))]
            action, sealed = sealing_main(g, record)
            with failpoints.armed("repository.before_drop", action), suppress(Killed):
                lake.delete_repository("sales")
            assert lake.wait_for_cleanup(timeout=30)
            completed = not kv.died
            if completed:
                assert len(kv.part_ids) == 2, "the listing and its fence's rewrite, in parts"
            kv.dies_at = None
            whole = (listed, [*listed, *sealed])
            assert all(m.partitions in whole for m in g.refs.partitions_to_delete())

        with Lake(Graveler(kv)) as lake:
            g = lake.graveler
            try:
                survivor = lake.repository("sales")
            except NotFound:
                pass
            else:
                assert survivor.branch("qa").read("x") == b"qa"
                lake.delete_repository("sales")
                assert lake.wait_for_cleanup(timeout=30)
            finish_cleanup(g, monkeypatch)
            with pytest.raises(NotFound):
                lake.repository("sales")
            leftover = [p for p in [*listed, *sealed] if list(kv.scan(p))]
            assert leftover == [], f"killed at write {dies_at}"
            assert listing_keys(kv) == [], f"killed at write {dies_at}"
        dies_at += 1


def test_parts_a_killed_writer_left_go_only_once_old_enough(
    lake: Lake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Younger, their writer may be about to name them: a cleanup called with no ages
    leaves them, and no list reads from them meanwhile."""
    monkeypatch.setattr(refs_module, "MARK_PART_BYTES", 200)
    g, kv = lake.graveler, lake.graveler.kv
    set_ = kv.set
    written: list[bytes] = []

    def set_then_die(partition: bytes, key: bytes, value: bytes) -> None:
        if key.startswith(MARK_PARTS_PREFIX) and len(written) == 2:
            raise Killed("killed between two parts")
        written.append(key)
        set_(partition, key, value)

    monkeypatch.setattr(kv, "set", set_then_die)
    with pytest.raises(Killed):
        g.refs.mark_partitions_for_deletion("repo/x", [b"a" * 150, b"b" * 150, b"c" * 150])
    monkeypatch.setattr(kv, "set", set_)

    assert list(g.refs.partitions_to_delete()) == []
    assert g.collect_dropped_partitions() == 0
    assert part_keys(kv) == written
    finish_cleanup(g, monkeypatch)
    assert listing_keys(kv) == []


# DynamoDB's item limit


@pytest.mark.s3
def test_a_repository_whose_listing_exceeds_a_dynamodb_item_is_deleted_and_dropped(
    dynamodb_endpoint: str, tmp_path: Path
) -> None:
    """Sixty branches, each with tokens a commit sealed and has yet to finish, all of long
    names: the listing of their 300 partitions, and the fence's rewrite of it with a token
    sealed meanwhile, are each more than one item holds."""
    url = f"dynamodb://{unique_name('kv-')}?endpoint_url={dynamodb_endpoint}&region=us-east-1"
    name = "r" + "x" * 61 + "z"
    with Lake.connect(url) as lake:
        repo = lake.create_repository(name, storage_namespace=f"file://{tmp_path}/ns")
        g, record = lake.graveler, repo.record
        head = g.refs.get_branch(record, "main")[0].commit_id

        def add_branch(i: int) -> None:
            branch = f"{i:03d}-" + "b" * 240
            token = new_staging_token(record, branch)
            sealed = tuple(f"{token}-sealed-{n}-" + "s" * 1400 for n in range(4))
            for partition in (token, *sealed):
                g.staging.put(partition, "x", None)
            added = BranchRecord(
                name=branch, commit_id=head, staging_token=token, sealed_tokens=sealed
            )
            g.refs.insert_branch(record, added)

        with ThreadPoolExecutor(16) as pool:
            list(pool.map(add_branch, range(60)))
        listed = [record.partition, *token_partitions(g.refs.branches(record))]
        assert len(json.dumps([p.decode() for p in listed])) > DYNAMODB_ITEM_BYTES
        action, sealed = sealing_main(g, record)
        with failpoints.armed("repository.before_drop", action):
            lake.delete_repository(name)
        assert lake.wait_for_cleanup(timeout=300)
        assert sealed

        with pytest.raises(NotFound):
            lake.repository(name)
        partitions = [*listed, *sealed]
        with ThreadPoolExecutor(16) as pool:
            rows = list(pool.map(lambda p: next(iter(g.kv.scan(p)), None), partitions))
        assert [p for p, row in zip(partitions, rows, strict=True) if row is not None] == []
        assert listing_keys(g.kv) == []
