"""The job's settings, and the durations they are written in (`6h`, `30m`, `0s`, `1d`)."""

from __future__ import annotations

import argparse
import getpass
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta

from branchwater.engine.errors import InvalidArgument
from branchwater.engine.gc.runlock import check_lease
from branchwater.engine.gc.settings import LONGEST, check_duration

CLEAN = "clean"
OPTIMIZED = "optimized"
MODES = (CLEAN, OPTIMIZED)
DEFAULT_MAX_SHARE = 0.5
CANDIDATES_PER_FILE = 50_000
DRIVER_ROWS = 1_000_000
"""The most addresses an optimized run reads (uncommitted, pending, carried and new committed)
for its mark to run on the driver (see `spark_jobs/gc/mark_paths.py`): a few hundred MB of Arrow at
most."""
DRIVER_SLICES = 32
"""The most slices an optimized run lists on the driver (as many paths as Spark's own file
index lists on the driver before it lists in parallel)."""
SLICE_LIFETIME = timedelta(hours=1)
"""How long a writer keeps a slice current (the engine's default)."""
CLOCK_SKEW = timedelta(minutes=5)
ONLY_PARTS = ("uncommitted", "committed")
KEEP_RUNS = 10
"""Runs of a repository whose data a run keeps, newest first (`pruning`; the newest base is
kept besides)."""
JOB_KV_ENV = "BRANCHWATER_GC_KV_URL"
"""Where launchers (`gc run`, the Airflow GC operators) put the KV URL for `--kv-env`: in the
job's environment, its password is on no command line."""

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd])$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> timedelta:
    """`90s`, `30m`, `6h`, `2d` (or a bare number of seconds)."""
    value = text.strip().lower()
    if re.fullmatch(r"\d+(?:\.\d+)?", value):
        value += "s"
    match = _DURATION.match(value)
    if match is None:
        raise InvalidArgument(f"{text!r} is not a duration such as 90s, 30m, 6h or 2d")
    seconds = float(match.group(1)) * _UNITS[match.group(2)]
    if seconds > LONGEST.total_seconds():
        raise InvalidArgument(f"{text!r} is longer than {LONGEST.days}d, the longest GC takes")
    return timedelta(seconds=seconds)


def check_keep(keep: int) -> int:
    if keep < 1:
        raise InvalidArgument(
            f"keep at least the newest GC run's data (--keep-runs 1 or more), not {keep}"
        )
    return keep


def duration_argument(text: str) -> timedelta:
    """`parse_duration` as an argparse type: its message, not argparse's own, names the
    value that is wrong."""
    try:
        return parse_duration(text)
    except InvalidArgument as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


@dataclass(frozen=True)
class JobConfig:
    """One GC job: which lake and repository, and how to run.

    `min_age` None takes the lake's default (never shorter than a link token's life); a
    shorter one is an override the summary flags. `late_writes` None is the token expiry plus
    a slice's lifetime and a clock-skew margin. `partitions` None is twice Spark's default
    parallelism. `candidates_per_file` sizes the mark's files: a sweep task's unit of work
    and of resumption. An optimized run reading at most `driver_rows` addresses and listing
    at most `DRIVER_SLICES` slices marks on the driver (0: never). `keep_runs` is how many of
    the newest runs keep their data when the run prunes older ones. `holder` names this run in
    the repository's GC run lease (None: who and where, and the Airflow task when run from
    one); `lock_ttl` None is the engine's lease.
    """

    kv_url: str
    repository: str
    mode: str = CLEAN
    dry_run: bool = False
    sweep: str | None = None
    min_age: timedelta | None = None
    max_share: float = DEFAULT_MAX_SHARE
    late_writes: timedelta | None = None
    prepare_run: str | None = None
    partitions: int | None = None
    candidates_per_file: int = CANDIDATES_PER_FILE
    driver_rows: int = DRIVER_ROWS
    s3_options: Mapping[str, str] = field(default_factory=dict)
    holder: str | None = None
    lock_ttl: timedelta | None = None
    keep_runs: int = KEEP_RUNS
    only: str | None = None
    """`uncommitted` or `committed`: one part of the run; None: both when the repository
    has retention rules, else the uncommitted part."""

    def __post_init__(self) -> None:
        if self.only is not None and self.only not in ONLY_PARTS:
            raise InvalidArgument(f"--only takes uncommitted or committed, not {self.only!r}")
        if self.mode not in MODES:
            raise InvalidArgument(f"GC mode must be clean or optimized, not {self.mode!r}")
        if self.min_age is not None:
            check_duration("the minimum age", self.min_age, zero=True)
        if self.late_writes is not None:
            check_duration("the late-writes margin", self.late_writes, zero=True)
        if not 0 <= self.max_share <= 1:
            raise InvalidArgument(f"max share must be between 0 and 1, not {self.max_share}")
        if self.partitions is not None and self.partitions < 1:
            raise InvalidArgument(f"partitions must be at least 1, not {self.partitions}")
        if self.candidates_per_file < 1:
            raise InvalidArgument("candidates per file must be at least 1")
        if self.driver_rows < 0:
            raise InvalidArgument("driver rows must not be negative (0: never mark on the driver)")
        if self.sweep is not None and self.prepare_run is not None:
            raise InvalidArgument("--sweep deletes a saved mark; it takes no prepare run")
        if self.sweep is not None and self.dry_run:
            raise InvalidArgument("--sweep deletes a saved mark; it cannot be a dry run")
        check_keep(self.keep_runs)
        if self.lock_ttl is not None:
            check_lease(self.lock_ttl)

    def lease_holder(self) -> str:
        """What another run is told holds the repository: this run, who started it, where."""
        what = f"sweep of {self.sweep}" if self.sweep else f"{self.mode} run"
        return f"{what} by {self.holder or who()}"


def who() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    where = f"{user}@{socket.gethostname()} pid {os.getpid()}"
    dag = os.environ.get("AIRFLOW_CTX_DAG_ID")
    if dag:
        run = os.environ.get("AIRFLOW_CTX_DAG_RUN_ID", "?")
        task = os.environ.get("AIRFLOW_CTX_TASK_ID", "?")
        return f"Airflow DAG {dag} run {run} task {task} ({where})"
    return where
