"""GC runs as people list them: newest first, each with its figures, read through the
engine's object store (the Branchwater view in Airflow's UI shows these). A damaged summary is
a line that says so, not a failed page."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import islice
from typing import Any

from branchwater.engine.errors import CorruptedData, NotFound
from branchwater.engine.gc.runs.files import (
    REPORT,
    RUN_ID,
    SUMMARY,
    Volume,
    run_prefix,
    stored_run_ids,
)
from branchwater.engine.objects import ObjectStore

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
    """The runs whose mark finished (they have a summary), newest first: their folders from
    one delimiter listing, then their files by key, never a listing of the thousands of files
    a run writes."""
    finished = list(islice(_saved_summaries(store), limit))
    reports = store.stat_many([run_prefix(run_id) + REPORT for run_id, _ in finished]).sizes
    return [
        _run(store, run_id, data, size is not None)
        for (run_id, data), size in zip(finished, reports, strict=True)
    ]


def _saved_summaries(store: ObjectStore) -> Iterator[tuple[str, bytes]]:
    """Each run's id and summary as saved, newest first, skipping runs that have none (their
    mark did not finish)."""
    for run_id in stored_run_ids(store):
        try:
            yield run_id, store.get(run_prefix(run_id) + SUMMARY)
        except NotFound:
            continue


def _run(store: ObjectStore, run_id: str, data: bytes, has_report: bool) -> GCRun:
    """A run's line; a damaged summary is a line that says so, not a failed page: one that
    is not JSON, and one whose figures are not figures (`GCRun.from_summary` fails)."""
    try:
        return GCRun.from_summary(_summary_document(store, run_id, data), has_report)
    except CorruptedData as exc:
        error = str(exc)
    except (ValueError, TypeError, AttributeError, KeyError) as exc:
        error = str(_damaged(store, run_id, f"{type(exc).__name__}: {exc}"))
    unknown = Volume(0, 0)
    return GCRun(
        run_id, "unreadable", "", False, "", None, unknown, unknown, False, error, has_report
    )


def read_summary(store: ObjectStore, run_id: str) -> dict[str, Any]:
    return _summary_document(store, run_id, _read(store, run_id, SUMMARY, "summary"))


def _summary_document(store: ObjectStore, run_id: str, data: bytes) -> dict[str, Any]:
    try:
        document = json.loads(data)
    except ValueError:
        document = None
    if not isinstance(document, dict) or "run_id" not in document:
        raise _damaged(store, run_id, "not a run's JSON summary")
    return document


def _damaged(store: ObjectStore, run_id: str, why: str) -> CorruptedData:
    return CorruptedData(f"GC run {run_id!r} has a damaged summary in {store.url}: {why}")


def read_report(store: ObjectStore, run_id: str) -> bytes:
    return _read(store, run_id, REPORT, "report")


def _read(store: ObjectStore, run_id: str, name: str, what: str) -> bytes:
    if not RUN_ID.match(run_id):
        raise NotFound(f"{run_id!r} is not a GC run id (such as fe5dcfcfb8ff-4db019)")
    try:
        return store.get(run_prefix(run_id) + name)
    except NotFound:
        raise NotFound(
            f"GC run {run_id!r} has no {what} in {store.url}: it does not exist or its mark "
            "did not finish"
        ) from None
