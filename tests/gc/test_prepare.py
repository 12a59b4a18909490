"""prepare_uncommitted_for_gc: what a run holds, and that it is safe against what happens
while it runs (copies, deletes, compactions, branch deletes, crashes)."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from branchwater.engine import (
    CorruptedData,
    InvalidArgument,
    Lake,
    NotFound,
    RunExpired,
    Unavailable,
)
from branchwater.engine.api import Repository
from branchwater.engine.gc import prepare
from branchwater.engine.gc.addresses import newest_first_id, newest_first_time
from branchwater.engine.gc.prepare import MANIFEST, PROGRESS, RETENTION_PREFIX, read_manifest
from branchwater.engine.gc.settings import GCSettings
from branchwater.engine.graveler import commit as commit_ops
from tests.helpers.gc import FakeClock, compact, run_addresses, run_rows, run_table, use_clock
from tests.helpers.hostile import any_text, not_text, stored

LINE = st.sampled_from(["\n", "\r\n", "\x00", " "])
"""What may trail a run id pasted from a terminal or a file."""


def objects(repo: Repository):
    return repo.lake.graveler.objects(repo.storage_namespace)


def run_keys(repo: Repository, run_id: str) -> list[str]:
    prefix = f"{RETENTION_PREFIX}{run_id}/"
    return [info.key[len(prefix) :] for info in objects(repo).list_objects(prefix)]


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Read and write two rows at a time, so a run has many steps to interleave with."""
    monkeypatch.setattr(prepare, "ROW_GROUP_ROWS", 2)


def on_rows_of(monkeypatch: pytest.MonkeyPatch, branch: str, action: Callable[[], None]) -> None:
    """Run `action` once, right after the first rows of `branch` reached the writer."""
    original = prepare._BranchScanner._add
    done: list[bool] = []

    def add(self, batch):
        original(self, batch)
        if branch in batch.column("branch").to_pylist() and not done:
            done.append(True)
            action()

    monkeypatch.setattr(prepare._BranchScanner, "_add", add)


def test_a_run_holds_every_uncommitted_address_and_nothing_else(repo: Repository) -> None:
    main = repo.branch("main")
    committed = main.upload("kept", b"c")
    overwritten = main.upload("over", b"1")
    main.commit("base")
    dev = repo.create_branch("dev")
    staged = main.upload("new", b"n")
    rewrite = main.upload("over", b"2")
    main.delete("kept")
    dropped = main.upload("gone", b"g")
    main.delete("gone")
    on_dev = dev.upload("dev/only", b"d")
    run = repo.prepare_uncommitted_for_gc()
    assert run_rows(repo, run) == {
        (staged.address, "main", "staged"),
        (rewrite.address, "main", "staged"),
        (on_dev.address, "dev", "staged"),
    }
    assert not {committed.address, overwritten.address, dropped.address} & run_addresses(repo, run)
    table = run_table(repo, run).to_pylist()
    times = {row["address"]: row["creation_time"] for row in table}
    assert times[staged.address] == staged.mtime
    sizes = {row["address"]: row["size"] for row in table}
    assert sizes[staged.address] == staged.size == 1
    manifest = read_manifest(objects(repo), run.run_id)
    assert manifest["branches"] == {"dev": 1, "main": 2}
    assert manifest["token_expiry_seconds"] == 6 * 3600
    assert manifest["min_age_seconds"] >= manifest["token_expiry_seconds"]
    assert run.location == objects(repo).uri(f"{RETENTION_PREFIX}{run.run_id}")


def test_sealed_tokens_are_included(repo: Repository) -> None:
    main = repo.branch("main")
    sealed = main.upload("a", b"a")
    commit_ops.seal(repo.lake.graveler, repo.record, "main")
    staged = main.upload("b", b"b")
    run = repo.prepare_uncommitted_for_gc()
    assert run_rows(repo, run) == {
        (sealed.address, "main", "sealed"),
        (staged.address, "main", "staged"),
    }


def test_branches_decoded_together_keep_their_rows_apart(repo: Repository) -> None:
    """Staged values of several branches and layers are decoded in one batch: each row keeps
    its branch and source, and tombstones among them drop only themselves."""
    expected = set()
    for name in ("b-one", "b-two", "b-three"):
        branch = repo.create_branch(name)
        sealed = branch.upload(f"{name}/sealed", b"s")
        branch.upload(f"{name}/gone", b"g")
        branch.delete(f"{name}/gone")
        commit_ops.seal(repo.lake.graveler, repo.record, name)
        branch.upload(f"{name}/dropped", b"d")
        branch.delete(f"{name}/dropped")
        staged = branch.upload(f"{name}/staged", b"t")
        expected |= {(sealed.address, name, "sealed"), (staged.address, name, "staged")}
    run = repo.prepare_uncommitted_for_gc()
    assert run_rows(repo, run) == expected
    manifest = read_manifest(objects(repo), run.run_id)
    assert manifest["branches"] == {"b-one": 2, "b-three": 2, "b-two": 2}


def test_compacted_entries_head_lacks_are_included(repo: Repository) -> None:
    main = repo.branch("main")
    base = main.upload("base", b"b")
    main.commit("base")
    compacted = main.upload("compacted", b"c" * 7)
    compact(repo, "main")
    staged = main.upload("staged", b"s" * 3)
    run = repo.prepare_uncommitted_for_gc()
    assert run_rows(repo, run) == {
        (compacted.address, "main", "compacted"),
        (staged.address, "main", "staged"),
    }
    assert base.address not in run_addresses(repo, run)
    sizes = {row["address"]: row["size"] for row in run_table(repo, run).to_pylist()}
    assert sizes == {compacted.address: 7, staged.address: 3}


def test_a_path_written_back_to_heads_content_is_compacted_to_heads_object(
    repo: Repository,
) -> None:
    """Written back to HEAD's content after a compaction changed it, a path is compacted to
    HEAD's object, as a commit would settle it: the rewritten object is then referenced by
    nothing, and a prepare run does not hold it."""
    main = repo.branch("main")
    main.upload("p", b"L")
    main.commit("L")
    committed = main.stat("p").address
    main.upload("p", b"M")
    compact(repo, "main")
    rewritten = main.upload("p", b"L").address
    assert rewritten != committed
    compact(repo, "main")
    assert main.stat("p").address == committed
    assert list(main.uncommitted()) == []
    assert rewritten not in run_addresses(repo, repo.prepare_uncommitted_for_gc())


def test_a_copy_made_during_a_run_keeps_its_source_alive(
    repo: Repository, small_chunks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The seed's race: the scan passed the copy's path, the source is deleted before the
    scan reaches it. Only the copy record, read after the scan, holds the address."""
    main = repo.branch("main")
    for i in range(4):
        main.upload(f"a/{i}", b"a")
    source = main.upload("z/source", b"precious")

    def copy_then_delete() -> None:
        main.copy("z/source", "a/0-copy")
        main.delete("z/source")

    on_rows_of(monkeypatch, "main", copy_then_delete)
    run = repo.prepare_uncommitted_for_gc()
    held = {(b, kind) for address, b, kind in run_rows(repo, run) if address == source.address}
    assert held == {("main", "copy")}


def test_a_branch_deleted_during_its_scan_is_skipped(
    repo: Repository, small_chunks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    dev = repo.create_branch("dev")
    for i in range(6):
        dev.upload(f"d/{i}", b"d")
    on_main = repo.branch("main").upload("m", b"m")

    def delete_dev() -> None:
        repo.delete_branch("dev")
        repo.lake.wait_for_cleanup()

    on_rows_of(monkeypatch, "dev", delete_dev)
    run = repo.prepare_uncommitted_for_gc()
    assert (on_main.address, "main", "staged") in run_rows(repo, run)


def test_a_compaction_during_the_scan_is_followed(
    repo: Repository, small_chunks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    main = repo.branch("main")
    entries = [main.upload(f"p/{i}", b"x") for i in range(8)]

    def compact_now() -> None:
        compact(repo, "main")
        repo.lake.wait_for_cleanup()

    on_rows_of(monkeypatch, "main", compact_now)
    run = repo.prepare_uncommitted_for_gc()
    found = run_rows(repo, run)
    assert {e.address for e in entries} <= run_addresses(repo, run)
    assert {kind for _, _, kind in found} == {"staged", "compacted"}


def test_files_target_the_configured_size(lake: Lake, repo: Repository, small_chunks: None) -> None:
    use_clock(lake, FakeClock(), GCSettings(prepare_file_bytes=1))
    main = repo.branch("main")
    uploaded = {main.upload(f"p/{i}", b"x").address for i in range(7)}
    run = repo.prepare_uncommitted_for_gc()
    manifest = read_manifest(objects(repo), run.run_id)
    parts = [f for f in manifest["files"] if f.startswith("uncommitted/part-")]
    assert len(parts) == 4
    assert run_addresses(repo, run) == uploaded
    assert sorted(run_keys(repo, run.run_id)) == sorted([*manifest["files"], MANIFEST])


def test_an_empty_run_is_readable(repo: Repository) -> None:
    run = repo.prepare_uncommitted_for_gc()
    manifest = read_manifest(objects(repo), run.run_id)
    assert manifest["files"] == ["uncommitted/copies-00000.parquet"]
    assert run_table(repo, run).num_rows == 0


class RecordingPuts:
    """Wraps an object store: records the keys put, and can fail one put."""

    def __init__(self, store, fail_on: Callable[[str, int], bool] = lambda k, n: False):
        self.store, self.fail_on, self.puts = store, fail_on, []

    def __getattr__(self, name):
        return getattr(self.store, name)

    def put(self, key, data):
        if self.fail_on(key, len(self.puts)):
            raise Unavailable(f"injected failure writing {key}")
        self.puts.append(key)
        return self.store.put(key, data)


def wrap_objects(repo: Repository, wrapper: RecordingPuts) -> None:
    g = repo.lake.graveler
    g._objects[repo.storage_namespace] = wrapper


def test_the_manifest_is_written_last(repo: Repository, small_chunks: None) -> None:
    main = repo.branch("main")
    for i in range(5):
        main.upload(f"p/{i}", b"x")
    main.copy("p/0", "q/0")
    recording = RecordingPuts(objects(repo))
    wrap_objects(repo, recording)
    run = repo.prepare_uncommitted_for_gc()
    assert recording.puts[-1].endswith(f"{run.run_id}/{MANIFEST}")
    parts = [k for k in recording.puts if "/uncommitted/part-" in k]
    copies = [k for k in recording.puts if "/uncommitted/copies-" in k]
    assert recording.puts.index(copies[0]) > recording.puts.index(parts[-1])
    assert PROGRESS not in run_keys(repo, run.run_id)


@pytest.mark.parametrize("crash", ["part", "progress", "copies", "manifest"])
def test_an_interrupted_run_resumes_to_the_same_result(
    lake: Lake, repo: Repository, small_chunks: None, crash: str
) -> None:
    use_clock(lake, FakeClock(), GCSettings(prepare_file_bytes=1))
    expected = set()
    for name in ("a-branch", "b-branch"):
        branch = repo.create_branch(name)
        expected |= {(branch.upload(f"p/{i}", b"x").address, name) for i in range(5)}
    expected |= {(repo.branch("main").upload("m", b"m").address, "main")}
    plain = objects(repo)
    target, nth = {
        "part": ("part-00002", 1),
        "progress": (PROGRESS, 3),
        "copies": ("copies-00000", 1),
        "manifest": (MANIFEST, 1),
    }[crash]
    attempts: list[str] = []

    def fail(key: str, _: int) -> bool:
        if target in key:
            attempts.append(key)
        return len(attempts) == nth and target in key

    wrap_objects(repo, RecordingPuts(plain, fail))
    with pytest.raises(Unavailable) as failed:
        repo.prepare_uncommitted_for_gc()
    run_id = next(iter(run_keys_by_run(repo)))
    assert f"run_id={run_id!r} to resume it" in str(failed.value)
    with pytest.raises(NotFound):
        read_manifest(plain, run_id)
    plain.put(f"{RETENTION_PREFIX}{run_id}/uncommitted/part-00099.parquet", b"stray")
    wrap_objects(repo, plain)
    run = repo.prepare_uncommitted_for_gc(run_id)
    assert run.run_id == run_id
    table = run_table(repo, run)
    columns = (table.column("address").to_pylist(), table.column("branch").to_pylist())
    found = list(zip(*columns, strict=True))
    assert set(found) == expected
    assert len(found) == len(expected)
    manifest = read_manifest(plain, run_id)
    assert sorted(run_keys(repo, run_id)) == sorted([*manifest["files"], MANIFEST])
    assert manifest["branches"] == {"a-branch": 5, "b-branch": 5, "main": 1}


def failing_after_checkpoint(nth: int) -> Callable[[str, int], bool]:
    """A `RecordingPuts` rule: every put after the `nth` progress checkpoint fails, as if the
    process was killed right after writing it."""
    written: list[str] = []

    def fail(key: str, _: int) -> bool:
        if len(written) >= nth:
            return True
        if key.endswith(PROGRESS):
            written.append(key)
        return False

    return fail


def test_a_run_killed_right_after_any_checkpoint_resumes_to_every_entry(
    lake: Lake, repo: Repository, small_chunks: None
) -> None:
    """The checkpoint a finished file writes must not cover rows still on their way to the
    writer: a compacted layer's rows follow a branch's staged ones, and a kill right after
    the file the staged ones finished lost them when the cursor had already moved past."""
    use_clock(lake, FakeClock(), GCSettings(prepare_file_bytes=1))
    a = repo.create_branch("a")
    for i in range(3):
        a.upload(f"a{i}", b"x")
    compact(repo, "a")
    b = repo.create_branch("b")
    for i in range(2):
        b.upload(f"b{i}", b"x")
    compact(repo, "b")
    b.upload("b9", b"x")
    c = repo.create_branch("c")
    for i in range(3):
        c.upload(f"c{i}", b"x")
    expected = {(e.address, name) for name in "abc" for e in repo.branch(name).list()}
    plain = objects(repo)
    for kill_after in range(1, 100):
        wrap_objects(repo, RecordingPuts(plain, failing_after_checkpoint(kill_after)))
        try:
            repo.prepare_uncommitted_for_gc()
        except Unavailable:
            pass
        else:
            break
        wrap_objects(repo, plain)
        (run_id,) = {r for r in run_keys_by_run(repo) if PROGRESS in run_keys(repo, r)}
        run = repo.prepare_uncommitted_for_gc(run_id)
        found = {(address, branch) for address, branch, _ in run_rows(repo, run)}
        assert found == expected, f"killed after checkpoint {kill_after}"
    assert kill_after > 3, "the run wrote few checkpoints: the kills tested little"


def run_keys_by_run(repo: Repository) -> set[str]:
    return {
        info.key[len(RETENTION_PREFIX) :].split("/")[0]
        for info in objects(repo).list_objects(RETENTION_PREFIX)
    }


class RefusingProgressDeletes(RecordingPuts):
    def delete(self, keys):
        if any(key.endswith(PROGRESS) for key in keys):
            raise Unavailable("deletes are refused here")
        self.store.delete(keys)


def test_a_run_finished_but_for_its_progress_file_is_finished(repo: Repository) -> None:
    """The manifest is written: a progress file that could not be deleted changes nothing,
    and the run is returned, not reported failed (a caller would prepare a new one)."""
    repo.branch("main").upload("a", b"a")
    wrap_objects(repo, RefusingProgressDeletes(objects(repo)))
    run = repo.prepare_uncommitted_for_gc()
    assert PROGRESS in run_keys(repo, run.run_id)
    assert repo.prepare_uncommitted_for_gc(run.run_id) == run
    assert len(run_table(repo, run)) == 1


def test_resuming_a_finished_run_returns_it_unchanged(repo: Repository) -> None:
    repo.branch("main").upload("a", b"a")
    run = repo.prepare_uncommitted_for_gc()
    manifest = read_manifest(objects(repo), run.run_id)
    repo.branch("main").upload("b", b"b")
    assert repo.prepare_uncommitted_for_gc(run.run_id) == run
    assert read_manifest(objects(repo), run.run_id) == manifest


@pytest.mark.parametrize(
    "damage",
    [
        b"{not json",
        b"[]",
        b'{"started_at": "yesterday", "files": [], "token_expiry_seconds": 1, '
        b'"min_age_seconds": 1}',
        b'{"started_at": "2026-11-24T06:00:00+00:00", "files": "part-0.parquet", '
        b'"token_expiry_seconds": 1, "min_age_seconds": 1}',
        b'{"started_at": "2026-11-24T06:00:00+00:00", "files": []}',
    ],
    ids=["not JSON", "a list", "a bad time", "files not a list", "no time limits"],
)
def test_a_damaged_manifest_is_corrupted_data_and_a_new_run_is_unaffected(
    repo: Repository, damage: bytes
) -> None:
    repo.branch("main").upload("a", b"a")
    run = repo.prepare_uncommitted_for_gc()
    objects(repo).put(f"{RETENTION_PREFIX}{run.run_id}/{MANIFEST}", damage)

    with pytest.raises(CorruptedData, match=f"{run.run_id!r} has a damaged manifest.*new run"):
        repo.uncommitted_gc_run(run.run_id)
    with pytest.raises(CorruptedData, match="damaged manifest"):
        repo.prepare_uncommitted_for_gc(run.run_id)
    again = repo.prepare_uncommitted_for_gc()
    assert repo.uncommitted_gc_run(again.run_id).keys


def test_a_run_of_another_repository_is_not_resumed(
    lake: Lake, repo: Repository, small_chunks: None
) -> None:
    for i in range(5):
        repo.branch("main").upload(f"p/{i}", b"x")
    plain = objects(repo)
    wrap_objects(repo, RecordingPuts(plain, lambda key, n: MANIFEST in key))
    with pytest.raises(Unavailable):
        repo.prepare_uncommitted_for_gc()
    (run_id,) = run_keys_by_run(repo)
    namespace = repo.storage_namespace
    lake.delete_repository("sales")
    lake.wait_for_cleanup()
    again = lake.create_repository("sales", storage_namespace=namespace)
    with pytest.raises(InvalidArgument, match="another repository"):
        again.prepare_uncommitted_for_gc(run_id)


def test_a_finished_run_of_another_repository_is_refused(lake: Lake, repo: Repository) -> None:
    """A repository made again over a deleted one's namespace finds its runs there: their
    listing is of the other repository's references, so no mark may be made from it."""
    repo.branch("main").upload("p", b"x")
    run_id = repo.prepare_uncommitted_for_gc().run_id
    namespace = repo.storage_namespace
    lake.delete_repository("sales")
    again = lake.create_repository("sales", storage_namespace=namespace)
    with pytest.raises(InvalidArgument, match="another repository"):
        again.prepare_uncommitted_for_gc(run_id)
    with pytest.raises(InvalidArgument, match="another repository"):
        again.uncommitted_gc_run(run_id)


def test_a_malformed_run_id_is_refused(repo: Repository) -> None:
    with pytest.raises(InvalidArgument):
        repo.prepare_uncommitted_for_gc("../../elsewhere")


def test_run_ids_sort_newest_first_and_encode_the_start(lake: Lake, repo: Repository) -> None:
    clock = FakeClock()
    use_clock(lake, clock)
    first = repo.prepare_uncommitted_for_gc()
    clock.advance(timedelta(seconds=1))
    second = repo.prepare_uncommitted_for_gc()
    assert sorted([first.run_id, second.run_id]) == [second.run_id, first.run_id]
    assert newest_first_time(first.run_id) == clock.now - timedelta(seconds=1)
    manifest = read_manifest(objects(repo), second.run_id)
    assert manifest["started_at"] == clock.now.isoformat()


def test_a_run_longer_than_the_copy_record_lifetime_fails(
    lake: Lake, repo: Repository, small_chunks: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = FakeClock()
    use_clock(lake, clock, GCSettings(copy_record_ttl=timedelta(hours=1)))
    for i in range(4):
        repo.branch("main").upload(f"p/{i}", b"x")
    on_rows_of(monkeypatch, "main", lambda: clock.advance(timedelta(hours=1)))
    with pytest.raises(RunExpired):
        repo.prepare_uncommitted_for_gc()
    (run_id,) = run_keys_by_run(repo)
    assert MANIFEST not in run_keys(repo, run_id)


def test_parquet_files_carry_the_schema(repo: Repository) -> None:
    repo.branch("main").upload("a", b"a")
    run = repo.prepare_uncommitted_for_gc()
    manifest = read_manifest(objects(repo), run.run_id)
    path = run.location.removeprefix("file://") + "/" + manifest["files"][0]
    schema = pq.read_schema(path)
    assert schema.names == ["address", "creation_time", "branch", "source", "size"]
    assert json.loads(objects(repo).get(f"{RETENTION_PREFIX}{run.run_id}/{MANIFEST}"))


@pytest.mark.slow
@pytest.mark.spark
def test_spark_reads_a_run(repo: Repository, spark) -> None:
    main = repo.branch("main")
    staged = main.upload("a", b"a")
    main.copy("a", "b")
    repo.create_branch("dev").upload("d", b"d")
    run = repo.prepare_uncommitted_for_gc()
    frame = spark.read.parquet(f"{run.location}/uncommitted")
    assert set(frame.columns) == {"address", "creation_time", "branch", "source", "size"}
    collected = {(r.address, r.branch, r.source) for r in frame.collect()}
    assert collected == run_rows(repo, run)
    assert (staged.address, "main", "copy") in collected
    assert dict(frame.dtypes)["creation_time"] == "timestamp"


def test_progress_counts_the_entries_written(repo: Repository, small_chunks: None) -> None:
    main = repo.branch("main")
    for i in range(5):
        main.upload(f"p/{i}", b"x")
    seen: list[int] = []
    repo.prepare_uncommitted_for_gc(progress=seen.append)
    assert seen == sorted(seen) and seen[-1] == 5


@pytest.fixture
def staged(repo: Repository) -> Repository:
    """`repo` with an uncommitted object: a run of it writes files."""
    repo.branch("main").upload("p/0", b"x")
    return repo


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    run_id=any_text(24)
    | not_text()
    | st.builds("{}{}".format, st.from_regex(r"[0-9a-f]{12}-[0-9a-f]{6}", fullmatch=True), LINE)
    | st.sampled_from(["000000000000-abcdef", "../../elsewhere", "0123456789ab-abcdef/x"])
)
def test_a_malformed_run_id_is_refused_before_anything_is_written(
    lake: Lake, staged: Repository, tmp_path: Path, run_id: object
) -> None:
    assume(run_id is not None)  # a new run
    before = stored(lake.graveler.kv, tmp_path)
    with pytest.raises(InvalidArgument, match=re.escape(repr(run_id))):
        staged.prepare_uncommitted_for_gc(run_id)  # type: ignore[arg-type]
    assert stored(lake.graveler.kv, tmp_path) == before


def test_a_run_id_that_was_never_started_is_not_started_under_the_callers_time(
    lake: Lake, staged: Repository, tmp_path: Path
) -> None:
    """A run's time is the line GC protects writes after: an id dated seven hours ahead
    would have let a sweep delete an upload staged after the scan. A future id is refused;
    a well-formed id of now that never saved progress is not started either."""
    clock = FakeClock()
    use_clock(lake, clock)
    before = stored(lake.graveler.kv, tmp_path)
    ahead = newest_first_id(clock.now + timedelta(hours=7))
    with pytest.raises(InvalidArgument, match=f"{ahead!r} starts 7:00:00 from now"):
        staged.prepare_uncommitted_for_gc(ahead)
    unknown = newest_first_id(clock.now)
    with pytest.raises(NotFound, match=f"{unknown!r} of 'sales' has saved no progress"):
        staged.prepare_uncommitted_for_gc(unknown)
    assert stored(lake.graveler.kv, tmp_path) == before
    within_skew = newest_first_id(clock.now + prepare.CLOCK_SKEW_MARGIN / 2)
    with pytest.raises(NotFound, match="saved no progress"):
        staged.prepare_uncommitted_for_gc(within_skew)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(beyond=st.timedeltas(timedelta(0), timedelta(days=20_000)))
def test_an_expired_run_id_fails_before_anything_is_written(
    lake: Lake, staged: Repository, tmp_path: Path, beyond: timedelta
) -> None:
    clock = FakeClock()
    use_clock(lake, clock)
    ttl = lake.gc.settings.copy_record_ttl
    run_id = newest_first_id(clock.now - ttl + prepare.CLOCK_SKEW_MARGIN - beyond)
    before = stored(lake.graveler.kv, tmp_path)
    with pytest.raises(RunExpired, match=re.escape(run_id)):
        staged.prepare_uncommitted_for_gc(run_id)
    assert stored(lake.graveler.kv, tmp_path) == before
