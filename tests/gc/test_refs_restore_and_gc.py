"""A restore of refs (`Repository.restore_refs`) and a GC run on one repository. The dump's
commits name objects that sat unreferenced in the namespace until the restore wrote them,
so no mark made before the restore ended may be swept (`StaleGCMark`), and no restore
starts while a GC run holds the repository (`GCRunLocked`): a restore marks itself under
way and then reads the lease, a sweep holds the lease and then reads the mark."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from branchwater.engine import GCRunLocked, Lake, NotFound, StaleGCMark
from branchwater.engine.api import Repository
from branchwater.engine.gc.runs import statuses
from branchwater.engine.gc.runs.config import JobConfig
from branchwater.engine.gc.runs.files import RunSummary
from branchwater.engine.gc.runs.sweeps import sweep_without_spark
from branchwater.engine.graveler.dump import RESTORE_KEY
from branchwater.engine.graveler.fence import OPERATION_MARGIN
from tests.gc_model import assert_references_intact
from tests.helpers.failpoints import paused_at
from tests.helpers.gc import RUN_ID, saved_mark
from tests.helpers.hostile import dumped_and_recreated


@dataclass
class Bare:
    """A repository created again over the namespace a dump was taken from."""

    repo: Repository
    dump: Path


@pytest.fixture
def bare(lake: Lake, repo: Repository, tmp_path: Path) -> Bare:
    dump = tmp_path / "refs.json"
    return Bare(dumped_and_recreated(lake, repo, dump)[0], dump)


def marked(repo: Repository, began: datetime) -> None:
    saved_mark(repo, timedelta(0), prepare_started_at=began.isoformat(), dry_run=False)


def sweep(repo: Repository) -> RunSummary:
    return sweep_without_spark(repo, JobConfig("memory://", repo.name, sweep=RUN_ID))


def test_a_mark_made_before_a_restore_ended_is_not_swept(bare: Bare) -> None:
    marked(bare.repo, datetime.now(UTC))
    bare.repo.restore_refs(bare.dump)

    with pytest.raises(StaleGCMark, match=r"refs were restored at .* after the mark began"):
        sweep(bare.repo)
    assert_references_intact(bare.repo)


def test_a_mark_made_after_a_restore_ended_is_swept(bare: Bare) -> None:
    bare.repo.restore_refs(bare.dump)
    marked(bare.repo, datetime.now(UTC) + OPERATION_MARGIN + timedelta(seconds=1))

    assert sweep(bare.repo).status == statuses.SWEPT


def test_no_mark_is_swept_while_a_restore_is_under_way(bare: Bare) -> None:
    marked(bare.repo, datetime.now(UTC) + timedelta(days=1))
    with paused_at("gc.fence.after_claim") as restoring:
        thread = threading.Thread(target=bare.repo.restore_refs, args=(bare.dump,))
        thread.start()
        restoring.wait()
        with pytest.raises(StaleGCMark, match="a restore of refs is under way"):
            sweep(bare.repo)
        restoring.release()
        thread.join(30)
    assert_references_intact(bare.repo)


def test_no_restore_starts_while_a_gc_run_holds_the_repository(bare: Bare) -> None:
    """Refused before its first record, the restore takes its mark back: the repository is
    as bare as before and a sweep is not held up by a restore that never ran."""
    with bare.repo.lock_gc_run("a GC run"), pytest.raises(GCRunLocked, match="a GC run"):
        bare.repo.restore_refs(bare.dump)
    with pytest.raises(NotFound):
        bare.repo.lake.graveler.kv.get(bare.repo.record.partition, RESTORE_KEY)
    assert [t.name for t in bare.repo.tags()] == []

    bare.repo.restore_refs(bare.dump)
    assert [t.name for t in bare.repo.tags()] == ["v1"]
    assert_references_intact(bare.repo)
