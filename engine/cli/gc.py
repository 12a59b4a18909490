"""`gc prepare`, `gc run`, `gc prune-runs`, `gc explain` and `gc rules get|set`: garbage
collection.

`gc prepare` is the engine's side alone. `gc run` submits the Spark job
(`branchwater.spark_jobs.gc`) with `spark-submit`, shows its phases from the events it prints,
then its summary; `gc prune-runs` removes older runs' data as every run does on its way out;
`gc explain` reads the saved runs and the refs in this process. The job's modules are imported
only by these verbs (they need pyarrow, and `gc run` a Spark install).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any

import branchwater
from branchwater.engine.api import Lake, Repository
from branchwater.engine.cli.output import Output
from branchwater.engine.cli.verbs import (
    Subparsers,
    UserError,
    fraction,
    group,
    positive_int,
    verb,
)
from branchwater.engine.errors import ConfigurationError, GateFailed, Unavailable
from branchwater.engine.gc.prepare import read_manifest
from branchwater.engine.gc.runs.config import KEEP_RUNS
from branchwater.engine.units import human_size

JOB_FILE = ("spark_jobs", "gc", "__main__.py")
"""The job `spark-submit` runs, relative to the `branchwater` package."""
DEFAULT_MASTER = "local[*]"
PHASES = {
    "prepare": "Marking uncommitted objects",
    "committed": "Reading committed metaranges",
    "slices": "Choosing slices",
    "mark": "Listing and marking, slice by slice",
    "state": "Saving the state for the next run",
    "gate": "Running the quality gate",
    "sweep": "Deleting",
}


def cmd_gc_prepare(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    repo = lake.repository(args.repo)
    run = repo.prepare_uncommitted_for_gc(
        args.run, progress=out.progress.counter("Listing uncommitted entries")
    )
    out.progress.done()
    manifest = read_manifest(
        lake.graveler.objects(repo.storage_namespace), run.run_id, repo.record.unique_id
    )
    entries = sum(manifest["branches"].values())
    out.document(
        {
            "run_id": run.run_id,
            "location": run.location,
            "uncommitted": entries,
            "branches": len(manifest["branches"]),
            "copy_records": manifest["copy_records"],
            "files": manifest["files"],
        },
        f"GC run {run.run_id}: {entries:,} uncommitted entries on "
        f"{len(manifest['branches']):,} branches and {manifest['copy_records']:,} copy "
        f"records\nwritten to {run.location}",
    )


def spark_home() -> str | None:
    """`$SPARK_HOME`, else the pyspark package of this interpreter (a full distribution)."""
    if os.environ.get("SPARK_HOME"):
        return os.environ["SPARK_HOME"]
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return None
    return str(Path(spec.origin).parent)


def spark_submit(home: str | None) -> str:
    found = Path(home) / "bin" / "spark-submit" if home else None
    if found is not None and found.is_file():
        return str(found)
    on_path = shutil.which("spark-submit")
    if on_path is None:
        raise ConfigurationError(
            "gc run needs spark-submit: install pyspark (the `spark` extra) or set SPARK_HOME"
        )
    return on_path


def submit_env(home: str | None, kv_url: str) -> dict[str, str]:
    """The job's environment: this interpreter for Spark's Python, its Spark distribution, and
    the KV URL (`--kv-env`), whose password a command line would show to every user."""
    from branchwater.engine.gc.runs.config import JOB_KV_ENV

    env = {**os.environ, JOB_KV_ENV: kv_url}
    env.setdefault("PYSPARK_PYTHON", sys.executable)
    env.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if home:
        env["SPARK_HOME"] = home
    return env


def job_file() -> str:
    """The job's script, found beside this package: the engine never imports the job."""
    found = Path(branchwater.__file__).parent.joinpath(*JOB_FILE)
    if not found.is_file():
        raise ConfigurationError(f"the GC job ({found}) is not installed")
    return str(found)


def submit_command(args: argparse.Namespace) -> list[str]:
    """The `spark-submit` command line of one `gc run`."""
    from branchwater.engine.gc.runs.config import JOB_KV_ENV

    command = [
        spark_submit(spark_home()),
        "--master",
        args.master,
        "--name",
        f"branchwater-gc-{args.repo}",
        "--conf",
        f"spark.pyspark.python={sys.executable}",
        "--conf",
        f"spark.pyspark.driver.python={sys.executable}",
        "--conf",
        "spark.ui.showConsoleProgress=false",
        *[part for conf in args.conf for part in ("--conf", conf)],
        job_file(),
        "--kv-env",
        JOB_KV_ENV,
        "--repo",
        args.repo,
        "--mode",
        args.mode,
    ]
    if args.dry_run:
        command.append("--dry-run")
    for option in ("sweep", "min_age", "max_share", "lock_ttl", "only", "keep_runs"):
        value = getattr(args, option)
        if value is not None:
            command += [f"--{option.replace('_', '-')}", str(value)]
    return command


def cmd_gc_run(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    from branchwater.engine.cli.app import kv_url
    from branchwater.engine.gc.runs.files import RunSummary

    repo = lake.repository(args.repo)
    if args.sweep is not None:
        from branchwater.engine.gc.runs.files import (
            check_sweepable,
            nothing_to_delete,
            read_summary,
        )
        from branchwater.engine.gc.runs.storage import Namespace

        mark = read_summary(Namespace.of(repo.storage_namespace), args.sweep)
        check_sweepable(mark, repo.record.unique_id)
        if nothing_to_delete(mark):
            swept = _sweep_without_spark(repo, args, kv_url(args.kv))
            out.document(swept.to_json(), summary_text(swept))
            return
    with tempfile.NamedTemporaryFile(prefix="branchwater-gc-", suffix=".log", delete=False) as log:
        code, events = _submit(submit_command(args), kv_url(args.kv), log, out)
    out.progress.done()
    summary_event = next((e for e in events if e["event"] == "summary"), None)
    if summary_event is not None:
        summary = RunSummary.from_json(summary_event["summary"])
        out.document(summary_event["summary"], summary_text(summary))
        Path(log.name).unlink(missing_ok=True)
        if summary.gate_success:
            return
        failed = ", ".join(e.type for e in summary.failed_expectations())
        raise GateFailed(f"GC run {summary.run_id} failed its quality gate ({failed})")
    _raise_failure(events, code, log.name)


def _sweep_without_spark(repo: Repository, args: argparse.Namespace, kv_url: str) -> Any:
    """The sweep of a mark with no candidates, here: no Spark application to wait for."""
    from branchwater.engine.gc.runs.config import JobConfig, parse_duration
    from branchwater.engine.gc.runs.sweeps import sweep_without_spark

    lock_ttl = parse_duration(args.lock_ttl) if args.lock_ttl is not None else None
    config = JobConfig(
        kv_url, args.repo, sweep=args.sweep, lock_ttl=lock_ttl, keep_runs=args.keep_runs
    )
    return sweep_without_spark(repo, config)


def _submit(
    command: list[str], kv_url: str, log: IO[bytes], out: Output
) -> tuple[int, list[dict[str, Any]]]:
    """Run the job, its stderr (Spark's log) to `log`; returns its exit code and events."""
    from branchwater.engine.gc.runs.events import parse

    events: list[dict[str, Any]] = []
    env = submit_env(spark_home(), kv_url)
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True, env=env) as job:
        assert job.stdout is not None
        for line in job.stdout:
            event = parse(line.rstrip("\n"))
            if event is None:
                continue
            events.append(event)
            if event["event"] == "phase" and event["state"] == "start":
                out.progress.update(PHASES.get(event["phase"], event["phase"]))
            elif event["event"] == "progress":
                out.progress.update(PHASES["prepare"], event["entries"])
            elif event["event"] == "notice":
                out.progress.update(event["message"])
    return job.returncode, events


def _raise_failure(events: list[dict[str, Any]], code: int, log: str) -> None:
    from branchwater.engine.gc.runs.events import error_class

    error = next((e for e in events if e["event"] == "error"), None)
    if error is not None:
        raise error_class(error["kind"])(error["message"])
    raise Unavailable(f"the GC job failed (exit code {code}) before its summary; see {log}")


def summary_text(summary: Any) -> str:
    """A run's summary as a few lines, the report's path last."""
    counts = {name: summary.volume(name) for name in summary.counts}
    lines = [
        f"GC run {summary.run_id} ({summary.mode}) of {summary.repository}: {summary.status}",
    ]
    if summary.fallback:
        lines.append(f"  {summary.fallback}")
    override = " (override)" if summary.min_age_override else ""
    lines.append(f"  cutoff {summary.cutoff}, minimum age {summary.min_age_seconds:g} s{override}")
    parts = summary.retention.get("parts", ["uncommitted"])
    lines.append(f"  parts: {', '.join(parts) or 'none'}")
    if "uncommitted" in parts:
        slices = summary.slices
        listed, young = summary.volume("listed"), summary.volume("young")
        lines.append(
            f"  listed {listed.objects:,} objects ({human_size(listed.bytes)}) "
            f"in {slices.get('read', 0)} slices; {young.objects:,} too young"
        )
        candidates = summary.volume("candidates")
        lines.append(
            f"  committed {summary.volume('committed').objects:,}, uncommitted "
            f"{summary.volume('uncommitted').objects:,}, candidates {candidates.objects:,} "
            f"({human_size(candidates.bytes)})"
        )
    if summary.retention.get("rules"):
        retention = summary.retention
        expired = summary.volume("expired")
        lines.append(
            f"  retention: {retention['expired_commits']:,} expired commits, "
            f"{expired.objects:,} objects only they hold ({human_size(expired.bytes)})"
        )
    if "deleted" in counts:
        deleted = counts["deleted"]
        lines.append(f"  deleted {deleted.objects:,} objects ({human_size(deleted.bytes)})")
    gate = "passed" if summary.gate_success else "FAILED"
    lines.append(f"  gate {gate} ({len(summary.gate)} expectations)")
    for expectation in summary.failed_expectations():
        lines.append(f"    failed: {expectation.type} {expectation.observed}")
    lines.append(f"report: {summary.report_uri}")
    return "\n".join(lines)


def cmd_gc_explain(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    from branchwater.engine.gc.runs.config import parse_duration
    from branchwater.engine.gc.runs.explain import explain

    repo = lake.repository(args.repo)
    min_age = lake.gc.limits.settings_for_runs().default_min_age
    if args.min_age is not None:
        min_age = parse_duration(args.min_age)
    answer = explain(repo, args.address, args.run, min_age=min_age)
    out.document(answer.to_json(), answer.text())


def cmd_gc_prune_runs(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    from branchwater.engine.gc.runs.config import who
    from branchwater.engine.gc.runs.pruning import prune_runs
    from branchwater.engine.gc.runs.storage import Namespace

    repo = lake.repository(args.repo)
    ns = Namespace.of(repo.storage_namespace)
    with repo.lock_gc_run(f"prune of GC runs by {who()}") as lease:
        now = datetime.now(timezone.utc)
        pruned = prune_runs(ns, repo.record.unique_id, args.keep_runs, now, lease.check)
    out.document(dataclasses.asdict(pruned), pruned.text())


def cmd_gc_rules_get(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    rules = lake.repository(args.repo).gc_rules()
    if rules is None:
        out.document(None, f"{args.repo!r} has no GC rules: every commit's objects are kept")
        return
    document = rules.to_json()
    out.document(document, json.dumps(document, indent=2))


def cmd_gc_rules_set(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    try:
        text = Path(args.file).read_text() if args.file != "-" else sys.stdin.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(
            f"cannot read {args.file!r}: {getattr(exc, 'strerror', None) or exc}"
        ) from exc
    rules = lake.repository(args.repo).set_gc_rules(text)
    document = rules.to_json()
    out.document(document, f"GC rules of {args.repo!r} set:\n{json.dumps(document, indent=2)}")


def duration(text: str) -> str:
    """A duration the job will accept (`6h`, `30m`), checked here rather than after Spark
    has started; the job is given the text as written."""
    from branchwater.engine.gc.runs.config import duration_argument

    duration_argument(text)
    return text


def register(sub: Subparsers) -> None:
    gc = group(sub, "gc", "garbage collection of uncommitted objects and expired commits")
    prepare = verb(
        gc,
        "prepare",
        cmd_gc_prepare,
        "write every branch's uncommitted addresses (and copy records) for a GC run",
    )
    prepare.add_argument("repo", metavar="REPO")
    prepare.add_argument("--run", default=None, metavar="RUN_ID", help="resume an interrupted run")

    run = verb(gc, "run", cmd_gc_run, "collect uncommitted garbage with the Spark job")
    run.add_argument("repo", metavar="REPO")
    run.add_argument("--mode", choices=["clean", "optimized"], default="clean")
    action = run.add_mutually_exclusive_group()
    action.add_argument("--dry-run", action="store_true", help="mark only, delete nothing")
    action.add_argument("--sweep", metavar="MARK_ID", help="delete what a saved mark holds")
    run.add_argument(
        "--min-age",
        type=duration,
        metavar="DURATION",
        help="keep objects younger than this (default: the link-token expiry); lower is an "
        "override the report flags",
    )
    run.add_argument(
        "--max-share",
        type=fraction,
        metavar="FRACTION",
        help="most candidates a run may mark, as a share of the namespace's objects (default 0.5)",
    )
    run.add_argument(
        "--lock-ttl",
        type=duration,
        metavar="DURATION",
        help="how long the repository's GC run lease outlives a crashed run (default 5m)",
    )
    run.add_argument(
        "--only",
        choices=["uncommitted", "committed"],
        help="collect one kind only (default: both when the repository has GC rules, see "
        "`gc rules`)",
    )
    run.add_argument(
        "--keep-runs",
        type=positive_int,
        default=KEEP_RUNS,
        metavar="N",
        help=f"the newest runs whose data is kept (default {KEEP_RUNS}); older ones keep "
        "their summary and report",
    )
    run.add_argument("--master", default=DEFAULT_MASTER, metavar="URL", help="Spark master")
    run.add_argument(
        "--conf", action="append", default=[], metavar="KEY=VALUE", help="a Spark setting"
    )

    rules = group(gc, "rules", "the repository's retention rules for committed data")
    get = verb(rules, "get", cmd_gc_rules_get, "print the repository's GC rules as JSON")
    get.add_argument("repo", metavar="REPO")
    put = verb(rules, "set", cmd_gc_rules_set, "replace the repository's GC rules")
    put.add_argument("repo", metavar="REPO")
    put.add_argument(
        "--file",
        default="-",
        metavar="FILE",
        help='rules as JSON ({"default_retention_days": 30, "branches": [{"branch_id": '
        '"main", "retention_days": 90}], "keep_tags": "v*"}); default: stdin',
    )

    prune = verb(
        gc,
        "prune-runs",
        cmd_gc_prune_runs,
        "remove the data of older GC runs, keeping their summaries (every run does this too)",
    )
    prune.add_argument("repo", metavar="REPO")
    prune.add_argument(
        "--keep-runs",
        type=positive_int,
        default=KEEP_RUNS,
        metavar="N",
        help=f"the newest runs kept whole (default {KEEP_RUNS})",
    )

    explain = verb(gc, "explain", cmd_gc_explain, "say why an object was or was not collected")
    explain.add_argument("repo", metavar="REPO")
    explain.add_argument("address", metavar="ADDRESS")
    explain.add_argument("--run", default=None, metavar="RUN_ID", help="about this run only")
    explain.add_argument(
        "--min-age", type=duration, metavar="DURATION", help="as `gc run --min-age`"
    )
