"""Operators for garbage collection of uncommitted objects."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from branchwater.plugin.operators.base import BranchwaterOperator

if TYPE_CHECKING:
    from airflow.sdk import Context

    from branchwater.engine import Repository

PROGRESS_EVERY = 100_000
"""Entries between two progress lines in the task log."""


class BranchwaterPrepareUncommittedOperator(BranchwaterOperator):
    """Write the repository's uncommitted addresses (every branch's staged, sealed and
    compacted-but-uncommitted entries, then the copy records) for a GC run.

    Returns `{"run_id": ..., "location": ...}`: the GC job reads the run at `location`.
    `run_id` (templated) resumes an interrupted run instead of starting a new one.
    """

    template_fields: Sequence[str] = ("repository", "run_id")

    def __init__(self, *, run_id: str | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_id = run_id

    def execute_on(self, repo: Repository, context: Context) -> dict[str, str]:
        logged = [0]

        def progress(entries: int) -> None:
            if entries - logged[0] >= PROGRESS_EVERY:
                logged[0] = entries
                self.log.info("%d uncommitted entries written", entries)

        prepared = repo.prepare_uncommitted_for_gc(self.run_id or None, progress=progress)
        self.log.info("GC preparation run %s is at %s", prepared.run_id, prepared.location)
        return {"run_id": prepared.run_id, "location": prepared.location}
