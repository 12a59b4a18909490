"""A retention sweep (`engine/gc/runs/sweeps.py` `sweep_mark`) records the commits it expires
as expired before its first delete, so no move reaches them however long it deletes or however
late a killed one is resumed, on SQLite and PostgreSQL. The mark is the Spark job driver's
(`tests.gc_model.retention_mark`); the deletes are the job's steps with its failpoints, where
the tests force the expiring records' hold to pass (`hold_passes`) and a move onto the commit.

History: root (t/a) ← old (adds t/b) ← new (drops t/b), months old, 30 days' retention: `old`
is the one commit expired, t/b's object the one candidate. The same on the Spark job:
`tests/spark_jobs/test_gc_retention.py`."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pyarrow as pa
import pytest

from branchwater.engine import CommitExpired, Lake, StaleGCMark, failpoints
from branchwater.engine.api import Repository
from branchwater.engine.failpoints import FailpointHit
from branchwater.engine.gc.retention.expired import expire_fenced, expired_at, mark_expiring
from branchwater.engine.gc.runs import files, statuses
from branchwater.engine.gc.runs.storage import Namespace
from branchwater.engine.gc.runs.sweeps import save_run, sweep_mark
from branchwater.engine.graveler.fence import read_fence
from tests.gc_model import RetentionMark, assert_references_intact, retention_mark, retention_run
from tests.helpers.gc import FakeClock, data_objects, dropped_file_history, hold_passes, use_clock
from tests.helpers.servers import forked_run

KILLED_LEASE = timedelta(seconds=30)
"""The lease of a sweep killed in its process: the test's GC clock moves past it."""


@dataclass(frozen=True)
class Marked:
    repo: Repository
    ns: Namespace
    old: str
    t_b: str
    """t/b's object, the mark's one candidate."""
    run_id: str


@pytest.fixture
def marked(race_kv: str, tmp_path: Path) -> Iterator[Marked]:
    """The history marked, its summary saved as the GC job saves a gated mark."""
    with Lake.connect(race_kv) as lake:
        repo = lake.create_repository("sales", storage_namespace=f"file://{tmp_path}/ns")
        old, t_b = dropped_file_history(repo, timedelta(days=200))
        repo.set_gc_rules({"default_retention_days": 30})
        ns = Namespace.of(repo.storage_namespace)
        with repo.lock_gc_run("mark"):
            mark = retention_mark(repo, ns)
        assert mark.candidates == {t_b} and mark.expiring == [old]
        save_mark(ns, mark)
        yield Marked(repo, ns, old, t_b, mark.summary.run_id)


def save_mark(ns: Namespace, mark: RetentionMark) -> None:
    """The candidates in a candidates file, and the summary, as the GC job writes them."""
    run_id = mark.summary.run_id
    key = f"{files.set_prefix(run_id, files.CANDIDATES)}/{files.part_name(0)}"
    ns.write_parquet(key, pa.table({"address": sorted(mark.candidates)}))
    mark.summary.files[files.CANDIDATES] = [key]
    save_run(ns, mark.summary, None)


def delete_candidates(
    ns: Namespace, summary: files.RunSummary
) -> tuple[list[str], list[files.SliceVolume]]:
    """The job's deletion (`GCJob._delete`): its failpoints around deleting every candidate
    and writing the `deleted/` record of each candidates file."""
    failpoints.hit("gc.sweep.before_delete")
    recorded = []
    for key in summary.files[files.CANDIDATES]:
        table = ns.read_parquet(key)
        ns.store.delete(table.column("address").to_pylist())
        done = key.replace(f"/{files.CANDIDATES}/", f"/{files.DELETED}/")
        ns.write_parquet(done, table)
        recorded.append(done)
    failpoints.hit("gc.sweep.after_delete")
    return recorded, []


def sweep(
    repo: Repository, ns: Namespace, run_id: str, ttl: timedelta = KILLED_LEASE
) -> files.RunSummary:
    """`branchwater gc run --sweep RUN_ID`: the saved mark swept under the run lease."""
    with repo.lock_gc_run(f"sweep {run_id}", ttl) as lease:
        summary = files.read_summary(ns, run_id)
        return sweep_mark(repo, ns, summary, lease, lambda s: delete_candidates(ns, s), {})


def exists(repo: Repository, address: str) -> bool:
    return address in data_objects(repo.lake, repo)


def refused_as_expired(repo: Repository, old: str) -> None:
    """A branch from `old` refuses: its objects were (being) deleted, for good."""
    with pytest.raises(CommitExpired) as raised:
        repo.create_branch("back", source=old)
    assert raised.value.commit_id == old and raised.value.collecting is None
    assert "back" not in {b.name for b in repo.branches()}


def test_a_sweep_outlasting_its_hold_deletes_nothing_a_move_can_reach(marked: Marked) -> None:
    """The hold passes while the sweep deletes, and a branch is asked for on the commit it
    collects: refused as expired, the sweep finishes, and every ref reads."""
    repo, old = marked.repo, marked.old

    def a_day_passes_and_a_branch_is_asked_for() -> None:
        hold_passes(repo)
        refused_as_expired(repo, old)

    with failpoints.armed("gc.sweep.before_delete", a_day_passes_and_a_branch_is_asked_for):
        swept = sweep(repo, marked.ns, marked.run_id)

    assert swept.status == statuses.SWEPT
    assert not exists(repo, marked.t_b)
    assert expired_at(repo.lake.graveler.kv, repo.record, old) is not None
    assert_references_intact(repo)


def test_a_sweep_stopped_after_its_deletes_is_finished_after_the_hold(marked: Marked) -> None:
    """Stopped after its deletes and resumed only after the hold: the commit is expired
    meanwhile (no branch on it, its reads `CommitExpired`), the resumed sweep finishes, and
    the next run keeps it expired."""
    repo, old = marked.repo, marked.old

    def stopped() -> None:
        raise FailpointHit("stopped after its deletes")

    with failpoints.armed("gc.sweep.after_delete", stopped), pytest.raises(FailpointHit):
        sweep(repo, marked.ns, marked.run_id)
    assert not exists(repo, marked.t_b)
    hold_passes(repo)
    refused_as_expired(repo, old)
    with pytest.raises(CommitExpired):
        repo.ref(old)

    assert sweep(repo, marked.ns, marked.run_id).status == statuses.SWEPT
    retention_run(repo)
    assert expired_at(repo.lake.graveler.kv, repo.record, old) is not None
    refused_as_expired(repo, old)
    assert_references_intact(repo)


def test_a_sweep_stopped_before_its_deletes_leaves_them_to_the_next_run(marked: Marked) -> None:
    """Stopped after recording its commit expired, before deleting, and never resumed: the
    commit stays expired, and the next run collects the object it alone held."""
    repo, old = marked.repo, marked.old

    def stopped() -> None:
        raise FailpointHit("stopped before its deletes")

    with failpoints.armed("gc.sweep.before_delete", stopped), pytest.raises(FailpointHit):
        sweep(repo, marked.ns, marked.run_id)
    assert exists(repo, marked.t_b)
    hold_passes(repo)
    refused_as_expired(repo, old)

    assert retention_run(repo).deleted == {marked.t_b}
    assert not exists(repo, marked.t_b)
    assert_references_intact(repo)


def killed_sweep(kv_url: str, run_id: str) -> None:
    """A sweep in a process of its own (the failpoint armed from its environment kills it)."""
    with Lake.connect(kv_url) as lake:
        repo = lake.repository("sales")
        sweep(repo, Namespace.of(repo.storage_namespace), run_id)


def test_a_sweep_killed_after_its_deletes_is_finished_by_sweeping_again(
    marked: Marked, race_kv: str
) -> None:
    """SIGKILLed after its deletes, its lease and its records' hold then passed: the branch
    asked for on the commit is refused, and the same mark swept again finishes."""
    repo = marked.repo
    env = {failpoints.ENV: "gc.sweep.after_delete=kill"}
    exited = forked_run(killed_sweep, race_kv, marked.run_id, env=env)
    assert exited.code == -signal.SIGKILL, exited.error
    assert not exists(repo, marked.t_b)
    assert files.read_summary(marked.ns, marked.run_id).status == statuses.MARKED
    hold_passes(repo)
    use_clock(repo.lake, FakeClock(datetime.now(UTC) + 2 * KILLED_LEASE))
    refused_as_expired(repo, marked.old)

    swept = sweep(repo, marked.ns, marked.run_id)

    assert swept.status == statuses.SWEPT
    assert files.read_summary(marked.ns, marked.run_id).status == statuses.SWEPT
    assert_references_intact(repo)


def test_a_stale_mark_after_earlier_deletes_says_they_were_made(marked: Marked) -> None:
    """A mark whose sweep deleted objects before its records lapsed (as a sweep left it
    before the expiry came first): refused, recording nothing, and the refusal says that an
    earlier attempt deleted objects, never that nothing was."""
    repo, old = marked.repo, marked.old
    run_id = marked.run_id
    done = f"{files.run_prefix(run_id)}{files.DELETED}/{files.part_name(0)}"
    marked.ns.write_parquet(done, pa.table({"address": [marked.t_b]}))
    hold_passes(repo)

    with pytest.raises(StaleGCMark) as stale:
        sweep(repo, marked.ns, run_id)

    assert "nothing was deleted" not in str(stale.value)
    assert "an earlier attempt of this sweep deleted objects" in str(stale.value)
    assert expired_at(repo.lake.graveler.kv, repo.record, old) is None
    assert exists(repo, marked.t_b)


def test_expiry_records_nothing_while_one_record_is_stale(marked: Marked) -> None:
    """Every record is re-armed before any is recorded expired: one lapsed, none is."""
    repo, old = marked.repo, marked.old
    kv = repo.lake.graveler.kv
    root = list(repo.log("main"))[-1].id
    hold_passes(repo)
    assert mark_expiring(kv, repo.record, [root], marked.run_id) == [root]

    with pytest.raises(StaleGCMark, match="fenced only until"):
        expire_fenced(kv, repo.record, [root, old], marked.run_id, datetime.now(UTC))

    assert read_fence(kv, repo.record, root)[0].expired is None
    assert expired_at(kv, repo.record, old) is None
