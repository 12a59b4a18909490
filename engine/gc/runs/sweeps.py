"""Sweeping a mark: the one sweep every path runs (the Spark job's, and the one that needs no
Spark when a mark has nothing to delete), and recording it.

A mark with no candidates needs no Spark application: the CLI, the provider and the job
alike sweep it here, under the repository's GC run lease, so a quiet repository's scheduled
run starts one Spark application, not two. Either way `sweep_mark` does the same steps: it
refuses a mark that cannot be swept, re-arms the run's expiring commits (`StaleGCMark`,
nothing recorded or deleted, when one lapsed or was taken over) and records them as
expired, then deletes, discards the namespace's abandoned writes
(`discard_abandoned_writes`) and records the sweep. The expiry comes before the first
delete because it never lapses: a sweep that outlasts the expiring records' hold, or is
killed and resumed days later, deletes only objects of commits no move can reach any more,
and the resumed sweep finds them expired and finishes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

from branchwater.engine.errors import BranchwaterError, InvalidArgument, StaleGCMark
from branchwater.engine.gc.addresses import DATA_PREFIX, SPECIAL_PREFIX
from branchwater.engine.gc.runlock import GCRunLease
from branchwater.engine.gc.runs import files, report, statuses
from branchwater.engine.gc.runs.config import JobConfig
from branchwater.engine.gc.runs.events import Events
from branchwater.engine.gc.runs.pruning import prune_quietly
from branchwater.engine.gc.runs.retention import expire_before_sweep
from branchwater.engine.gc.runs.storage import Namespace, missing_ok_json
from branchwater.engine.graveler.dump import restores
from branchwater.engine.graveler.fence import OPERATION_MARGIN
from branchwater.engine.graveler.graveler import Graveler
from branchwater.engine.graveler.model import RepositoryRecord
from branchwater.engine.objects.store import Discarded
from branchwater.engine.units import human_size

log = logging.getLogger(__name__)

ABANDONED_WRITES = "abandoned"
"""The summary's count (`RunSummary.counts`) of abandoned writes its sweeps discarded."""
ABANDONED_AFTER = timedelta(hours=24)
"""The least age of a write GC discards as abandoned (`discard_abandoned_writes`)."""

Deletion = Callable[[files.RunSummary], tuple[list[str], list[files.SliceVolume]]]
"""Deletes a mark's candidates: the files recording what it deleted, and volumes per slice."""


class HasGraveler(Protocol):
    @property
    def graveler(self) -> Graveler: ...


class LeasingRepository(Protocol):
    """What a sweep needs of a repository (`branchwater.engine.Repository` has it)."""

    @property
    def storage_namespace(self) -> str: ...

    @property
    def record(self) -> RepositoryRecord: ...

    @property
    def lake(self) -> HasGraveler: ...

    def lock_gc_run(self, holder: str, ttl: timedelta = ...) -> GCRunLease: ...


def take_lease(repo: LeasingRepository, config: JobConfig) -> GCRunLease:
    """One GC run per repository: raises `GCRunLocked` naming the run that holds it."""
    holder = config.lease_holder()
    if config.lock_ttl is None:
        return repo.lock_gc_run(holder)
    return repo.lock_gc_run(holder, config.lock_ttl)


def save_run(ns: Namespace, summary: files.RunSummary, validations: Any | None) -> None:
    """The summary, the gate's validation results if any, and the report, in that order."""
    prefix = files.run_prefix(summary.run_id)
    if validations is not None:
        ns.put_json(prefix + files.VALIDATION, validations)
    files.write_summary(ns, summary)
    ns.store.put(prefix + files.REPORT, report.render(summary, validations).encode())


def saved_validations(ns: Namespace, run_id: str) -> Any | None:
    return missing_ok_json(ns, files.run_prefix(run_id) + files.VALIDATION)


def finish_sweep(
    ns: Namespace,
    summary: files.RunSummary,
    recorded: list[str],
    per_slice: list[files.SliceVolume],
    phases: dict[str, float],
) -> files.RunSummary:
    """Record a finished sweep: what it deleted, per slice, and that the run is a base now."""
    summary.files["deleted"] = recorded
    summary.reclaimed_by_slice = per_slice
    summary.counts["deleted"] = files.Volume(
        sum(v.objects for v in per_slice), sum(v.bytes for v in per_slice)
    )
    summary.status = statuses.SWEPT
    summary.error = None
    summary.swept_at = datetime.now(timezone.utc).isoformat()
    summary.phases = {**summary.phases, **phases}
    save_run(ns, summary, saved_validations(ns, summary.run_id))
    return summary


def sweep_mark(
    repo: LeasingRepository,
    ns: Namespace,
    summary: files.RunSummary,
    lease: GCRunLease,
    delete: Deletion,
    phases: dict[str, float],
    events: Events | None = None,
) -> files.RunSummary:
    """Sweep the saved mark `summary` under `lease`, deleting with `delete`; `phases` (the
    seconds `delete` measured, read after it) go into the summary. Its expiring commits are
    re-armed and recorded as expired before anything is deleted."""
    emit = events or (lambda event: None)
    g, record = repo.lake.graveler, repo.record
    files.check_sweepable(summary, record.unique_id)
    check_no_restore_since(g, record, summary)
    lease.check()
    expired = expire_before_sweep(g, record, ns, summary)
    if expired:
        emit({"event": "notice", "message": f"{expired} commits recorded as expired"})
    lease.check()
    recorded, per_slice = delete(summary)
    discard_abandoned_writes(ns, summary, datetime.now(timezone.utc), emit)
    return finish_sweep(ns, summary, recorded, per_slice, phases)


def check_no_restore_since(
    g: Graveler, record: RepositoryRecord, summary: files.RunSummary
) -> None:
    """`StaleGCMark` when refs were restored into the repository since the mark's prepare
    began (within the operation margin), or a restore is under way: its commits and refs
    name objects that sat unreferenced in the namespace when the mark looked. Read under
    the run's lease, which a restore checks after marking itself under way."""
    restored = restores(g.kv, record)
    began = datetime.fromisoformat(summary.prepare_started_at)
    if restored.under_way:
        raise StaleGCMark(
            f"GC mark {summary.run_id} of {record.name!r} was not swept: a restore of refs is "
            "under way (or stopped part-way: running it again finishes it), whose commits "
            "may hold objects the mark took for garbage; run GC again once it has ended"
        )
    if restored.ended is not None and restored.ended > began - OPERATION_MARGIN:
        raise StaleGCMark(
            f"GC mark {summary.run_id} of {record.name!r} was not swept: refs were restored "
            f"at {restored.ended.isoformat(timespec='seconds')}, after the mark began "
            f"({began.isoformat(timespec='seconds')}), and their commits may hold objects it "
            "took for garbage; run GC again for a new mark"
        )


def abandoned_age(summary: files.RunSummary) -> timedelta:
    """How old an unfinished write under `data/` must be to be discarded: the run's minimum
    age, and at least `ABANDONED_AFTER`. A local temporary file's mtime moves with every
    chunk written, but an S3 multipart upload's initiation time never moves, however long
    its parts keep coming: a day's margin lets long uploads finish (one aborted still fails
    without publishing anything, but a writer should not lose a day's upload to GC)."""
    return max(timedelta(seconds=summary.min_age_seconds), ABANDONED_AFTER)


def discard_abandoned_writes(
    ns: Namespace, summary: files.RunSummary, now: datetime, emit: Events
) -> None:
    """Discard the writes killed half-way under the namespace's `data/` and `_branchwater/`
    (temporary files, open multipart uploads: storage no listing shows, so no mark can find
    it) and add them to the summary's `ABANDONED_WRITES` count (absent while none was).
    Nothing staged ever names them: an object is staged only once written, and a range,
    metarange or run file only once whole. A store error is told and left to the next
    sweep, as the sweep's deletes are done and must be recorded."""
    cutoff = now - abandoned_age(summary)
    discarded = Discarded()
    try:
        for folder in (DATA_PREFIX, SPECIAL_PREFIX):
            discarded += ns.store.discard_abandoned_writes(folder.rstrip("/"), cutoff)
    except BranchwaterError as exc:
        log.warning("GC run %s: abandoned writes not discarded: %s", summary.run_id, exc)
        emit({"event": "notice", "message": f"abandoned writes not discarded: {exc}"})
        return
    if not discarded.writes:
        return
    before = summary.volume(ABANDONED_WRITES)
    summary.counts[ABANDONED_WRITES] = files.Volume(
        before.objects + discarded.writes, before.bytes + discarded.bytes
    )
    message = f"{discarded.writes} abandoned writes discarded ({human_size(discarded.bytes)})"
    log.info("GC run %s: %s", summary.run_id, message)
    emit({"event": "notice", "message": message})


def sweep_without_spark(
    repo: LeasingRepository, config: JobConfig, events: Events | None = None
) -> files.RunSummary:
    """Sweep the mark `config.sweep` in this process when it holds no candidates: nothing
    is deleted, and the sweep is recorded (its expiring commits as expired too)."""
    if config.sweep is None:
        raise InvalidArgument("only a sweep of a saved mark runs without Spark")
    emit = events or (lambda event: None)
    ns = Namespace.of(repo.storage_namespace, config.s3_options)
    with take_lease(repo, config) as lease:
        emit({"event": "notice", "message": f"GC run lease held: {lease.holder}"})
        summary = files.read_summary(ns, config.sweep)
        files.check_sweepable(summary, repo.record.unique_id)
        if not files.nothing_to_delete(summary):
            raise InvalidArgument(f"GC run {config.sweep} has candidates: sweep it on Spark")

        def delete_nothing(_: files.RunSummary) -> tuple[list[str], list[files.SliceVolume]]:
            emit({"event": "phase", "phase": "sweep", "state": "start"})
            emit({"event": "phase", "phase": "sweep", "state": "end", "seconds": 0.0})
            return [], []

        summary = sweep_mark(repo, ns, summary, lease, delete_nothing, {"sweep": 0.0}, emit)
        prune_quietly(
            ns,
            repo.record.unique_id,
            config.keep_runs,
            datetime.now(timezone.utc),
            lease.check,
            emit,
        )
    emit({"event": "summary", "summary": summary.to_json()})
    return summary
