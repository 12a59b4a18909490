"""The GC job's command line: `spark-submit spark_jobs/gc/__main__.py --kv URL --repo NAME
[--mode optimized] [--dry-run | --sweep MARK_ID] [--min-age 6h]` (the `branchwater gc run`
verb does). On stdout the job writes one JSON line per event (see `events`): phases as they
start and end, then the summary. It exits 0 only when the run and its gate succeeded.
Parsing needs no Spark, so `--help` and usage errors answer where pyspark is missing.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

from branchwater.engine import BranchwaterError, InvalidArgument
from branchwater.engine.gc.runs.config import (
    CANDIDATES_PER_FILE,
    CLEAN,
    DEFAULT_MAX_SHARE,
    DRIVER_ROWS,
    KEEP_RUNS,
    OPTIMIZED,
    JobConfig,
    duration_argument,
)
from branchwater.engine.gc.runs.events import emit
from branchwater.engine.gc.runs.retention import ONLY_COMMITTED, ONLY_UNCOMMITTED


class _Parser(argparse.ArgumentParser):
    """Usage errors raise `InvalidArgument`, which `main` reports as an event like any other
    (a launcher reads the job's events, not its stderr)."""

    def error(self, message: str) -> NoReturn:
        raise InvalidArgument(f"{self.prog}: {message}")


def parse_args(argv: list[str]) -> JobConfig:
    parser = _Parser(prog="branchwater-gc", description=__doc__)
    lake = parser.add_mutually_exclusive_group(required=True)
    lake.add_argument("--kv", metavar="URL")
    lake.add_argument(
        "--kv-env",
        metavar="NAME",
        help="the environment variable holding the KV URL, which keeps its password off "
        "the command line",
    )
    parser.add_argument(
        "--prepare-run", metavar="RUN_ID", help="mark from this finished prepare run"
    )
    parser.add_argument("--repo", required=True, metavar="NAME")
    parser.add_argument("--mode", choices=[CLEAN, OPTIMIZED], default=CLEAN)
    parser.add_argument("--dry-run", action="store_true")
    parser.add_argument("--sweep", metavar="MARK_ID")
    parser.add_argument("--min-age", type=duration_argument, metavar="DURATION")
    parser.add_argument("--max-share", type=float, default=DEFAULT_MAX_SHARE)
    parser.add_argument("--late-writes", type=duration_argument, metavar="DURATION")
    parser.add_argument("--partitions", type=int)
    parser.add_argument("--candidates-per-file", type=int, default=CANDIDATES_PER_FILE)
    parser.add_argument(
        "--driver-rows",
        type=int,
        default=DRIVER_ROWS,
        help="an optimized run reading at most this many addresses marks on the driver (0: never)",
    )
    parser.add_argument(
        "--keep-runs",
        type=int,
        default=KEEP_RUNS,
        help="the newest runs whose data is kept; older runs keep only their summary and report",
    )
    parser.add_argument("--holder", help="who runs this, as other runs are told")
    parser.add_argument("--lock-ttl", type=duration_argument, metavar="DURATION")
    parser.add_argument(
        "--only",
        choices=[ONLY_UNCOMMITTED, ONLY_COMMITTED],
        help="one part of the run (default: both when the repository has GC rules)",
    )
    args = parser.parse_args(argv)
    return JobConfig(
        kv_url=args.kv or _environment_value(args.kv_env),
        repository=args.repo,
        mode=args.mode,
        dry_run=args.dry_run,
        sweep=args.sweep,
        min_age=args.min_age,
        late_writes=args.late_writes,
        partitions=args.partitions,
        max_share=args.max_share,
        candidates_per_file=args.candidates_per_file,
        driver_rows=args.driver_rows,
        prepare_run=args.prepare_run,
        holder=args.holder,
        lock_ttl=args.lock_ttl,
        keep_runs=args.keep_runs,
        only=args.only,
    )


def _environment_value(name: str) -> str:
    value = os.environ.get(name)
    if not value:
        raise InvalidArgument(f"--kv-env {name}: the environment variable {name} is not set")
    return value


def main(argv: list[str] | None = None) -> int:
    try:
        config = parse_args(sys.argv[1:] if argv is None else argv)
    except BranchwaterError as exc:
        emit({"event": "error", "message": str(exc), "kind": type(exc).__name__})
        return 1
    from branchwater.spark_jobs.gc.job import run

    return run(config)
