"""The GC job's committed part (retention) on real Spark: random histories spread over months
swept by one job with both parts, checked against the model's rule (tests/gc_model.py) on
local files and on the S3 server; `--only`, the gate's flag, the summary's figures."""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from branchwater.engine import CommitExpired, Lake, NoChanges, NotFound, failpoints
from branchwater.engine.gc.retention.expired import expired_at
from branchwater.engine.gc.retention.expiry import repository_retention
from branchwater.engine.gc.runs import files, statuses
from branchwater.engine.gc.runs.config import JobConfig
from branchwater.engine.gc.runs.explain import explain
from branchwater.engine.gc.runs.files import CANDIDATES
from branchwater.engine.gc.runs.retention import EXPIRED_COMMITS, expiring_ids
from branchwater.engine.gc.runs.storage import Namespace
from branchwater.engine.gc.runs.sweeps import sweep_without_spark
from branchwater.engine.graveler.fence import FenceRecord, fence_key
from branchwater.spark_jobs.gc.gate import CANDIDATES_SUITE, EXPIRED_SUITE, PREPARE_SUITE
from tests.fixtures.s3 import S3Server
from tests.gc_model import (
    RetentionHistory,
    active_commits,
    assert_references_intact,
    assert_retention_holds,
    commit_addresses,
    retention_candidates,
)
from tests.helpers.gc import FakeClock, GCLake, dropped_file_history, hold_passes, run_addresses
from tests.helpers.servers import unique_name

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.slow]

LATE = timedelta(microseconds=1)
"""Objects written by the test are in slices opened seconds ago: no late-writes allowance."""
MONTHS_AGO = timedelta(days=300)


def months_of_history(gc: GCLake, seed: int, steps: int = 60) -> FakeClock:
    clock = FakeClock(datetime.now(UTC) - MONTHS_AGO)
    RetentionHistory(gc.repo, seed, clock).play(steps)
    return clock


def lakefs_rules(rng: random.Random) -> dict[str, Any]:
    return {
        "default_retention_days": rng.choice([0, 20, 60]),
        "branches": [
            {"branch_id": "main", "retention_days": rng.choice([30, 120])},
            {"branch_id": "b*", "retention_days": rng.choice([1, 40])},
        ],
    }


def commit_an_object_then_delete_it(branch: Any) -> None:
    """Leave a commit holding an object no later commit holds: a random history does not
    always leave one where a test needs it (an expired-only object for the run to collect)."""
    branch.upload("t/held-by-one-old-commit", b"only the next commit holds this")
    branch.commit("a file")
    branch.delete("t/held-by-one-old-commit")
    branch.commit("and it is gone")


def run_both(gc: GCLake, **settings: Any) -> Any:
    return gc.run(late_writes=LATE, **settings)


def test_one_job_collects_both_parts_by_the_rule(local_gc: GCLake) -> None:
    seed = 1
    months_of_history(local_gc, seed)
    repo = local_gc.repo
    rules = repo.set_gc_rules(lakefs_rules(random.Random(seed)))
    listed = local_gc.data_objects()
    before = set(listed)
    summary = run_both(local_gc)
    assert summary.gate_success, summary.failed_expectations()
    now = datetime.fromisoformat(summary.retention["now"])
    after = set(local_gc.data_objects())
    deleted = before - after
    run = _prepared(local_gc, summary.run_id)
    assert deleted == retention_candidates(repo, run, timedelta(0), rules, now, listed)
    assert_retention_holds(repo, rules, now, run, before, deleted)
    expired_only = _expired_only(local_gc, rules, now) - run_addresses(repo, run)
    assert summary.volume("expired").objects == len(expired_only & before)
    assert summary.retention["expired_commits"] > 0
    assert sum(v["objects"] for v in summary.retention["by_month"].values()) == len(
        expired_only & before
    )


def test_without_rules_or_with_only_uncommitted_commits_keep_their_objects(
    local_gc: GCLake,
) -> None:
    months_of_history(local_gc, 8)
    every = {c.id for c in local_gc.lake.graveler.refs.list_commits(local_gc.repo.record)}
    committed = commit_addresses(local_gc.repo, every)
    assert run_both(local_gc).retention == {"parts": ["uncommitted"], "rules": None}
    rules = local_gc.repo.set_gc_rules({"default_retention_days": 0})
    assert _expired_only(local_gc, rules, datetime.now(UTC)), "the history expires something"
    assert run_both(local_gc, only="uncommitted").retention == {"parts": ["uncommitted"]}
    assert committed <= set(local_gc.data_objects())


def test_only_committed_deletes_expired_objects_alone(local_gc: GCLake) -> None:
    """On a random history, then a file rewritten on main: the rewritten version is held by
    an expired commit alone, so the run has something to delete whatever the history drew
    (a seed does not fix the history: its old commits are picked by id, and ids hash random
    addresses and dates; about one history in sixty leaves no such object)."""
    clock = months_of_history(local_gc, 6)
    repo = local_gc.repo
    main = repo.branch("main")
    rewritten = main.upload("t/rewritten", b"v1").address
    main.commit("v1, which only an expired commit will hold")
    clock.advance(timedelta(days=1))
    main.upload("t/rewritten", b"v2")
    main.commit("v2")
    oldest = min(repo.lake.graveler.refs.list_commits(repo.record), key=lambda c: c.creation_date)
    clock.advance(timedelta(days=1))
    repo.tag("keep-me", oldest.id)
    garbage = set(local_gc.put_garbage(3))
    rules = repo.set_gc_rules({"default_retention_days": 0})
    summary = run_both(local_gc, only="committed")
    assert summary.gate_success
    assert all("/expired-" in key for key in summary.files[CANDIDATES])
    assert_committed_work_only(local_gc, summary)
    left = set(local_gc.data_objects())
    assert garbage <= left
    now = datetime.fromisoformat(summary.retention["now"])
    run = _prepared(local_gc, summary.run_id)
    assert not (_expired_only(local_gc, rules, now) - run_addresses(local_gc.repo, run)) & left
    tagged = repo.ref("keep-me")
    for entry in tagged.list():
        tagged.read(entry.path)
    swept = sorted(set(_expired_only(local_gc, rules, now)) - left)
    assert rewritten in swept, "the run deleted objects only expired commits held"
    answer = explain(repo, swept[0], min_age=timedelta(0))
    assert answer.verdict == f"deleted by GC run {summary.run_id}"
    assert "only expired commits held it" in answer.reasons[0]
    assert answer.references[0].name[:12] in answer.reasons[0]
    report = local_gc.objects.get(files.run_prefix(summary.run_id) + files.REPORT).decode()
    assert "per month of commit date" in report and "Retention" in report
    assert "<th>parts</th><td>committed</td>" in report
    kv = repo.lake.graveler.kv
    recorded = [c.id for c in kv_commits(local_gc) if expired_at(kv, repo.record, c.id) is not None]
    assert recorded, "the sweep records the commits whose objects it deleted"
    with pytest.raises(CommitExpired, match=recorded[0]):
        repo.ref(recorded[0])
    with pytest.raises(CommitExpired):
        repo.create_branch("from-expired", source=recorded[0])
    assert all(expired_at(kv, repo.record, c) is None for c in active_commits(repo, rules, now))


@pytest.mark.s3
def test_retention_on_the_s3_server(s3_gc: GCLake) -> None:
    months_of_history(s3_gc, 8, steps=40)
    rules = s3_gc.repo.set_gc_rules({"default_retention_days": 0, "branches": []})
    before = set(s3_gc.data_objects())
    summary = run_both(s3_gc)
    assert summary.gate_success, summary.failed_expectations()
    now = datetime.fromisoformat(summary.retention["now"])
    deleted = before - set(s3_gc.data_objects())
    run = _prepared(s3_gc, summary.run_id)
    assert_retention_holds(s3_gc.repo, rules, now, run, before, deleted)


def assert_committed_work_only(gc: GCLake, summary: Any) -> None:
    """A committed-only run's record: its phases, files, counts and gate suites are the
    committed part's (and the prepare output it anti-joins), nothing of the uncommitted
    mark's listing, marking or state; and it is no optimized run's base."""
    assert summary.retention["parts"] == ["committed"]
    assert set(summary.phases) == {"prepare", "retention", "gate", "sweep"}
    assert set(summary.files) == {CANDIDATES, EXPIRED_COMMITS, files.DELETED}
    assert set(summary.counts) == {"expired", "deleted"}
    assert summary.slices == {} and summary.ranges == {}
    assert summary.considered_through is None
    assert {e.suite for e in summary.gate} == {PREPARE_SUITE, EXPIRED_SUITE}
    prefix = files.run_prefix(summary.run_id)
    saved = {info.key.removeprefix(prefix) for info in gc.objects.list_objects(prefix)}
    state = {key.split("/")[1] for key in saved if key.startswith(f"{files.STATE}/")}
    assert state == {EXPIRED_COMMITS}, saved
    assert not any(key.startswith(files.SCRATCH) for key in saved)


def test_both_parts_record_both(local_gc: GCLake) -> None:
    months_of_history(local_gc, 3, steps=30)
    local_gc.repo.set_gc_rules({"default_retention_days": 0})
    summary = run_both(local_gc, dry_run=True)
    assert summary.retention["parts"] == ["uncommitted", "committed"]
    assert {"committed", "slices", "mark", "state", "retention"} <= set(summary.phases)
    suites = {e.suite for e in summary.gate}
    assert suites == {CANDIDATES_SUITE, PREPARE_SUITE, EXPIRED_SUITE}
    assert summary.considered_through is not None


def kv_commits(gc: GCLake) -> list[Any]:
    return list(gc.lake.graveler.refs.list_commits(gc.repo.record))


def _expired_only(gc: GCLake, rules: Any, now: datetime) -> set[str]:
    every = {c.id for c in gc.lake.graveler.refs.list_commits(gc.repo.record)}
    active = active_commits(gc.repo, rules, now)
    return commit_addresses(gc.repo, every - active) - commit_addresses(gc.repo, active)


def _prepared(gc: GCLake, run_id: str) -> Any:
    from branchwater.engine.gc.prepare import PreparedRun

    return PreparedRun(run_id, "")


def test_refs_moved_onto_expired_commits_before_the_recheck_keep_their_objects(
    local_gc: GCLake,
) -> None:
    """Forced at `gc.retention.before_recheck`: after the run computed its candidates, a
    branch is created from one expired commit, a tag put on another, a third's tree restored
    and committed on main, a fourth's restored and left staged, and every other branch is
    deleted (lakeFS 9772). The re-check keeps the moved-to commits' objects; the deleted
    branches' commits stay as the run first classified them."""
    months_of_history(local_gc, 9)
    repo = local_gc.repo
    doomed_branches = [b.name for b in repo.branches() if b.name != "main"]
    assert doomed_branches, "the history made branches"
    kept_heads = {name: repo.branch(name).commit_id for name in doomed_branches}
    main = repo.branch("main")
    commit_an_object_then_delete_it(main)
    rules = repo.set_gc_rules({"default_retention_days": 0})
    now = datetime.now(UTC)
    retention = repository_retention(repo.lake.graveler, repo.record, rules, now)
    on_branches = {entry.address for branch in repo.branches() for entry in branch.list()}
    candidates = _expired_only(local_gc, rules, now) - on_branches
    by_date = sorted(retention.expired, key=lambda c: retention.dates[c])
    holding = [c for c in by_date if commit_addresses(repo, {c}) & candidates]
    assert holding, "a commit holds an object only expired commits reference"
    others = [c for c in by_date if c not in holding and commit_addresses(repo, {c})]
    expired = holding + others
    assert len(expired) >= 4, "the history expires commits holding objects"

    def move() -> None:
        repo.create_branch("late-branch", source=expired[0])
        repo.tag("late-tag", expired[1])
        main.reset()
        main.restore(["t/"], source=expired[2])
        with contextlib.suppress(NoChanges):
            main.commit("bring old files back")
        staged = repo.create_branch("late-restore", source="main")
        staged.restore(["t/"], source=expired[3])
        for name in doomed_branches:
            repo.delete_branch(name)

    with failpoints.armed("gc.retention.before_recheck", move):
        summary = run_both(local_gc)
    assert summary.gate_success, summary.failed_expectations()
    assert summary.retention["dropped_by_recheck"] > 0
    for name in ("late-branch", "late-tag", "main", "late-restore"):
        ref = repo.branch(name) if name != "late-tag" else repo.ref(name)
        for entry in ref.list():
            ref.read(entry.path)
    for head in kept_heads.values():
        ref = repo.ref(head)
        for entry in ref.list():
            ref.read(entry.path)


@pytest.fixture(
    params=[
        "sqlite-local",
        pytest.param("postgres-s3", marks=[pytest.mark.postgres, pytest.mark.s3]),
    ]
)
def window_gc(
    request: pytest.FixtureRequest, tmp_path: Path, spark: SparkSession
) -> Iterator[GCLake]:
    """A lake on SQLite with its repository on local files, then one on the PostgreSQL
    server (a table of its own) with its repository on the S3 server."""
    if request.param == "sqlite-local":
        yield request.getfixturevalue("local_gc")
        return
    server: S3Server = request.getfixturevalue("s3_server")
    kv_url = f"{request.getfixturevalue('postgres_url')}?table={unique_name('gc_')}"
    namespace = f"s3://{request.getfixturevalue('s3_bucket')}/{unique_name('ns-')}"
    with Lake.connect(kv_url, s3_options=server.options) as lake:
        repo = lake.create_repository("sales", storage_namespace=namespace)
        yield GCLake(spark, lake, repo, kv_url, server.options)


def test_moves_onto_expiring_commits_after_the_recheck_are_refused(window_gc: GCLake) -> None:
    """Forced at `gc.retention.before_sweep` (after the re-check, before any delete): a
    branch created from, a tag put on, a branch reset to and a restore from each commit the
    run is collecting all refuse naming the run and leave nothing behind; a branch from an
    active commit is made. The sweep deletes, and every object a branch, tag or commit then
    references is intact."""
    months_of_history(window_gc, 9, steps=40)
    repo = window_gc.repo
    commit_an_object_then_delete_it(repo.branch("main"))
    kv = repo.lake.graveler.kv
    repo.set_gc_rules({"default_retention_days": 0})
    fenced: list[str] = []

    def expiring(commit_id: str) -> FenceRecord | None:
        with contextlib.suppress(NotFound):
            record = FenceRecord.decode(kv.get(repo.record.partition, fence_key(commit_id))[0])
            return record if record.expired is None else None
        return None

    def move() -> None:
        fenced.extend(c.id for c in kv_commits(window_gc) if expiring(c.id) is not None)
        assert fenced, "the run is collecting some commits"
        late = repo.create_branch("late-restore", source="main")
        for commit_id in fenced:
            run = expiring(commit_id)
            assert run is not None
            attempts = [
                partial(repo.create_branch, "late-branch", source=commit_id),
                partial(repo.tag, "late-tag", commit_id),
                partial(late.reset, to=commit_id),
                partial(late.restore, [], source=commit_id, every_path=True),
            ]
            for attempt in attempts:
                with pytest.raises(CommitExpired) as raised:
                    attempt()
                assert (raised.value.commit_id, raised.value.collecting) == (commit_id, run.run)
        repo.create_branch("late-active", source="main")

    main_head = repo.branch("main").commit_id
    with failpoints.armed("gc.retention.before_sweep", move):
        summary = run_both(window_gc)
    assert summary.status == statuses.SWEPT, summary.error
    assert summary.counts["deleted"].objects > 0
    names = {b.name for b in repo.branches()}
    assert {"late-active", "late-restore"} <= names and "late-branch" not in names
    assert "late-tag" not in {t.name for t in repo.tags()}
    assert repo.branch("late-restore").commit_id == main_head
    shown = [e.identity() for e in repo.branch("late-restore").list()]
    assert shown == [e.identity() for e in repo.ref(main_head).list()]
    assert all(expired_at(kv, repo.record, c) is not None for c in fenced)
    assert_references_intact(repo)


@pytest.fixture
def kv_gc(race_kv: str, tmp_path: Path, spark: SparkSession) -> Iterator[GCLake]:
    """A lake on SQLite, then on the PostgreSQL server, its repository on local files."""
    with Lake.connect(race_kv) as lake:
        repo = lake.create_repository("sales", storage_namespace=f"file://{tmp_path}/ns")
        yield GCLake(spark, lake, repo, race_kv, {})


def append_only_history(gc: GCLake) -> str:
    """Two commits on main months ago, the second adding a file to the first's: the first
    is expired (30 days' retention) and the second, main's HEAD, holds all its objects.
    Returns the first's id."""
    clock = FakeClock(datetime.now(UTC) - MONTHS_AGO)
    gc.lake.graveler.refs.clock = clock
    main = gc.repo.branch("main")
    main.upload("t/a", b"a")
    first = main.commit("a").id
    clock.advance(timedelta(days=1))
    main.upload("t/b", b"b")
    main.commit("b")
    gc.repo.set_gc_rules({"default_retention_days": 30})
    return first


def test_a_sweep_without_spark_is_the_spark_sweep(kv_gc: GCLake) -> None:
    """The sweep of a mark with nothing to delete (the CLI's and the provider's, in their
    own process) is the Spark sweep's `sweep_mark`. Such a mark fences and records no
    commit: an append-only history's older commit keeps every object (HEAD holds them), so
    it is not recorded expired and reads."""
    repo, kv = kv_gc.repo, kv_gc.lake.graveler.kv
    first = append_only_history(kv_gc)
    mark = run_both(kv_gc, dry_run=True)
    ns = Namespace.of(repo.storage_namespace)
    assert files.nothing_to_delete(mark) and expiring_ids(ns, mark) == []
    assert first in {c["commit"] for c in mark.retention["expired_shown"]}
    with pytest.raises(NotFound):
        kv.get(repo.record.partition, fence_key(first))

    config = JobConfig(kv_gc.kv_url, repo.name, sweep=mark.run_id)
    swept = sweep_without_spark(repo, config)

    assert swept.status == statuses.SWEPT
    assert files.read_summary(ns, mark.run_id).status == statuses.SWEPT
    assert expired_at(kv, repo.record, first) is None
    assert repo.ref(first).read("t/a") == b"a"


def test_commits_recorded_as_expired_are_those_that_lost_an_object(
    local_gc: GCLake,
) -> None:
    """The rule `engine/gc/retention/expired.py` states: a sweep records exactly the
    commits that held an object it deleted. On main months ago: `a` committed (c1), `b`
    added (c2), `b` rewritten twice (c3, c4), then c4 reverted (c5, the HEAD, c3's tree
    again). c2's and c4's own versions of `b` are deleted and both say `CommitExpired`; c1,
    every object of which the HEAD still holds, and c3, whose tree the HEAD shares, read."""
    clock = FakeClock(datetime.now(UTC) - MONTHS_AGO)
    local_gc.lake.graveler.refs.clock = clock
    repo, kv = local_gc.repo, local_gc.lake.graveler.kv
    main = repo.branch("main")
    commits, own = [], []
    for path, data in (("t/a", b"1"), ("t/b", b"1"), ("t/b", b"2"), ("t/b", b"3")):
        own.append(main.upload(path, data).address)
        commits.append(main.commit(f"{path}={data.decode()}").id)
        clock.advance(timedelta(days=1))
    c1, c2, c3, c4 = commits
    head = repo.revert("main", c4).commit.id
    assert repo.commit(head).metarange_id == repo.commit(c3).metarange_id
    repo.set_gc_rules({"default_retention_days": 30})

    summary = run_both(local_gc)

    assert summary.status == statuses.SWEPT, summary.error
    left = set(local_gc.data_objects())
    assert own[1] not in left and own[3] not in left and {own[0], own[2]} <= left
    recorded = {c for c in commits if expired_at(kv, repo.record, c) is not None}
    assert recorded == {c2, c4}
    with pytest.raises(CommitExpired, match=c2):
        repo.ref(c2)
    assert repo.ref(c1).read("t/a") == b"1"
    assert [repo.ref(c3).read(p) for p in ("t/a", "t/b")] == [b"1", b"2"]


def test_a_sweep_outlasting_its_hold_deletes_nothing_a_move_can_reach(local_gc: GCLake) -> None:
    """The job's sweep held at `gc.sweep.before_delete` while its expiring records' hold
    passes and a branch is asked for on the commit it collects: the commit is expired by
    then, so the branch is refused; the sweep deletes the object only that commit held, and
    every ref reads. (Killed and resumed: `tests/gc/test_retention_sweep.py`.)"""
    repo, kv = local_gc.repo, local_gc.lake.graveler.kv
    old, t_b = dropped_file_history(repo, MONTHS_AGO)
    repo.set_gc_rules({"default_retention_days": 30})
    mark = run_both(local_gc, dry_run=True)
    refused: list[CommitExpired] = []

    def a_day_passes_and_a_branch_is_asked_for() -> None:
        hold_passes(repo)
        with pytest.raises(CommitExpired) as raised:
            repo.create_branch("archive", source=old)
        refused.append(raised.value)

    with failpoints.armed("gc.sweep.before_delete", a_day_passes_and_a_branch_is_asked_for):
        swept = run_both(local_gc, sweep=mark.run_id)

    assert swept.status == statuses.SWEPT, swept.error
    assert [(r.commit_id, r.collecting) for r in refused] == [(old, None)]
    assert "archive" not in {b.name for b in repo.branches()}
    assert t_b not in local_gc.data_objects()
    assert expired_at(kv, repo.record, old) is not None
    assert_references_intact(repo)
