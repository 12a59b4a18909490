"""Staging compaction on the in-memory KV: the sensor, the compactor, and every flow after it."""

from __future__ import annotations

import shutil
from datetime import datetime, timedelta, timezone

import pytest

from branchwater.engine import (
    AlreadyRecorded,
    CompactionPolicy,
    CompactionResult,
    CompactionStatus,
    DirtyBranch,
    InvalidArgument,
    Lake,
    NoChanges,
    NotFound,
)
from branchwater.engine.graveler import commit as commit_ops
from branchwater.engine.graveler import compaction, reads, uncommitted
from branchwater.engine.graveler.writes import stage_entry
from tests.helpers.views import listed

T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)


def changes(branch) -> list[tuple[str, str]]:
    return [(c.path, c.type) for c in branch.uncommitted()]


def committed_tree(repo, count: int = 40) -> None:
    main = repo.branch("main")
    for i in range(count):
        main.upload(f"d/{i:03d}", f"v{i}".encode())
    main.commit("tree")


def test_compaction_folds_staging_into_a_metarange_reads_use(lake: Lake, repo) -> None:
    committed_tree(repo)
    main = repo.branch("main")
    for i in range(0, 40, 2):
        main.delete(f"d/{i:03d}")
    main.upload("d/005", b"changed")
    main.upload("e/new", b"new")
    before = (listed(main), changes(main), main.read("d/005"))

    result = main.compact()

    assert isinstance(result, CompactionResult)
    assert result.compacted and result.outcome == "compacted"
    assert (result.entries_applied, result.tombstones_removed, result.sealed_tokens) == (2, 20, 1)
    assert result.ranges_written >= 1 and result.seconds > 0
    branch = lake.graveler.read_branch(repo.record, "main")
    assert branch.compacted_metarange_id == result.metarange_id
    assert branch.sealed_tokens == () and branch.compaction_start_time is not None
    assert lake.graveler.staging.is_empty(branch.staging_token)
    assert (listed(main), changes(main), main.read("d/005")) == before
    with pytest.raises(NotFound):
        main.stat("d/000")
    head_paths = listed(repo.ref(main.head().id))
    assert len(head_paths) == 40, "HEAD is untouched by compaction"


def test_compacted_tokens_are_dropped_in_the_background(lake: Lake, repo) -> None:
    committed_tree(repo, 10)
    main = repo.branch("main")
    main.delete("d/001")
    token = lake.graveler.read_branch(repo.record, "main").staging_token
    main.compact()
    lake.wait_for_cleanup()
    assert list(lake.graveler.kv.scan(token.encode())) == []
    assert list(lake.graveler.refs.partitions_to_delete()) == []


def test_commit_applies_on_the_compacted_metarange_and_clears_it(lake: Lake, repo) -> None:
    committed_tree(repo, 20)
    main = repo.branch("main")
    main.delete("d/000")
    main.compact()
    main.upload("after", b"a")
    main.delete("d/001")
    expected = listed(main)
    commit = main.commit("with compaction")
    assert listed(repo.ref(commit.id)) == expected
    branch = lake.graveler.read_branch(repo.record, "main")
    assert branch.compacted_metarange_id is None and branch.compaction_start_time is None
    assert changes(main) == []
    assert listed(main) == expected


def test_commit_of_a_compacted_branch_with_nothing_new_staged(repo) -> None:
    committed_tree(repo, 10)
    main = repo.branch("main")
    main.delete("d/003")
    main.compact()
    commit = main.commit("only compacted")
    assert "d/003" not in listed(repo.ref(commit.id))
    with pytest.raises(NoChanges):
        main.commit("again")


def test_repeated_compactions_stack(repo) -> None:
    committed_tree(repo, 30)
    main = repo.branch("main")
    main.delete("d/000")
    first = main.compact()
    main.delete("d/001")
    main.upload("d/000", b"back")
    second = main.compact()
    assert second.metarange_id != first.metarange_id
    assert changes(main) == [("d/000", "changed"), ("d/001", "removed")]
    assert main.read("d/000") == b"back"


def test_uncommitted_combines_staging_with_the_compacted_diff(lake: Lake, repo) -> None:
    committed_tree(repo, 30)
    main = repo.branch("main")
    committed = repo.ref("main").stat("d/001")
    main.delete("d/001")
    main.upload("d/002", b"x")
    main.upload("n/1", b"new")
    main.compact()
    stage_entry(lake.graveler, repo.record, "main", committed)  # hides the compacted removal
    main.delete("d/002")
    main.upload("d/003", b"y")
    main.upload("n/1", b"newer")
    main.delete("d/004")
    assert changes(main) == [
        ("d/002", "removed"),
        ("d/003", "changed"),
        ("d/004", "removed"),
        ("n/1", "added"),
    ]


@pytest.mark.parametrize("page, batch", [(7, 5), (1000, 5), (3, 1000)])
def test_uncommitted_pages_through_a_compacted_diff(repo, monkeypatch, page, batch) -> None:
    """Pages start past the last path of the one before, in the diff as in staging, and
    the compacted changes interleave with the staged ones batch by batch."""
    monkeypatch.setattr(reads, "CHANGES_PAGE_SIZE", page)
    monkeypatch.setattr(uncommitted, "BATCH", batch)
    committed_tree(repo, 60)
    main = repo.branch("main")
    for i in range(0, 60, 3):
        main.delete(f"d/{i:03d}")
    main.compact()
    for i in range(1, 60, 3):
        main.upload(f"d/{i:03d}", b"z")
    main.upload("m/1", b"m")
    expected = sorted(
        [(f"d/{i:03d}", "removed") for i in range(0, 60, 3)]
        + [(f"d/{i:03d}", "changed") for i in range(1, 60, 3)]
        + [("m/1", "added")]
    )
    assert changes(main) == expected


def test_listing_and_stat_after_compaction_with_prefix_and_after(repo) -> None:
    committed_tree(repo, 40)
    main = repo.branch("main")
    for i in range(10, 30):
        main.delete(f"d/{i:03d}")
    main.upload("d/015", b"again")
    main.compact()
    main.delete("d/031")
    assert listed(main, prefix="d/01") == ["d/015"]
    assert listed(main, after="d/009")[:3] == ["d/015", "d/030", "d/032"]
    assert main.stat("d/015").size == len(b"again")
    with pytest.raises(NotFound):
        main.stat("d/031")
    with pytest.raises(NotFound):
        main.delete("d/012")


def test_merge_into_a_compacted_branch_is_a_dirty_destination(repo) -> None:
    committed_tree(repo, 5)
    dev = repo.create_branch("dev", source="main")
    dev.upload("dev/1", b"1")
    dev.commit("dev")
    main = repo.branch("main")
    main.delete("d/000")
    main.compact()
    with pytest.raises(DirtyBranch):
        repo.merge("dev", into="main")
    main.commit("drop d/000")
    result = repo.merge("dev", into="main")
    assert {"dev/1", "d/001"} <= set(listed(repo.ref(result.commit.id)))
    assert "d/000" not in listed(main)


def test_merge_from_a_compacted_branch_takes_its_head_only(repo) -> None:
    committed_tree(repo, 5)
    dev = repo.create_branch("dev", source="main")
    dev.upload("dev/1", b"1")
    dev.commit("dev")
    dev.delete("d/000")
    dev.compact()
    repo.merge("dev", into="main")
    assert "d/000" in listed(repo.branch("main"))


def test_reset_and_delete_branch_drop_the_compaction(lake: Lake, repo) -> None:
    committed_tree(repo, 5)
    main = repo.branch("main")
    main.delete("d/000")
    main.compact()
    main.reset()
    branch = lake.graveler.read_branch(repo.record, "main")
    assert branch.compacted_metarange_id is None and branch.compaction_start_time is None
    assert listed(main) == [f"d/{i:03d}" for i in range(5)]
    assert changes(main) == []

    dev = repo.create_branch("dev", source="main")
    dev.delete("d/001")
    dev.compact()
    repo.delete_branch("dev")
    with pytest.raises(NotFound):
        repo.branch("dev")
    again = repo.create_branch("dev", source="main")
    assert "d/001" in listed(again)


def test_log_diff_and_refs_see_commits_not_compactions(lake: Lake, repo, tmp_path) -> None:
    committed_tree(repo, 5)
    main = repo.branch("main")
    log_before = [c.id for c in repo.log("main")]
    main.delete("d/000")
    main.compact()
    assert [c.id for c in repo.log("main")] == log_before
    assert list(repo.diff("main", "main")) == []
    assert "d/000" in listed(repo.ref("main"))
    dump = tmp_path / "refs.json"
    repo.dump_refs(dump)
    head = main.head().id
    fresh = lake.create_repository("copy", storage_namespace=repo.storage_namespace + "-copy")
    committed = ("_branchwater/ranges", "_branchwater/metaranges")
    for folder in committed:  # a copy of the namespace, as restoring needs
        shutil.copytree(
            tmp_path / "sales" / folder, tmp_path / "sales-copy" / folder, dirs_exist_ok=True
        )
    fresh.restore_refs(dump)
    assert fresh.branch("main").commit_id == head
    assert changes(fresh.branch("main")) == []
    assert "d/000" in listed(fresh.ref("main"))
    with pytest.raises(InvalidArgument, match="not bare"):
        repo.restore_refs(dump)


# --- the compactor's outcomes --------------------------------------------------------------


def test_nothing_staged_is_a_no_op_result(lake: Lake, repo) -> None:
    main = repo.branch("main")
    before = lake.graveler.read_branch(repo.record, "main")
    result = main.compact()
    assert result.outcome == "nothing-staged" and not result.compacted
    assert lake.graveler.read_branch(repo.record, "main") == before


def test_missing_branch_or_repository_is_not_found(lake: Lake, repo) -> None:
    with pytest.raises(NotFound, match="branch 'nope'"):
        compaction.compact(lake.graveler, repo.record, "nope")
    with pytest.raises(NotFound, match="branch 'nope'"):
        compaction.compaction_status(lake.graveler, repo.record, "nope")
    with pytest.raises(NotFound, match="repository 'nope'"):
        lake.repository("nope")


@pytest.mark.parametrize(
    "field, value",
    [
        ("max_tombstones", -1),
        ("max_tombstones", 0),
        ("max_sealed_tokens", -5),
        ("max_sealed_tokens", 10**9),
        ("scan_budget", 0),
        ("scan_budget", 10**12),
        ("guard_seconds", -1.0),
        ("guard_seconds", float("nan")),
        ("guard_seconds", 10**9),
        ("max_tombstones", 2.5),
        ("max_tombstones", True),
        ("scan_budget", "100"),
    ],
)
def test_negative_or_absurd_thresholds_are_invalid(field: str, value: object) -> None:
    with pytest.raises(InvalidArgument, match=field):
        CompactionPolicy(**{field: value})  # type: ignore[arg-type]


def test_a_tombstone_threshold_above_the_scan_budget_is_invalid() -> None:
    with pytest.raises(InvalidArgument, match="scan_budget"):
        CompactionPolicy(max_tombstones=500, scan_budget=100)


def test_if_needed_compacts_only_when_due(repo) -> None:
    committed_tree(repo, 10)
    main = repo.branch("main")
    main.delete("d/000")
    policy = CompactionPolicy(max_tombstones=3, scan_budget=100)
    assert main.compact(if_needed=True, policy=policy).outcome == "not-due"
    main.delete("d/001")
    main.delete("d/002")
    result = main.compact(if_needed=True, policy=policy)
    assert result.compacted and result.tombstones_removed == 3


def test_the_guard_keeps_a_second_sensor_off_and_skew_costs_only_a_compaction(
    lake: Lake, repo
) -> None:
    committed_tree(repo, 10)
    g, record = lake.graveler, repo.record
    policy = CompactionPolicy(max_tombstones=1, scan_budget=10, guard_seconds=60)
    main = repo.branch("main")
    main.delete("d/000")
    first = compaction.compact(g, record, "main", if_needed=True, policy=policy, now=lambda: T0)
    assert first.compacted
    main.delete("d/001")

    def at(seconds: float) -> compaction.CompactionResult:
        moment = T0 + timedelta(seconds=seconds)
        return compaction.compact(
            g, record, "main", if_needed=True, policy=policy, now=lambda: moment
        )

    assert at(30).outcome == "guarded"
    assert at(-30).outcome == "guarded", "a clock behind by less than the window waits"
    skipped = g.metrics.registry.get_sample_value(
        "branchwater_compactions_skipped_total", {"repository": "sales"}
    )
    assert skipped == 2
    assert at(-3600).compacted, "a clock far behind only costs an early compaction"
    main.delete("d/002")
    assert at(-3600 + 61).compacted
    assert listed(main) == [f"d/{i:03d}" for i in range(3, 10)]
    assert main.compact().outcome == "nothing-staged"


def test_a_forced_compaction_ignores_the_guard(repo) -> None:
    committed_tree(repo, 5)
    main = repo.branch("main")
    main.delete("d/000")
    main.compact()
    main.delete("d/001")
    assert main.compact().compacted


def test_a_commit_that_wins_supersedes_the_compaction(lake: Lake, repo) -> None:
    committed_tree(repo, 10)
    main = repo.branch("main")
    main.delete("d/000")
    main.upload("x", b"x")
    before = lake.graveler.read_branch(repo.record, "main")

    def commit_meanwhile(step: str) -> None:
        if step == "applied":
            main.upload("during", b"d")
            main.commit("won the race")

    result = compaction.compact(lake.graveler, repo.record, "main", on_step=commit_meanwhile)
    assert result.outcome == "superseded" and not result.compacted
    assert "commit" in result.message
    branch = lake.graveler.read_branch(repo.record, "main")
    assert branch.compacted_metarange_id is None and branch.sealed_tokens == ()
    assert branch.commit_id != before.commit_id
    head = listed(repo.ref("main"))
    assert "d/000" not in head and {"x", "during"} <= set(head)
    assert changes(main) == []


def test_a_commit_sealed_before_the_compaction_finishes_on_its_result(lake: Lake, repo) -> None:
    """The commit sealed first; the compactor then absorbed its tokens. The commit builds
    on the compacted metarange and records everything, writes made meanwhile included."""
    committed_tree(repo, 10)
    main = repo.branch("main")
    main.delete("d/000")
    g, record = lake.graveler, repo.record
    tokens = commit_ops.seal(g, record, "main")
    main.upload("between", b"b")
    assert main.compact().compacted
    commit = commit_ops._finish(g, record, "main", tokens, "late", {}, "", False)
    head = set(listed(repo.ref(commit.id)))
    assert "d/000" not in head and "between" in head
    assert changes(main) == []


def test_a_commit_whose_tokens_another_commit_recorded_takes_no_later_compaction(
    lake: Lake, repo
) -> None:
    """Sealed, then paused: a compaction absorbed its tokens, another commit recorded that
    compaction, and a later compaction folded writes acknowledged after. The paused commit
    committed that later compaction under its own message, its own writes already in the
    other commit; it is `AlreadyRecorded` by the other commit."""
    committed_tree(repo, 2)
    main = repo.branch("main")
    main.upload("mine", b"the paused commit's")
    g, record = lake.graveler, repo.record
    tokens = commit_ops.seal(g, record, "main")
    assert main.compact().compacted
    main.upload("other", b"b")
    recorded = main.commit("the other commit")
    main.upload("late", b"after both")
    assert main.compact().compacted

    with pytest.raises(AlreadyRecorded) as already:
        commit_ops._finish(g, record, "main", tokens, "paused", {}, "", False)

    assert already.value.commit_id == recorded.id
    assert main.head().id == recorded.id
    assert [c.path for c in main.uncommitted()] == ["late"]


def test_a_commit_whose_compaction_a_revert_kept_above_it_records_it(lake: Lake, repo) -> None:
    """The compaction that absorbed a paused commit's tokens, rebased above a revert made
    with `allow_dirty`, still holds them: the commit records it on the revert."""
    committed_tree(repo, 2)
    main = repo.branch("main")
    main.upload("bad", b"to revert")
    bad = main.commit("bad").id
    main.upload("mine", b"the paused commit's")
    g, record = lake.graveler, repo.record
    tokens = commit_ops.seal(g, record, "main")
    assert main.compact().compacted
    reverted = repo.revert("main", bad, allow_dirty=True)

    commit = commit_ops._finish(g, record, "main", tokens, "paused", {}, "", False)

    assert commit.parents == (reverted.commit.id,)
    head = set(listed(repo.ref(commit.id)))
    assert "mine" in head and "bad" not in head


def test_writes_during_a_compaction_land_in_the_new_staging_token(lake: Lake, repo) -> None:
    committed_tree(repo, 10)
    main = repo.branch("main")
    main.delete("d/000")

    def write_meanwhile(step: str) -> None:
        if step == "sealed":
            main.upload("during", b"d")
            main.delete("d/001")

    result = compaction.compact(lake.graveler, repo.record, "main", on_step=write_meanwhile)
    assert result.compacted
    assert listed(main) == [*(f"d/{i:03d}" for i in range(2, 10)), "during"]
    assert changes(main) == [("d/000", "removed"), ("d/001", "removed"), ("during", "added")]


def test_a_second_compactor_supersedes_or_stacks(lake: Lake, repo) -> None:
    committed_tree(repo, 10)
    main = repo.branch("main")
    main.delete("d/000")

    def second(step: str) -> None:
        if step == "sealed":
            main.delete("d/001")
            assert main.compact().compacted

    result = compaction.compact(lake.graveler, repo.record, "main", on_step=second)
    assert result.outcome == "superseded"
    assert listed(main) == [f"d/{i:03d}" for i in range(2, 10)]


class _InFlight(Exception):
    """Stops a compactor right after a step, leaving it in flight as a slower process would."""


def _stop_at(stop: str):
    def hook(step: str) -> None:
        if step == stop:
            raise _InFlight(step)

    return hook


def test_a_compaction_keeps_another_compactors_tokens_sealed_above_it(lake: Lake, repo) -> None:
    """Compactors sealing in turn must not supersede each other for as long as they run: the
    first to finish installs, and what the other sealed stays sealed on top of it."""
    committed_tree(repo, 10)
    g, main = lake.graveler, repo.branch("main")
    main.delete("d/000")
    on_top: list[str] = []

    def second_seals(step: str) -> None:
        if step == "applied":
            main.delete("d/001")
            with pytest.raises(_InFlight):
                compaction.compact(g, repo.record, "main", on_step=_stop_at("sealed"))
            on_top.extend(g.read_branch(repo.record, "main").sealed_tokens[:1])
            main.upload("later", b"l")

    result = compaction.compact(g, repo.record, "main", on_step=second_seals)

    assert result.compacted, result.message
    branch = g.read_branch(repo.record, "main")
    assert branch.compacted_metarange_id == result.metarange_id
    assert branch.sealed_tokens == tuple(on_top)
    assert listed(main) == [*(f"d/{i:03d}" for i in range(2, 10)), "later"]
    assert main.compact().compacted
    assert listed(repo.ref(main.commit("all of it").id)) == listed(main)


@pytest.mark.parametrize("compactor_on_top", [False, True])
def test_a_compaction_gives_way_to_a_commit_sealed_above_it(
    lake: Lake, repo, compactor_on_top: bool
) -> None:
    """Also when another compactor sealed after the commit: the commit is still below it."""
    committed_tree(repo, 10)
    g, main = lake.graveler, repo.branch("main")
    main.delete("d/000")
    sealed: list[commit_ops.Seal] = []

    def commit_seals(step: str) -> None:
        if step == "applied":
            main.upload("x", b"x")
            sealed.append(commit_ops.seal(g, repo.record, "main"))
            if compactor_on_top:
                with pytest.raises(_InFlight):
                    compaction.compact(g, repo.record, "main", on_step=_stop_at("sealed"))

    result = compaction.compact(g, repo.record, "main", on_step=commit_seals)

    assert result.outcome == "superseded"
    assert g.read_branch(repo.record, "main").compacted_metarange_id is None
    commit = commit_ops._finish(g, repo.record, "main", sealed[0], "won", {}, "", False)
    assert listed(repo.ref(commit.id)) == [*(f"d/{i:03d}" for i in range(1, 10)), "x"]


def test_a_commit_that_loses_its_set_if_to_a_seal_retries_without_rebuilding(
    lake: Lake, repo, monkeypatch
) -> None:
    """A retry whose tokens and base are unchanged reuses the metarange and the commit record:
    no second build, no orphan commit record, and the seal on top stays sealed."""
    committed_tree(repo, 10)
    g, main = lake.graveler, repo.branch("main")
    main.delete("d/000")
    builds: list[str] = []
    apply_sealed = commit_ops.apply_sealed

    def counted(*args, **kwargs):
        builds.append("built")
        return apply_sealed(*args, **kwargs)

    update = g.update_branch_dropping
    on_top: list[str] = []

    def seal_first(*args, **kwargs) -> bool:
        if not on_top:
            main.upload("during", b"d")
            with pytest.raises(_InFlight):
                compaction.compact(g, repo.record, "main", on_step=_stop_at("sealed"))
            on_top.extend(g.read_branch(repo.record, "main").sealed_tokens[:1])
        return update(*args, **kwargs)

    monkeypatch.setattr(commit_ops, "apply_sealed", counted)
    monkeypatch.setattr(g, "update_branch_dropping", seal_first)
    commits_before = len(list(g.refs.list_commits(repo.record)))

    commit = main.commit("retried")

    assert builds == ["built"]
    assert len(list(g.refs.list_commits(repo.record))) == commits_before + 1
    assert not {"d/000", "during"} & set(listed(repo.ref(commit.id)))
    assert g.read_branch(repo.record, "main").sealed_tokens == tuple(on_top)
    assert changes(main) == [("during", "added")]


# --- the sensor ----------------------------------------------------------------------------


def test_status_reports_the_figures_and_the_verdict(lake: Lake, repo) -> None:
    committed_tree(repo, 20)
    main = repo.branch("main")
    for i in range(6):
        main.delete(f"d/{i:03d}")
    main.upload("n/1", b"1")
    policy = CompactionPolicy(max_tombstones=5, scan_budget=100)
    status = main.compaction_status(policy)
    assert isinstance(status, CompactionStatus)
    assert (status.staged_entries, status.staged_tombstones, status.sealed_tokens) == (1, 6, 0)
    assert status.complete and status.scanned_rows == 7
    assert status.listing_overhead == 6 and status.lookup_layers == 1
    assert status.due and status.reasons and not status.guarded
    assert status.last_compaction_age is None and not status.compacted

    main.compact()
    after = main.compaction_status(policy)
    assert not after.due and after.compacted and after.guarded
    assert after.last_compaction_age is not None and after.last_compaction_age >= 0
    assert (after.staged_entries, after.staged_tombstones) == (0, 0)


def test_status_spends_at_most_its_scan_budget(lake: Lake, repo) -> None:
    committed_tree(repo, 30)
    main = repo.branch("main")
    for i in range(25):
        main.delete(f"d/{i:03d}")
    status = main.compaction_status(CompactionPolicy(max_tombstones=5, scan_budget=10))
    assert status.scanned_rows == 10 and not status.complete
    assert status.staged_tombstones == 10 and status.due


def test_status_counts_sealed_tokens(lake: Lake, repo) -> None:
    committed_tree(repo, 5)
    main = repo.branch("main")
    for i in range(3):
        main.delete(f"d/{i:03d}")
        commit_ops.seal(lake.graveler, repo.record, "main")  # a committer that died
    status = main.compaction_status(CompactionPolicy(max_sealed_tokens=3))
    assert status.sealed_tokens == 3 and status.lookup_layers == 4
    assert status.due and "sealed tokens" in status.reasons[0]
    result = main.compact(if_needed=True, policy=CompactionPolicy(max_sealed_tokens=3))
    assert result.compacted and result.sealed_tokens == 4
    assert listed(main) == ["d/003", "d/004"]


def test_repository_status_lists_every_branch(repo) -> None:
    repo.create_branch("dev", source="main").upload("a", b"1")
    statuses = repo.compaction_status()
    assert [(s.branch, s.staged_entries) for s in statuses] == [("dev", 1), ("main", 0)]


def test_metrics_count_what_compactions_did(lake: Lake, repo) -> None:
    committed_tree(repo, 10)
    main = repo.branch("main")
    for i in range(4):
        main.delete(f"d/{i:03d}")
    main.compact()
    registry = lake.metrics.registry
    labels = {"repository": "sales"}
    assert registry.get_sample_value("branchwater_compaction_tombstones_total", labels) == 4
    assert registry.get_sample_value("branchwater_compaction_duration_seconds_count", labels) == 1
    sealed = registry.get_sample_value("branchwater_sealed_tokens", {**labels, "branch": "main"})
    assert sealed == 0
    text = lake.metrics.exposition()
    assert "# TYPE branchwater_compaction_duration_seconds histogram" in text
    assert 'branchwater_compactions_total{outcome="compacted",repository="sales"} 1.0' in text


def test_a_delete_whose_token_is_sealed_meanwhile_still_deletes(lake: Lake, repo, monkeypatch):
    """The retry finds the delete's own tombstone in the sealed token: it must not take the
    path for missing, but write its tombstone again in the new token."""
    committed_tree(repo, 5)
    g, main = lake.graveler, repo.branch("main")
    put_guarded = g.staging.put_guarded
    sealed: list[tuple[str, ...]] = []

    def put_then_seal(token: str, path: str, entry, guard: tuple[bytes, bytes]) -> bytes:
        """The seal lands between the row and the read of the branch that comes with it."""
        put_guarded(token, path, entry, guard)
        if not sealed:
            sealed.append(commit_ops.seal(g, repo.record, "main"))
        return g.kv.get(*guard).value

    monkeypatch.setattr(g.staging, "put_guarded", put_then_seal)
    main.delete("d/002")
    assert sealed
    with pytest.raises(NotFound):
        main.stat("d/002")
    assert main.compact().compacted
    assert "d/002" not in listed(repo.ref(main.commit("drop").id))
