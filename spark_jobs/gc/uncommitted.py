"""The uncommitted side: a finished prepare run, marked before anything committed is read."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from branchwater.engine import Repository
from branchwater.spark_jobs.gc.storage import Namespace

PREPARE_PREFIX = "_branchwater/retention/gc/uncommitted/"
MANIFEST = "_SUCCESS"


@dataclass(frozen=True)
class PreparedInput:
    """A finished prepare run: its id and start, its Parquet files (keys in the namespace),
    and the lake's time limits it recorded."""

    run_id: str
    started_at: datetime
    keys: list[str]
    token_expiry: timedelta
    default_min_age: timedelta

    @classmethod
    def from_manifest(cls, manifest: dict[str, Any]) -> PreparedInput:
        run_id = manifest["run_id"]
        return cls(
            run_id,
            datetime.fromisoformat(manifest["started_at"]),
            [f"{PREPARE_PREFIX}{run_id}/{name}" for name in manifest["files"]],
            timedelta(seconds=manifest["token_expiry_seconds"]),
            timedelta(seconds=manifest["min_age_seconds"]),
        )


def prepare(repo: Repository, ns: Namespace) -> PreparedInput:
    """Mark every branch's uncommitted addresses (and copy records) now."""
    run = repo.prepare_uncommitted_for_gc()
    return PreparedInput.from_manifest(ns.get_json(f"{PREPARE_PREFIX}{run.run_id}/{MANIFEST}"))
