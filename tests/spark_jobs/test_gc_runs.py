"""The GC job end to end: clean runs, dry runs and sweeps, optimized runs, saved runs, report."""

from __future__ import annotations

import json
import os
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from branchwater.engine import GateFailed, InvalidArgument, NotFound
from branchwater.engine.gc.addresses import AddressAllocator
from branchwater.engine.gc.runs import files, statuses
from branchwater.engine.gc.runs.config import JobConfig
from branchwater.engine.gc.runs.explain import explain
from branchwater.engine.gc.runs.storage import Namespace
from branchwater.engine.gc.runs.sweeps import sweep_without_spark
from branchwater.spark_jobs.gc.committed import read_committed
from tests.helpers.gc import FakeClock, GCLake, use_clock
from tests.helpers.servers import unique_name

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def history(gc: GCLake) -> tuple[set[str], set[str]]:
    """A small history; returns (addresses a run must keep, addresses it must delete)."""
    main = gc.repo.branch("main")
    committed = main.upload("a", b"one").address
    main.commit("one")
    staged = main.upload("a", b"two").address
    dropped = main.upload("b", b"three").address
    main.delete("b")
    dev = gc.repo.create_branch("dev", source="main")
    reset = dev.upload("c", b"four").address
    dev.reset()
    return {committed, staged}, {dropped, reset, *gc.put_garbage(2)}


@pytest.mark.parametrize("where", ["local", pytest.param("s3", marks=pytest.mark.s3)])
def test_a_clean_run_deletes_exactly_the_unreferenced_objects(
    where: str, request: pytest.FixtureRequest
) -> None:
    gc: GCLake = request.getfixturevalue(f"{where}_gc")
    keep, garbage = history(gc)

    summary = gc.run()

    assert set(gc.data_objects()) == keep
    assert summary.status == statuses.SWEPT and summary.gate_success
    assert summary.mode == "clean" and summary.fallback is None
    assert summary.volume("candidates").objects == len(garbage)
    assert summary.volume("deleted").objects == len(garbage)
    assert summary.volume("listed").objects == len(keep | garbage)
    assert summary.min_age_override
    assert sum(v.objects for v in summary.reclaimed_by_slice) == len(garbage)
    ns = Namespace.of(gc.repo.storage_namespace, gc.s3_options)
    saved = files.read_summary(ns, summary.run_id)
    assert saved.status == statuses.SWEPT and saved.counts == summary.counts
    assert set(addresses(ns, summary.files["deleted"][0])) <= garbage
    check_report(gc, summary)


def check_report(gc: GCLake, summary: files.RunSummary) -> None:
    """One offline page with the summary, the chart and GX's own results."""
    prefix = files.run_prefix(summary.run_id)
    page = gc.objects.get(prefix + files.REPORT).decode()
    assert summary.report_uri.endswith(prefix + files.REPORT)
    assert "<svg" in page and "reclaimed bytes per slice" in page
    assert "expect_column_values_to_be_null" in page and "Minimum age overridden" in page
    assert f"<th>marked on</th><td>the {summary.slices['marked_on']}</td>" in page
    assert "none kept for a suite that passed" in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert "<script" not in page
    validation = json.loads(gc.objects.get(prefix + files.VALIDATION))
    assert set(validation) == {"gc-candidates", "gc-prepare-output"}
    assert all(v["success"] for v in validation.values())


def test_in_slices_opened_long_before_the_cutoff_each_object_still_counts_by_its_own_time(
    local_gc: GCLake,
) -> None:
    """A committed object of a settled slice is not looked up (its size is the entry's);
    everything else is, so a garbage object written there late survives as young."""
    opened = datetime.now(UTC) - timedelta(days=10)
    old = AddressAllocator(clock=opened.timestamp)
    local_gc.lake.addresses = local_gc.lake.gc.addresses = old
    keep, garbage = history(local_gc)
    [late] = local_gc.put_garbage(1)
    root = Path(local_gc.repo.storage_namespace.removeprefix("file://"))
    for address in keep | garbage:
        os.utime(root / address, (opened.timestamp(), opened.timestamp()))
    sizes = {address: (root / address).stat().st_size for address in keep | garbage | {late}}
    assert len({address.split("/")[1] for address in sizes}) == 1

    summary = local_gc.run(min_age=timedelta(hours=1))

    assert set(local_gc.data_objects()) == keep | {late}
    assert summary.volume("listed") == files.Volume(len(sizes), sum(sizes.values()))
    assert summary.volume("young") == files.Volume(1, sizes[late])
    assert summary.volume("deleted") == files.Volume(len(garbage), sum(sizes[a] for a in garbage))
    in_commit = keep & committed_addresses(local_gc)
    assert in_commit and summary.volume("committed").bytes == sum(sizes[a] for a in in_commit)


def committed_addresses(gc: GCLake) -> set[str]:
    head = gc.repo.branch("main").commit_id
    return {entry.address for entry in gc.repo.ref(head).list()}


def addresses(ns: Namespace, key: str) -> list[str]:
    return ns.read_parquet(key, ["address"]).column(0).to_pylist()


def test_a_dry_run_marks_and_a_sweep_of_its_mark_deletes(local_gc: GCLake) -> None:
    """An unswept mark is no base: an optimized run after it runs clean and says so."""
    keep, garbage = history(local_gc)

    mark = local_gc.run(dry_run=True)
    assert mark.status == statuses.MARKED and mark.volume("candidates").objects == len(garbage)
    assert set(local_gc.data_objects()) == keep | garbage
    fallback = local_gc.run(mode="optimized", dry_run=True)
    assert fallback.mode == "clean" and fallback.requested_mode == "optimized"
    assert fallback.fallback is not None and "clean run instead" in fallback.fallback
    assert fallback.volume("candidates").objects == len(garbage)

    swept = local_gc.run(sweep=mark.run_id)
    assert swept.run_id == mark.run_id and swept.status == statuses.SWEPT
    assert set(local_gc.data_objects()) == keep
    assert swept.volume("deleted").objects == len(garbage)


def test_an_optimized_run_whose_late_writes_window_widened_runs_clean(local_gc: GCLake) -> None:
    """A base settled old slices by a narrower window: an object landing later than it
    allowed (now allowed, under longer link tokens) was never considered by it."""
    keep, _ = history(local_gc)
    base = local_gc.run()
    assert base.status == statuses.SWEPT

    widened = local_gc.run(mode="optimized", late_writes=timedelta(days=2))
    assert widened.mode == "clean" and widened.base_run is None
    assert widened.fallback is not None and "late-writes window" in widened.fallback

    narrower = local_gc.run(mode="optimized")
    assert narrower.mode == "optimized" and narrower.base_run == widened.run_id
    assert set(local_gc.data_objects()) == keep


def test_a_late_writes_window_of_zero_is_taken_as_given(local_gc: GCLake) -> None:
    history(local_gc)
    summary = local_gc.run(dry_run=True, late_writes=timedelta(0))
    assert summary.slices["late_writes_seconds"] == 0


def test_a_mark_with_no_candidates_is_swept_without_spark(local_gc: GCLake) -> None:
    """Nothing to delete: the sweep starts no session, and the run becomes a base for the
    next optimized run as a sweep on Spark would make it; a mark with candidates is refused
    there and stays as it was."""
    main = local_gc.repo.branch("main")
    main.upload("a", b"one")
    main.commit("one")
    empty = local_gc.run(dry_run=True)
    assert empty.volume("candidates").objects == 0 and files.nothing_to_delete(empty)
    config = JobConfig(local_gc.kv_url, local_gc.repo.name, sweep=empty.run_id)

    swept = sweep_without_spark(local_gc.repo, config)

    assert swept.status == statuses.SWEPT and swept.volume("deleted").objects == 0
    ns = Namespace.of(local_gc.repo.storage_namespace)
    assert files.read_summary(ns, empty.run_id).status == statuses.SWEPT
    assert local_gc.run(mode="optimized", dry_run=True).base_run == empty.run_id

    garbage = set(local_gc.put_garbage(2))
    marked = local_gc.run(dry_run=True)
    assert not files.nothing_to_delete(marked)
    with pytest.raises(InvalidArgument, match="has candidates: sweep it on Spark"):
        sweep_without_spark(
            local_gc.repo, JobConfig(local_gc.kv_url, local_gc.repo.name, sweep=marked.run_id)
        )
    assert garbage <= set(local_gc.data_objects())
    unswept = files.read_summary(ns, marked.run_id)
    assert (unswept.status, unswept.error) == (statuses.MARKED, None)


def test_a_failed_gate_deletes_nothing_and_its_mark_cannot_be_swept(local_gc: GCLake) -> None:
    keep, garbage = history(local_gc)

    summary = local_gc.run(max_share=0.1)

    assert summary.status == statuses.GATE_FAILED and not summary.gate_success
    assert set(local_gc.data_objects()) == keep | garbage
    [failed] = summary.failed_expectations()
    assert failed.type == "expect_table_row_count_to_be_between"
    assert failed.observed["observed_value"] == len(garbage)
    with pytest.raises(GateFailed, match="expect_table_row_count_to_be_between"):
        local_gc.run(sweep=summary.run_id)
    with pytest.raises(NotFound, match="not a GC run id"):
        local_gc.run(sweep="no-such-run")


def test_an_optimized_run_reads_only_new_ranges_and_collects_new_garbage(
    local_gc: GCLake,
) -> None:
    keep, _ = history(local_gc)
    first = local_gc.run()
    main = local_gc.repo.branch("main")
    main.commit("two")
    later = main.upload("d", b"five").address
    main.delete("d")
    garbage = set(local_gc.put_garbage())

    # All that is new is garbage: the gate bounds it by the namespace, not by what is new.
    second = local_gc.run(mode="optimized", max_share=0.5)

    assert second.mode == "optimized" and second.base_run == first.run_id
    assert (first.slices["marked_on"], second.slices["marked_on"]) == ("executors", "driver")
    assert second.gate_success and second.volume("new").objects == len(garbage) + 1
    known = first.volume("namespace").objects - first.volume("deleted").objects
    assert second.volume("namespace").objects == known + second.volume("new").objects
    assert second.ranges["metaranges_read"] == 1
    assert set(local_gc.data_objects()) == keep
    assert second.volume("deleted").objects == len(garbage) + 1
    assert later not in local_gc.data_objects()


def test_an_optimized_run_reading_more_than_driver_rows_marks_on_the_executors_alike(
    local_gc: GCLake,
) -> None:
    history(local_gc)
    local_gc.run()
    main = local_gc.repo.branch("main")
    main.upload("e", b"six")
    main.commit("three")
    main.upload("f", b"seven")
    local_gc.put_garbage(2)

    small = local_gc.run(mode="optimized", dry_run=True)
    large = local_gc.run(mode="optimized", dry_run=True, driver_rows=1)

    assert (small.slices["marked_on"], large.slices["marked_on"]) == ("driver", "executors")
    assert small.gate_success and large.gate_success
    assert small.counts == large.counts and small.volume("candidates").objects == 2
    assert small.reclaimed_by_slice == large.reclaimed_by_slice


def test_a_run_leaves_nothing_cached_in_the_spark_session(local_gc: GCLake) -> None:
    """Nothing a run reads or computes stays cached in the session, whichever way it marks
    (neither the mark nor the gate caches a frame: each reads its files again)."""
    history(local_gc)
    context = local_gc.spark.sparkContext

    def cached() -> int:
        return context._jsc.getPersistentRDDs().size()  # type: ignore[union-attr]

    before = cached()
    clean = local_gc.run(dry_run=True)
    swept = local_gc.run()
    local_gc.put_garbage(2)
    on_driver = local_gc.run(mode="optimized", dry_run=True)
    on_executors = local_gc.run(mode="optimized", dry_run=True, driver_rows=1)

    assert clean.volume("candidates").objects > 0 and swept.gate_success
    marked = (on_driver.slices["marked_on"], on_executors.slices["marked_on"])
    assert marked == ("driver", "executors")
    assert on_driver.volume("candidates").objects == 2 and on_executors.gate_success
    assert cached() == before


def test_no_commit_since_the_base_run_costs_the_committed_listing_no_spark_job(
    local_gc: GCLake,
) -> None:
    history(local_gc)
    layout = local_gc.repo.committed_layout()
    ns = Namespace.of(local_gc.repo.storage_namespace)
    context = local_gc.spark.sparkContext
    group = unique_name("committed-")
    context.setJobGroup(group, "the committed listing of an optimized run")
    try:
        known = set(layout.metarange_ids())
        found = read_committed(local_gc.spark, ns, layout, known, set(), 2, "scratch")
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)  # type: ignore[arg-type]
    assert (found.new_metaranges, found.new_ranges, found.metarange_ids) == (0, 0, sorted(known))
    assert context.statusTracker().getJobIdsForGroup(group) == []


def test_an_address_committed_and_uncommitted_at_the_base_run_survives_an_optimized_run(
    local_gc: GCLake,
) -> None:
    """The issue's counter-example to the seed's optimized flow: a shallow copy within a
    branch made while a commit of its source runs, later deleted and its copy record gone.
    The address is then neither uncommitted nor in a new commit, yet a commit holds it."""
    clock = FakeClock(datetime.now(UTC))
    use_clock(local_gc.lake, clock)
    main = local_gc.repo.branch("main")
    address = main.upload("t/a", b"a").address
    copies: list[str] = []

    def copy_while_committing(applied: int) -> None:
        if not copies:
            copies.append(main.copy("t/a", "t/b").address)

    main.commit("a", progress=copy_while_committing)
    assert copies == [address] and main.stat("t/b").address == address
    assert [c.path for c in main.uncommitted()] == ["t/b"]
    local_gc.run()
    main.delete("t/b")
    assert local_gc.lake.gc.housekeeper.wait(30), "a sweep still under way would count first"
    clock.advance(local_gc.lake.gc.settings.copy_record_ttl + timedelta(minutes=1))
    assert local_gc.lake.gc.copies.sweep(local_gc.repo.record) == 1
    garbage = set(local_gc.put_garbage(2))

    summary = local_gc.run(mode="optimized")

    assert summary.mode == "optimized"
    assert set(local_gc.data_objects()) == {address}
    assert summary.volume("deleted").objects == len(garbage)
    assert main.read("t/a") == b"a"


@pytest.mark.parametrize("where", ["local", pytest.param("s3", marks=pytest.mark.s3)])
def test_each_run_prunes_the_data_of_runs_older_than_the_newest_kept(
    where: str, request: pytest.FixtureRequest
) -> None:
    """Runs keep their summaries; the chain of optimized runs goes on from the kept base, and
    a sweep of a pruned mark is refused."""
    gc: GCLake = request.getfixturevalue(f"{where}_gc")
    keep, collected = history(gc)
    ns = Namespace.of(gc.repo.storage_namespace, gc.s3_options)
    dry = gc.run(dry_run=True)
    first = gc.run(keep_runs=2)
    notices: list[str] = []
    garbage = set(gc.put_garbage(2))

    second = gc.run(
        mode="optimized",
        keep_runs=1,
        events=lambda event: notices.append(str(event.get("message"))),
    )

    assert second.base_run == first.run_id
    assert "pruned 2 older runs' data, 0 abandoned run folders, 2 prepare outputs" in notices
    assert set(gc.data_objects()) == keep and not garbage & set(gc.data_objects())
    for run_id in (dry.run_id, first.run_id):
        pruned = files.read_summary(ns, run_id)
        assert pruned.pruned_at is not None and pruned.files == {}
        assert not ns.folder_keys(files.run_prefix(run_id) + files.CANDIDATES)
        assert not ns.folder_keys(files.run_prefix(run_id) + files.STATE)
    assert ns.folder_keys(files.run_prefix(second.run_id) + files.STATE)
    with pytest.raises(InvalidArgument, match="was pruned"):
        gc.run(sweep=dry.run_id)
    answer = explain(gc.repo, sorted(collected)[0], min_age=timedelta(0), s3_options=gc.s3_options)
    assert answer.verdict == "no object at this address"
    assert f"({dry.run_id} to {first.run_id}) whose records were pruned" in str(answer.reasons)
    third = gc.run(mode="optimized", keep_runs=1)
    assert third.mode == "optimized" and third.base_run == second.run_id
