"""Recording a sweep, and sweeping a mark with nothing to delete without Spark.

A mark with no candidates needs no Spark application: the CLI, the provider and the job
alike record its sweep here, under the repository's GC run lease, so a quiet repository's
scheduled run starts one Spark application, not two. The job records its own sweeps with
the same `finish_sweep`.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

from branchwater.engine.errors import InvalidArgument
from branchwater.engine.gc.runlock import GCRunLease
from branchwater.engine.gc.runs import files, report, statuses
from branchwater.engine.gc.runs.config import JobConfig
from branchwater.engine.gc.runs.events import Events
from branchwater.engine.gc.runs.storage import Namespace, missing_ok_json


class LeasingRepository(Protocol):
    """What a sweep needs of a repository (`branchwater.engine.Repository` has it)."""

    @property
    def storage_namespace(self) -> str: ...

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


def sweep_without_spark(
    repo: LeasingRepository, config: JobConfig, events: Events | None = None
) -> files.RunSummary:
    """Sweep the mark `config.sweep` in this process when it holds no candidates: there is
    nothing to delete, so the run is only recorded as swept, under the run lease."""
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
        lease.check()
        emit({"event": "phase", "phase": "sweep", "state": "start"})
        summary = finish_sweep(ns, summary, [], [], {"sweep": 0.0})
        emit({"event": "phase", "phase": "sweep", "state": "end", "seconds": 0.0})
    emit({"event": "summary", "summary": summary.to_json()})
    return summary
