"""Every operation that makes a reference to an existing object, at its worst moment against a
GC run, on SQLite and PostgreSQL.

Each test holds the operation at a failpoint, lets a second client change the lake and a
prepare run go through, then lets the operation finish; the run is swept by the GC rule
(`tests.gc_model.sweep`) and every object a branch or commit references must still read.
The Spark job applies the same rule (`tests/spark_jobs/test_gc_reference_races.py` forces
the copy race through a real run). `docs/design/gc.md` ("What a GC run promises to clients
that keep working") holds the argument each test stands for.
"""

from __future__ import annotations

import io
import os
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from branchwater.engine import Entry, Lake, NotFound, PhysicalAddress, Unavailable
from branchwater.engine.api import Repository
from branchwater.engine.gc.prepare import PreparedRun
from branchwater.engine.gc.settings import GCSettings
from branchwater.engine.graveler import uploads
from branchwater.engine.graveler.checksums import content_checksum
from branchwater.engine.graveler.uploads import RESTAMP_AFTER
from branchwater.engine.objects.store import ObjectInfo, StreamSource
from tests.gc_model import assert_references_intact, gc_candidates, sweep
from tests.helpers.failpoints import PAUSE_TIMEOUT, paused_at
from tests.helpers.gc import compact, run_addresses
from tests.helpers.servers import unique_name


@pytest.fixture
def repo(race_kv: str, tmp_path: Path) -> Iterator[Repository]:
    with Lake.connect(race_kv) as lake:
        name = unique_name("races-")
        yield lake.create_repository(name, storage_namespace=f"file://{tmp_path}/{name}")


@pytest.fixture
def other_client() -> Iterator[ThreadPoolExecutor]:
    """The client whose operation is held at a failpoint, in a thread of its own."""
    with ThreadPoolExecutor(1) as pool:
        yield pool


def result(future: Future[object]) -> object:
    return future.result(PAUSE_TIMEOUT)


# Shallow copies ----------------------------------------------------------------------------


def test_a_copy_whose_source_is_deleted_before_the_run_copies_nothing(
    repo: Repository, other_client: ThreadPoolExecutor
) -> None:
    """The reported race: the copy read its source, a second client deleted it, the run
    scanned the branch and read the copy records, then the copy went on. It must not stage
    an entry the run never saw."""
    main = repo.branch("main")
    precious = main.upload("src/0278", b"precious").address
    with paused_at("copy.after_read") as pause:
        copying = other_client.submit(main.copy, "src/0278", "dst/0278")
        pause.wait()
        main.delete("src/0278")
        run = repo.prepare_uncommitted_for_gc()
        pause.release()
        with pytest.raises(NotFound, match="src/0278"):
            result(copying)
    assert precious in sweep(repo, run)
    assert_references_intact(repo)
    assert [e.path for e in main.list()] == []


def test_a_copy_whose_source_is_deleted_in_the_run_after_its_record_copies_nothing(
    repo: Repository, other_client: ThreadPoolExecutor
) -> None:
    """Held after its record: the run reads the record (the object is kept this time) and
    the copy, finding its source gone, stages nothing."""
    main = repo.branch("main")
    precious = main.upload("src", b"precious").address
    with paused_at("copy.after_record") as pause:
        copying = other_client.submit(main.copy, "src", "dst")
        pause.wait()
        main.delete("src")
        run = repo.prepare_uncommitted_for_gc()
        pause.release()
        with pytest.raises(NotFound):
            result(copying)
    assert precious in run_addresses(repo, run)
    assert precious not in sweep(repo, run)
    assert_references_intact(repo)


def test_a_copy_checked_before_its_source_is_deleted_is_kept_by_its_record(
    repo: Repository, other_client: ThreadPoolExecutor
) -> None:
    """Held after its check, before staging: the source goes and the run scans the branch
    before the copy is staged, but the record was written before the run read records."""
    main = repo.branch("main")
    precious = main.upload("src", b"precious").address
    with paused_at("copy.before_stage") as pause:
        copying = other_client.submit(main.copy, "src", "dst")
        pause.wait()
        main.delete("src")
        run = repo.prepare_uncommitted_for_gc()
        pause.release()
        assert result(copying).address == precious  # type: ignore[attr-defined]
    sweep(repo, run)
    assert_references_intact(repo)
    assert main.read("dst") == b"precious"


def test_a_copy_whose_source_is_overwritten_copies_what_the_source_shows_now(
    repo: Repository, other_client: ThreadPoolExecutor
) -> None:
    """A second client moved another old object onto the source meanwhile: the copy starts
    over and copies that one, as if it had come after the overwrite."""
    main = repo.branch("main")
    first = main.upload("src", b"first").address
    second = main.upload("other", b"second").address
    with paused_at("copy.after_read") as pause:
        copying = other_client.submit(main.copy, "src", "dst")
        pause.wait()
        main.copy("other", "src")
        main.delete("other")
        run = repo.prepare_uncommitted_for_gc()
        pause.release()
        assert result(copying).address == second  # type: ignore[attr-defined]
    assert sweep(repo, run) == {first}
    assert_references_intact(repo)
    assert main.read("dst") == b"second"


def test_a_copy_whose_branch_is_reset_copies_nothing(
    repo: Repository, other_client: ThreadPoolExecutor
) -> None:
    main = repo.branch("main")
    main.upload("src", b"precious")
    with paused_at("copy.after_read") as pause:
        copying = other_client.submit(main.copy, "src", "dst")
        pause.wait()
        main.reset()
        run = repo.prepare_uncommitted_for_gc()
        pause.release()
        with pytest.raises(NotFound):
            result(copying)
    sweep(repo, run)
    assert_references_intact(repo)


# Links -------------------------------------------------------------------------------------

RUN_ID_RESOLUTION = 0.002
"""A run id tells its time to the millisecond: an object written in the same millisecond as
the run starts is not older than the run at a minimum age of zero."""


def linked_while_a_run_scans(
    repo: Repository, other_client: ThreadPoolExecutor, physical: PhysicalAddress, data: bytes
) -> tuple[Entry, PreparedRun]:
    """`data`, written at `physical`, linked as `t/x` on main by the other client, held
    before it stages while a GC run prepares (scans the branch)."""
    main = repo.branch("main")
    with paused_at("link.before_stage") as pause:
        linking = other_client.submit(
            main.link_physical_address,
            "t/x",
            physical.token,
            size=len(data),
            checksum=content_checksum(data),
        )
        pause.wait()
        run = repo.prepare_uncommitted_for_gc()
        pause.release()
        return linking.result(PAUSE_TIMEOUT), run


def test_a_link_staged_after_the_scan_is_too_young_for_the_default_minimum_age(
    repo: Repository, other_client: ThreadPoolExecutor
) -> None:
    """The run scans the branch before the link stages: only the object's age protects it,
    which is why the default minimum age is never below the token expiry; a minimum age of
    zero gives that up (the object would be collected under a live entry)."""
    main = repo.branch("main")
    physical = main.get_physical_address()
    repo.lake.graveler.objects(repo.storage_namespace).put(physical.address, b"by spark")
    time.sleep(RUN_ID_RESOLUTION)
    _, run = linked_while_a_run_scans(repo, other_client, physical, b"by spark")
    assert physical.address not in run_addresses(repo, run)
    assert physical.address in gc_candidates(repo, run, timedelta(0))
    sweep(repo, run, GCSettings().default_min_age)
    assert_references_intact(repo)


def test_a_link_of_an_object_stamped_before_its_token_stages_a_fresh_copy(
    repo: Repository, other_client: ThreadPoolExecutor
) -> None:
    """A tool that keeps an older modification time (`mv`, `cp -p`, `rsync -a`) puts the
    object in place looking older than its token: staged as it is, a run that scanned the
    branch first would collect it under its live entry. A fresh copy is staged instead."""
    main = repo.branch("main")
    physical = main.get_physical_address()
    store = repo.lake.graveler.objects(repo.storage_namespace)
    store.put(physical.address, b"kept its time")
    kept = (datetime.now(UTC) - HOURS_AGO).timestamp()
    os.utime(store.root / physical.address, (kept, kept))  # type: ignore[attr-defined]
    entry, run = linked_while_a_run_scans(repo, other_client, physical, b"kept its time")
    assert entry.address != physical.address
    sweep(repo, run, GCSettings().default_min_age)
    assert_references_intact(repo)
    assert main.read("t/x") == b"kept its time"


# Uploads and deep copies that took hours ---------------------------------------------------

HOURS_AGO = timedelta(hours=7)
"""Older than the default minimum age (6 hours and 5 minutes)."""


class StampedAsAWSDoes:
    """The namespace's local store, but each object an upload or a deep copy writes under
    `data/` is stamped `HOURS_AGO` before its write ended, as AWS stamps a multipart upload
    that began then; and right then, before the entry is staged, a GC run prepares (scans
    the branch). Its own copies (`ObjectStore.copy`) are stamped as written, or as one that
    took hours too with `slow_copies`."""

    def __init__(self, repo: Repository, *, sweep: bool = False, slow_copies: bool = False) -> None:
        """`sweep`: the run also sweeps then, before the write goes on."""
        self.repo = repo
        self.sweep = sweep
        self.slow_copies = slow_copies
        self.copies: list[str] = []
        self.store = repo.lake.graveler.objects(repo.storage_namespace)
        self.runs: list[PreparedRun] = []
        self.stamped: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def put_stream(self, key: str, source: StreamSource, size: int | None = None) -> ObjectInfo:
        info = self.store.put_stream(key, source, size)
        if not key.startswith("data/"):
            return info
        began = info.mtime - HOURS_AGO
        os.utime(self.store.root / key, (began.timestamp(), began.timestamp()))
        self.stamped.append(key)
        self.runs.append(self.repo.prepare_uncommitted_for_gc())
        if self.sweep:
            sweep(self.repo, self.runs[-1], GCSettings().default_min_age)
        return replace(info, mtime=began)

    def copy(self, src: str, dst: str) -> ObjectInfo:
        info = self.store.copy(src, dst)
        self.copies.append(dst)
        if not self.slow_copies:
            return info
        return replace(info, mtime=info.mtime - HOURS_AGO)


@pytest.mark.parametrize("operation", ["upload", "deep copy"])
def test_an_object_whose_write_took_hours_is_staged_at_a_fresh_address(
    repo: Repository, operation: str
) -> None:
    """A run scanned the branch after the write ended and before its entry was staged, and
    the object looks older than the default minimum age: staged where it was written, the
    run would collect it under its live entry. It is copied to a fresh stamp first."""
    main = repo.branch("main")
    if operation == "deep copy":
        main.upload("src", b"precious")
        main.commit("src")
    stamping = StampedAsAWSDoes(repo)
    repo.lake.graveler._objects[repo.storage_namespace] = stamping  # type: ignore[assignment]
    entry = main.upload("dst", b"precious") if operation == "upload" else main.copy("src", "dst")
    (written,) = stamping.stamped
    (run,) = stamping.runs
    assert entry.address != written
    assert entry.mtime > datetime.now(UTC) - RESTAMP_AFTER
    assert not stamping.store.exists(written)
    sweep(repo, run, GCSettings().default_min_age)
    assert_references_intact(repo)
    assert main.read("dst") == b"precious"


@pytest.mark.parametrize(
    ("stamping", "says"),
    [
        ({"sweep": True}, r"collected it before it was staged.*write it again"),
        ({"slow_copies": True}, r"took .* hours, so the copy looks as old"),
    ],
    ids=["collected-before-the-copy", "copy-took-hours-too"],
)
def test_a_fresh_copy_not_made_in_time_fails_the_write_and_stages_nothing(
    repo: Repository, stamping: dict[str, bool], says: str
) -> None:
    stamped = StampedAsAWSDoes(repo, **stamping)
    repo.lake.graveler._objects[repo.storage_namespace] = stamped  # type: ignore[assignment]
    main = repo.branch("main")
    with pytest.raises(Unavailable, match=says):
        main.upload("dst", b"precious")
    assert list(main.list()) == []
    assert not [key for key in [*stamped.stamped, *stamped.copies] if stamped.store.exists(key)]
    repo.lake.graveler._objects[repo.storage_namespace] = stamped.store
    main.upload("dst", b"again")
    assert main.read("dst") == b"again"


class SlowFile(io.BytesIO):
    """Content whose first read takes longer than the (shortened) `RESTAMP_AFTER`."""

    def read(self, size: int | None = -1) -> bytes:
        if self.tell() == 0:
            time.sleep(0.1)
        return super().read(size)


def test_a_write_that_took_long_is_staged_at_a_fresh_address_though_stamped_when_it_ended(
    repo: Repository, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A local file is stamped when its write ends, but its address's slice was opened
    before the write began: an optimized run takes a slice's objects to land within the
    token expiry and a slice's life of its opening, so a write that outlasts
    `RESTAMP_AFTER` is moved to a fresh address (a slice opened now) as well."""
    monkeypatch.setattr(uploads, "RESTAMP_AFTER", timedelta(milliseconds=50))
    handed: list[str] = []
    allocate = repo.lake.addresses.next_address

    def next_address() -> str:
        handed.append(allocate())
        return handed[-1]

    monkeypatch.setattr(repo.lake.addresses, "next_address", next_address)
    entry = repo.branch("main").upload("dst", SlowFile(b"precious"))
    written, fresh = handed
    assert entry.address == fresh
    store = repo.lake.graveler.objects(repo.storage_namespace)
    assert not store.exists(written)
    assert repo.branch("main").read("dst") == b"precious"


# Moves into commits and compacted metaranges -----------------------------------------------


def test_a_commit_between_the_branch_read_and_its_scan_is_in_the_committed_listing(
    repo: Repository, other_client: ThreadPoolExecutor
) -> None:
    """The run read the branch, then a commit took its token and dropped the rows before
    the scan reached them: the run misses them, the commit (read after the run) has them."""
    main = repo.branch("main")
    staged = main.upload("x", b"staged").address
    with paused_at("prepare.branch_scan") as pause:
        preparing = other_client.submit(repo.prepare_uncommitted_for_gc)
        pause.wait()
        main.commit("take the token")
        assert repo.lake.wait_for_cleanup(PAUSE_TIMEOUT)
        pause.release()
        run = result(preparing)
    assert staged not in run_addresses(repo, run)  # type: ignore[arg-type]
    assert staged not in sweep(repo, run)  # type: ignore[arg-type]
    assert_references_intact(repo)


def test_a_compaction_between_the_branch_read_and_its_scan_is_followed(
    repo: Repository, other_client: ThreadPoolExecutor
) -> None:
    main = repo.branch("main")
    staged = main.upload("x", b"staged").address
    with paused_at("prepare.branch_scan") as pause:
        preparing = other_client.submit(repo.prepare_uncommitted_for_gc)
        pause.wait()
        compact(repo, "main")
        assert repo.lake.wait_for_cleanup(PAUSE_TIMEOUT)
        pause.release()
        run = result(preparing)
    assert staged in run_addresses(repo, run)  # type: ignore[arg-type]
    sweep(repo, run)  # type: ignore[arg-type]
    assert_references_intact(repo)


def test_a_merge_of_a_branch_deleted_before_its_scan_is_in_the_committed_listing(
    repo: Repository, other_client: ThreadPoolExecutor
) -> None:
    """Staged on a branch the run has yet to scan: committed, merged into `main` (scanned
    already) and the branch deleted before the scan reaches it."""
    etl = repo.create_branch("z-etl", source="main")
    staged = etl.upload("x", b"staged").address
    with paused_at("prepare.branch_scan") as pause:
        preparing = other_client.submit(repo.prepare_uncommitted_for_gc)
        pause.wait()
        etl.commit("load")
        repo.merge("z-etl", into="main")
        repo.delete_branch("z-etl")
        assert repo.lake.wait_for_cleanup(PAUSE_TIMEOUT)
        pause.release()
        run = result(preparing)
    assert staged not in run_addresses(repo, run)  # type: ignore[arg-type]
    sweep(repo, run)  # type: ignore[arg-type]
    assert_references_intact(repo)
    assert repo.branch("main").read("x") == b"staged"


def test_a_branch_made_from_a_branch_takes_its_head_not_its_staged_entries(
    repo: Repository,
) -> None:
    """Branch creation makes no reference to an uncommitted object: it names HEAD's commit."""
    main = repo.branch("main")
    main.upload("committed", b"c")
    main.commit("c")
    main.upload("staged", b"s")
    child = repo.create_branch("child", source="main")
    assert [e.path for e in child.list()] == ["committed"]


# Restore, revert, cherry-pick, reset to a ref ----------------------------------------------


def test_a_restore_of_an_old_commits_entry_staged_after_the_run_is_in_the_committed_listing(
    repo: Repository, other_client: ThreadPoolExecutor
) -> None:
    """The restore read an entry of a commit whose branch is gone and whose path `main`
    deleted, then the run went through before it staged it: the run never scanned the staged
    entry, but the commit holding it is read by the committed listing (revert, cherry-pick
    and reset to a ref read from commits in the same way)."""
    etl = repo.create_branch("etl", source="main")
    precious = etl.upload("x", b"precious").address
    old = etl.commit("load").id
    repo.merge("etl", into="main")
    repo.delete_branch("etl")
    main = repo.branch("main")
    main.delete("x")
    main.commit("drop x")
    with paused_at("restore.before_stage") as pause:
        restoring = other_client.submit(main.restore, "x", old)
        pause.wait()
        run = repo.prepare_uncommitted_for_gc()
        pause.release()
        assert result(restoring) == 1
    assert precious not in run_addresses(repo, run)
    assert precious not in sweep(repo, run)
    assert_references_intact(repo)
    assert main.read("x") == b"precious"
