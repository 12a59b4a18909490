"""Sweeping a mark: the one sweep every path runs (the Spark job's, and the one that needs no
Spark when a mark has nothing to delete), and recording it.

A mark with no candidates needs no Spark application: the CLI, the provider and the job
alike sweep it here, under the repository's GC run lease, so a quiet repository's scheduled
run starts one Spark application, not two. Either way `sweep_mark` does the same steps: it
refuses a mark that cannot be swept, re-arms the run's expiring commits (`StaleGCMark`,
nothing deleted, when one lapsed or was taken over), deletes, records the sweep, and then
records the expiring commits as expired, so `CommitExpired` follows either sweep.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

from branchwater.engine.errors import InvalidArgument
from branchwater.engine.gc.runlock import GCRunLease
from branchwater.engine.gc.runs import files, report, statuses
from branchwater.engine.gc.runs.config import JobConfig
from branchwater.engine.gc.runs.events import Events
from branchwater.engine.gc.runs.pruning import prune_quietly
from branchwater.engine.gc.runs.retention import rearm_before_sweep, record_swept
from branchwater.engine.gc.runs.storage import Namespace, missing_ok_json
from branchwater.engine.graveler.graveler import Graveler
from branchwater.engine.graveler.model import RepositoryRecord

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
    re-armed before anything is deleted and recorded as expired once the sweep is recorded."""
    emit = events or (lambda event: None)
    g, record = repo.lake.graveler, repo.record
    files.check_sweepable(summary)
    rearm_before_sweep(g, record, ns, summary)
    lease.check()
    recorded, per_slice = delete(summary)
    summary = finish_sweep(ns, summary, recorded, per_slice, phases)
    expired = record_swept(g, record, ns, summary)
    if expired:
        emit({"event": "notice", "message": f"{expired} commits recorded as expired"})
    return summary


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
        files.check_sweepable(summary)
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
