"""GC runs as people list them: newest first, each with its figures, read through the
engine's object store (the Branchwater view in Airflow's UI shows these). A damaged summary is
a line that says so, not a failed page."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from branchwater.engine.errors import CorruptedData, NotFound
from branchwater.engine.gc.addresses import ID_PATTERN
from branchwater.engine.gc.runs.files import REPORT, RUN_ID, RUNS_PREFIX, SUMMARY, Volume
from branchwater.engine.objects import ObjectStore

RUN_FILE = re.compile(rf"^{re.escape(RUNS_PREFIX)}(?P<run_id>{ID_PATTERN})/(?P<name>[^/]+)\Z")
MAX_RUNS = 100
"""Runs listed, newest first."""


@dataclass(frozen=True)
class GCRun:
    """One run's line in the list: what it was asked to do, what it found, how it ended."""

    run_id: str
    status: str
    mode: str
    dry_run: bool
    started_at: str
    gate_success: bool | None
    candidates: Volume
    deleted: Volume
    min_age_override: bool
    error: str | None
    has_report: bool
    pruned_at: str | None = None
    """When a later run removed this run's data (its summary and report stay)."""

    @classmethod
    def from_summary(cls, summary: dict[str, Any], has_report: bool) -> GCRun:
        counts = summary.get("counts") or {}

        def volume(name: str) -> Volume:
            figures = counts.get(name) or {}
            return Volume(int(figures.get("objects", 0)), int(figures.get("bytes", 0)))

        return cls(
            run_id=str(summary["run_id"]),
            status=str(summary.get("status", "")),
            mode=str(summary.get("mode", "")),
            dry_run=bool(summary.get("dry_run")),
            started_at=str(summary.get("started_at", "")),
            gate_success=summary.get("gate_success"),
            candidates=volume("candidates"),
            deleted=volume("deleted"),
            min_age_override=bool(summary.get("min_age_override")),
            error=summary.get("error"),
            has_report=has_report,
            pruned_at=summary.get("pruned_at"),
        )


def list_runs(store: ObjectStore, limit: int = MAX_RUNS) -> list[GCRun]:
    """The runs whose mark finished (they have a summary), newest first."""
    files: dict[str, set[str]] = {}
    for info in store.list_objects(RUNS_PREFIX):
        match = RUN_FILE.match(info.key)
        if match:
            files.setdefault(match["run_id"], set()).add(match["name"])
    finished = sorted(run_id for run_id, names in files.items() if SUMMARY in names)
    return [_run(store, run_id, REPORT in files[run_id]) for run_id in finished[:limit]]


def _run(store: ObjectStore, run_id: str, has_report: bool) -> GCRun:
    """A run's line; a damaged summary is a line that says so, not a failed page."""
    try:
        return GCRun.from_summary(read_summary(store, run_id), has_report)
    except CorruptedData as exc:
        unknown = Volume(0, 0)
        return GCRun(
            run_id, "unreadable", "", False, "", None, unknown, unknown, False, str(exc), has_report
        )


def read_summary(store: ObjectStore, run_id: str) -> dict[str, Any]:
    data = _read(store, run_id, SUMMARY, "summary")
    try:
        document = json.loads(data)
    except ValueError:
        document = None
    if not isinstance(document, dict) or "run_id" not in document:
        raise CorruptedData(
            f"GC run {run_id!r} has a damaged summary in {store.url}: not a run's JSON summary"
        )
    return document


def read_report(store: ObjectStore, run_id: str) -> bytes:
    return _read(store, run_id, REPORT, "report")


def _read(store: ObjectStore, run_id: str, name: str, what: str) -> bytes:
    if not RUN_ID.match(run_id):
        raise NotFound(f"{run_id!r} is not a GC run id (such as fe5dcfcfb8ff-4db019)")
    try:
        return store.get(f"{RUNS_PREFIX}{run_id}/{name}")
    except NotFound:
        raise NotFound(
            f"GC run {run_id!r} has no {what} in {store.url}: it does not exist or its mark "
            "did not finish"
        ) from None
