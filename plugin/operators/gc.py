"""Operators for garbage collection of uncommitted objects: the prepare run, the Spark job's
mark and sweep (through `SparkSubmitOperator`), the quality gate between them, and the
report.

The GC job (`branchwater.spark_jobs.gc`) saves each run under the repository's namespace
(`summary.json` with the gate's Great Expectations figures, `report.html`, ...); the
operators after the mark read that, never the job's log. The job gets the KV URL from an
environment variable (`--kv-env`), so its password is on no command line and in no
rendered field.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import BaseHook
from airflow.sdk.exceptions import (
    AirflowException,
    AirflowFailException,
    AirflowNotFoundException,
    AirflowSkipException,
)

from branchwater.engine import (
    ConfigurationError,
    CorruptedData,
    GCRules,
    InvalidArgument,
    NotFound,
    RunExpired,
)
from branchwater.engine.gc.runs.config import (
    CLEAN,
    JOB_KV_ENV,
    KEEP_RUNS,
    MODES,
    ONLY_PARTS,
    check_keep,
)
from branchwater.engine.gc.runs.statuses import FAILED, GATE_FAILED
from branchwater.plugin.hooks import DEFAULT_CONN_ID, BranchwaterHook, unset
from branchwater.plugin.links import BranchwaterGCReportLink
from branchwater.plugin.operators.base import (
    BranchwaterOperator,
    checked_where_declared,
    failing_at_once,
    keep_state,
    kept_state,
    rendered_flag,
    resolved_later,
)

if TYPE_CHECKING:
    from airflow.providers.apache.spark.hooks.spark_submit import SparkSubmitHook
    from airflow.sdk import Context

    from branchwater.engine import PreparedRun, Repository
    from branchwater.engine.gc.runs.files import Expectation, RunSummary

PREPARE_KEY = "prepare_run"
"""Where a prepare task keeps the run it started (its state store), for its retries."""
PROGRESS_EVERY = 100_000
"""Entries between two progress lines in the task log."""
DEFAULT_MASTER = "local[*]"
SPARK_CONN_ID = "spark_default"


class BranchwaterPrepareUncommittedOperator(BranchwaterOperator):
    """Write the repository's uncommitted addresses (every branch's staged, sealed and
    compacted-but-uncommitted entries, then the copy records) for a GC run.

    Returns `{"run_id": ..., "location": ...}`: the GC job reads the run at `location`.
    A retry resumes the run an earlier try started (its id is kept in the task's state
    store), from its last file, rather than scanning every branch again; one that cannot be
    resumed (it stopped before its first file, or outlived the copy records) is replaced by
    a new run. A run an earlier try finished is returned as it is.

    :param run_id: an interrupted run to resume instead of starting a new one (templated)
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

        prepared = self._prepared(repo, context, progress)
        self.log.info("GC preparation run %s is at %s", prepared.run_id, prepared.location)
        return {"run_id": prepared.run_id, "location": prepared.location}

    def _prepared(
        self, repo: Repository, context: Context, progress: Callable[[int], None]
    ) -> PreparedRun:
        if self.run_id:
            return repo.prepare_uncommitted_for_gc(self.run_id, progress=progress)
        kept = kept_state(context, PREPARE_KEY, repository=repo.name)
        if kept is not None:
            try:
                return repo.prepare_uncommitted_for_gc(str(kept["run_id"]), progress=progress)
            except (NotFound, RunExpired, CorruptedData, InvalidArgument) as exc:
                self.log.info("Starting a new GC preparation run: %s", exc)

        def started(run_id: str) -> None:
            keep_state(context, PREPARE_KEY, repository=repo.name, run_id=run_id)

        return repo.prepare_uncommitted_for_gc(progress=progress, started=started)


def summary_record(summary: RunSummary) -> dict[str, Any]:
    """A GC run's outcome as plain values for XCom: what a DAG or a person looks at first."""
    candidates, deleted = summary.volume("candidates"), summary.volume("deleted")
    return {
        "run_id": summary.run_id,
        "repository": summary.repository,
        "mode": summary.mode,
        "status": summary.status,
        "gate_success": summary.gate_success,
        "cutoff": summary.cutoff,
        "min_age_seconds": summary.min_age_seconds,
        "candidates": candidates.objects,
        "candidate_bytes": candidates.bytes,
        "deleted": deleted.objects,
        "deleted_bytes": deleted.bytes,
        "expired": summary.volume("expired").objects,
        "expired_bytes": summary.volume("expired").bytes,
        "retention": {
            k: v
            for k, v in summary.retention.items()
            if k in ("parts", "rules", "active_commits", "expired_commits")
        },
        "summary": summary.summary_uri,
        "report": summary.report_uri,
    }


class RetentionRulesMismatch(InvalidArgument):
    """A GC run pinned retention rules (the DAG's `branchwater_gc_retention`) other than the
    repository's: nothing is marked. A pin guards rules a person reviewed against a change
    since; it never replaces them, the repository's rules alone decide what is deleted."""


def pinned_rules(value: object) -> GCRules | None:
    """The rules a run pins: the param rendered as JSON (`tojson`) or a mapping; null or
    empty pins none. A document not of the rules' shape is `InvalidGCRules`."""
    if value is None or (isinstance(value, str) and value.strip() in ("", "null", "None")):
        return None
    return GCRules.from_json(value)


BEFORE_MARK = "Nothing was marked or deleted"
AFTER_MARK = "The job marked with them, and nothing will be swept"


def check_pinned(
    repository: str, pinned: GCRules | None, rules: GCRules | None, outcome: str = BEFORE_MARK
) -> None:
    """`RetentionRulesMismatch` unless the run pins no rules or `rules`, the repository's
    (`outcome` says what was done: before the job, or after it read rules changed since)."""
    if pinned is None or pinned == rules:
        return
    held = _rules_text(rules) if rules else "none (every commit's objects are kept)"
    raise RetentionRulesMismatch(
        f"GC of {repository!r} refused: the run pins the GC rules {_rules_text(pinned)} "
        f"(branchwater_gc_retention), but the repository's rules are {held}. {outcome}. "
        f"Trigger again with the repository's rules (`branchwater gc "
        f"rules get {repository}`) or null, or change them with `branchwater gc rules set`"
    )


def _rules_text(rules: GCRules) -> str:
    return json.dumps(rules.to_json(), sort_keys=True)


def job_file() -> str:
    """The installed GC job's entry point, the file `spark-submit` runs."""
    import branchwater.spark_jobs.gc as job

    return str(Path(job.__file__).with_name("__main__.py"))


def only_part(name: str, value: object) -> str | None:
    """The part of GC `only` names (rendered); None for both."""
    if unset(value):
        return None
    if isinstance(value, str) and value in ONLY_PARTS:
        return value
    raise InvalidArgument(f"{name} must be {' or '.join(ONLY_PARTS)} (empty: both), not {value!r}")


def gc_mode(name: str, value: object) -> str:
    """The GC job's mode, as rendered."""
    if isinstance(value, str) and value in MODES:
        return value
    raise InvalidArgument(f"{name} must be {' or '.join(MODES)}, not {value!r}")


def check_job_command(kv_url: str, command: list[str]) -> None:
    """Parse the job's command line as the job will, without Spark: arguments it would
    refuse (`InvalidArgument`) fail the task before `spark-submit` starts."""
    from branchwater.spark_jobs.gc.arguments import parse_args

    parse_args(["--kv", kv_url, *command])


def connection_defined(conn_id: str) -> bool:
    try:
        BaseHook.get_connection(conn_id)
    except AirflowNotFoundException:
        return False
    return True


class BranchwaterGCJobOperator(SparkSubmitOperator):
    """The GC Spark job of `repository` through `spark-submit`; `BranchwaterGCMarkOperator`
    and `BranchwaterGCSweepOperator` say which part.

    The Spark connection (`conn_id`, default `spark_default`) chooses the master; without
    that connection the job runs on `local[*]`, not on YARN as `SparkSubmitOperator` would.
    The KV URL reaches the job in its environment only (`--kv-env`), with the AWS
    connection's credentials for S3 namespaces; YARN and Kubernetes masters, where
    `spark-submit` would copy the environment onto its command line, are refused. The
    interpreter running the task runs the job too (`PYSPARK_PYTHON`, unless `env_vars` says
    otherwise), and its `spark-submit` is used when none is on the `PATH`. The Spark
    application is named `name` (templated) followed by the repository. Other
    `SparkSubmitOperator` parameters (`conf`, `env_vars`, `executor_memory`...) pass through.

    Before `spark-submit` starts, the job's command line is parsed as the job parses it, and
    the repository read: an argument the job would refuse, an unknown repository or run, an
    AWS connection giving no credentials, or a refused master fails the task without its
    retries.

    :param repository: the repository to collect (templated)
    :param branchwater_conn_id: the `branchwater` connection of the lake (default
        `branchwater_default`)
    :param conn_id: the Spark connection choosing the master (default `spark_default`;
        missing: `local[*]`)
    :param keep_runs: how many of the newest GC runs keep their data when the run ends;
        older runs keep only their summary and report (templated; default 10)
    """

    template_fields: Sequence[str] = (
        *SparkSubmitOperator.template_fields,
        "repository",
        "keep_runs",
    )
    ui_color = "#cfe8f3"

    def __init__(
        self,
        *,
        repository: str,
        branchwater_conn_id: str = DEFAULT_CONN_ID,
        conn_id: str = SPARK_CONN_ID,
        keep_runs: int | str = KEEP_RUNS,
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("name", "branchwater-gc")
        super().__init__(application=job_file(), conn_id=conn_id, **kwargs)
        self.repository = repository
        self.branchwater_conn_id = branchwater_conn_id
        self.keep_runs = keep_runs
        self.job_env: dict[str, str] = {}

    def job_arguments(self) -> list[str]:
        """The job's own arguments after `--kv-env` and `--repo`."""
        raise NotImplementedError

    def execute(self, context: Context) -> Any:
        hook = BranchwaterHook(self.branchwater_conn_id)
        try:
            with failing_at_once():
                command = self.job_command()
                self.job_env = job_environment(hook, self.repository)
                check_job_command(self.job_env[JOB_KV_ENV], command)
                self.check_run(hook)
            self.name = f"{self.name}-{self.repository}"
            self.application_args = ["--kv-env", JOB_KV_ENV, *command]
            with failing_at_once():
                super().execute(context)
            return summary_record(hook.gc_run(self.repository, self.job_run_id()))
        finally:
            self.job_env = {}
            hook.close()

    def job_run_id(self) -> str:
        """The GC run the job works on, whose figures the task returns."""
        raise NotImplementedError

    def check_run(self, hook: BranchwaterHook) -> None:
        """Raise `NotFound` for a run the job starts from and would not find, before Spark
        starts: waiting does not make it appear. A part that starts from a run overrides
        this; by default the job starts from none."""

    def job_command(self) -> list[str]:
        """The job's arguments but where it finds the KV URL."""
        return [
            "--repo",
            self.repository,
            "--keep-runs",
            str(self.kept_runs()),
            *self.job_arguments(),
        ]

    def kept_runs(self) -> int:
        """`keep_runs` as rendered (a template gives text); a bad one fails the task at once."""
        with failing_at_once():
            try:
                keep = int(self.keep_runs)
            except (TypeError, ValueError):
                raise InvalidArgument(
                    f"keep_runs must be a whole number of runs, not {self.keep_runs!r}"
                ) from None
            return check_keep(keep)

    def _get_hook(self) -> SparkSubmitHook:
        """`SparkSubmitOperator`'s hook, on `local[*]` without a Spark connection, with the
        job's environment added where only the `spark-submit` process sees it."""
        hook = super()._get_hook()
        if not connection_defined(self._conn_id):
            self.log.info("No connection %r: the GC job runs on %s", self._conn_id, DEFAULT_MASTER)
            run_locally(hook)
        if hook._is_yarn or hook._is_kubernetes:
            raise ConfigurationError(
                f"Spark master {hook._connection['master']!r}: spark-submit would put the "
                "GC job's environment, with the KV URL, on its command line; use a standalone "
                "master (spark://…) or local mode"
            )
        hook._env_vars = {
            **self.job_env,
            **(self.env_vars or {}),
            JOB_KV_ENV: self.job_env[JOB_KV_ENV],
        }
        return hook


def run_locally(hook: SparkSubmitHook) -> None:
    """Point a `SparkSubmitHook` that found no connection (and so chose YARN) at
    `local[*]`. It decides its mode from the master when it is built, so those flags are
    reset with it (pinned by the GC DAG tests, which run without a Spark connection)."""
    hook._connection = {**hook._connection, "master": DEFAULT_MASTER, "deploy_mode": None}
    hook._is_yarn = hook._is_yarn_cluster_mode = hook._is_kubernetes = False
    hook._should_track_driver_status = False


def job_environment(hook: BranchwaterHook, repository: str) -> dict[str, str]:
    """What the job needs in its environment: the KV URL, its Python and `spark-submit`,
    and, for a repository on S3, credentials from the connection's AWS connection."""
    env = {
        JOB_KV_ENV: hook.settings.kv_url,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
    }
    here = str(Path(sys.executable).parent)
    if shutil.which("spark-submit") is None and (Path(here) / "spark-submit").exists():
        env["PATH"] = os.pathsep.join([here, os.environ.get("PATH", "")])
    s3 = hook.s3_options_for(hook.repository(repository).storage_namespace) or {}
    names = {
        "aws_access_key_id": "AWS_ACCESS_KEY_ID",
        "aws_secret_access_key": "AWS_SECRET_ACCESS_KEY",
        "aws_session_token": "AWS_SESSION_TOKEN",
        "region_name": "AWS_DEFAULT_REGION",
        "endpoint_url": "AWS_ENDPOINT_URL",
    }
    env.update({names[key]: value for key, value in s3.items() if value and key in names})
    return env


class BranchwaterGCMarkOperator(BranchwaterGCJobOperator):
    """Mark: the GC job finds what it may delete, saves it and runs its quality gate, and
    deletes nothing. Returns the run's figures (`summary_record`).

    `prepare_run` (templated) is the run id of a finished prepare run
    (`BranchwaterPrepareUncommittedOperator`'s), which names the GC run too. `mode` is
    "clean" or "optimized"; `min_age` a duration such as "6h" (empty: the lake's default,
    never shorter than a link token's life); `max_share` the gate's bound on the candidates'
    share of the namespace's objects old enough to be considered (empty: the job's default,
    0.5). A mark whose gate failed still succeeds: it finished, and
    `BranchwaterGCGateOperator` is the task that refuses it.

    :param prepare_run: the run id of a finished prepare run (templated)
    :param mode: "clean" or "optimized" (templated; default "clean"); anything else fails
        where the task is declared, or, templated or from XCom (an upstream task's
        `.output`), when it runs (`InvalidArgument`)
    :param min_age: how old an object must be to be collected, "90s", "6h"... (templated;
        default: the lake's)
    :param max_share: the gate's bound on the candidates' share of the namespace's objects
        (templated; default 0.5)
    :param only: "uncommitted" or "committed" to do that part only (templated; default:
        both, the committed one when the repository has GC rules; None, empty or rendered
        "None": both); anything else fails as `mode` does
    :param retention_rules: the GC rules the run expects the repository to have, lakeFS's
        JSON shape as `branchwater gc rules get` prints it, a mapping or its JSON text
        (templated; default none: whatever the repository's rules are). Other rules than
        the repository's fail the task before the job starts, nothing marked
        (`RetentionRulesMismatch`, no retries). Once the job ran, the field holds the rules
        it used (the repository's; null: it has none), as the rendered field shows them.
    """

    template_fields: Sequence[str] = (
        *BranchwaterGCJobOperator.template_fields,
        "prepare_run",
        "mode",
        "min_age",
        "max_share",
        "only",
        "retention_rules",
    )
    template_fields_renderers = {"retention_rules": "json"}
    overwrite_rtif_after_execution = True

    def __init__(
        self,
        *,
        prepare_run: str,
        mode: str = CLEAN,
        min_age: str | None = None,
        max_share: str | float | None = None,
        only: str | None = None,
        retention_rules: str | dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        with checked_where_declared(self.task_id):
            if not resolved_later(mode):
                gc_mode("mode", mode)
            if not resolved_later(only):
                only_part("only", only)
        self.prepare_run = prepare_run
        self.mode = mode
        self.min_age = min_age
        self.max_share = max_share
        self.only = only
        self.retention_rules = retention_rules

    def job_run_id(self) -> str:
        return self.prepare_run

    def check_run(self, hook: BranchwaterHook) -> None:
        """The prepare run must be finished: the job marks from its manifest."""
        hook.repository(self.repository).uncommitted_gc_run(self.prepare_run)

    def job_arguments(self) -> list[str]:
        mode = gc_mode("mode", self.mode)
        arguments = ["--mode", mode, "--dry-run", "--prepare-run", self.prepare_run]
        if not unset(self.min_age):
            arguments += ["--min-age", str(self.min_age)]
        if not unset(self.max_share):
            arguments += ["--max-share", str(self.max_share)]
        only = only_part("only", self.only)
        if only is not None:
            arguments += ["--only", only]
        return arguments

    def execute(self, context: Context) -> Any:
        with failing_at_once():
            pinned = pinned_rules(self.retention_rules)
            self.retention_rules = self._repository_rules(pinned)
        record = self._mark(context)
        used = record["retention"]
        if "rules" in used:
            rules = GCRules.from_json(used["rules"]) if used["rules"] else None
            with failing_at_once():
                check_pinned(self.repository, pinned, rules, AFTER_MARK)
            self.retention_rules = used["rules"]
        return record

    def _repository_rules(self, pinned: GCRules | None) -> dict[str, Any] | None:
        """The repository's rules as JSON, after checking the run's pin against them."""
        hook = BranchwaterHook(self.branchwater_conn_id)
        try:
            rules = hook.repository(self.repository).gc_rules()
        finally:
            hook.close()
        check_pinned(self.repository, pinned, rules)
        return rules.to_json() if rules else None

    def _mark(self, context: Context) -> dict[str, Any]:
        """The job's mark; a mark whose gate failed is a record too (the gate task refuses)."""
        try:
            record: dict[str, Any] = super().execute(context)
            return record
        except AirflowFailException:
            raise
        except AirflowException:
            summary = self._saved_summary()
            if summary is None or summary.status != GATE_FAILED:
                raise
            self.log.warning("GC run %s is marked, but its quality gate failed", summary.run_id)
            return summary_record(summary)

    def _saved_summary(self) -> RunSummary | None:
        """The run's summary if the mark saved one."""
        hook = BranchwaterHook(self.branchwater_conn_id)
        try:
            return hook.gc_run(self.repository, self.prepare_run)
        except NotFound:
            return None
        finally:
            hook.close()


class BranchwaterGCSweepOperator(BranchwaterGCJobOperator):
    """Sweep: delete what the mark `run_id` (templated) holds, only if its gate passed.
    A sweep that was interrupted resumes where it stopped. With `skip_sweep` true (templated: a
    dry-run param's true or "true") the task is skipped and nothing is deleted. A mark that
    holds no candidates is recorded as swept by the task itself, without a Spark application.
    Returns the run's figures (`summary_record`), `deleted` among them.

    :param run_id: the marked GC run to sweep (templated)
    :param skip_sweep: skip the task, deleting nothing (templated; default False)
    """

    template_fields: Sequence[str] = (
        *BranchwaterGCJobOperator.template_fields,
        "run_id",
        "skip_sweep",
    )

    def __init__(self, *, run_id: str, skip_sweep: bool | str = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_id = run_id
        self.skip_sweep = skip_sweep

    def job_run_id(self) -> str:
        return self.run_id

    def job_arguments(self) -> list[str]:
        return ["--sweep", self.run_id]

    def execute(self, context: Context) -> Any:
        with failing_at_once():
            skip = rendered_flag("skip_sweep", self.skip_sweep)
        if skip:
            raise AirflowSkipException(f"dry run: GC run {self.run_id} is marked, not swept")
        from branchwater.engine.gc.runs.files import nothing_to_delete

        hook = BranchwaterHook(self.branchwater_conn_id)
        try:
            with failing_at_once():
                marked = hook.gc_run(self.repository, self.run_id)
            if nothing_to_delete(marked):
                return summary_record(self._sweep_here(hook))
        finally:
            hook.close()
        return super().execute(context)

    def _sweep_here(self, hook: BranchwaterHook) -> RunSummary:
        from branchwater.engine.gc.runs.config import JobConfig
        from branchwater.engine.gc.runs.sweeps import sweep_without_spark

        self.log.info("GC run %s marked no candidates: sweeping it without Spark", self.run_id)
        repository = hook.repository(self.repository)
        namespace = repository.storage_namespace
        s3 = {k: v for k, v in (hook.s3_options_for(namespace) or {}).items() if v}
        config = JobConfig(
            kv_url=hook.settings.kv_url,
            repository=self.repository,
            sweep=self.run_id,
            s3_options=s3,
            keep_runs=self.kept_runs(),
        )
        return sweep_without_spark(
            repository, config, lambda event: self.log.info("GC job: %s", event)
        )


class BranchwaterGCGateOperator(BranchwaterOperator):
    """The decision between mark and sweep: fails, without retries, unless GC run `run_id`
    (templated) finished its mark and every expectation of its Great Expectations gate
    held. The failure names each failed expectation with GX's figures and the report.
    Returns the run's figures (`summary_record`).

    :param run_id: the marked GC run (templated)
    """

    template_fields: Sequence[str] = ("repository", "run_id")

    def __init__(self, *, run_id: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_id = run_id

    def execute_on(self, repo: Repository, context: Context) -> dict[str, Any]:
        summary = self.hook.gc_run(repo.name, self.run_id)
        if summary.status == FAILED:
            raise AirflowFailException(
                f"GC run {summary.run_id} did not finish its mark: {summary.error}; "
                "nothing was deleted"
            )
        if not summary.gate_success:
            failed = "; ".join(_expectation_text(e) for e in summary.failed_expectations())
            raise AirflowFailException(
                f"GC run {summary.run_id} failed its quality gate, nothing was deleted: "
                f"{failed or 'no expectation recorded'}. Report: {summary.report_uri}"
            )
        candidates = summary.volume("candidates")
        self.log.info(
            "GC run %s passed its quality gate: %d candidates, %d bytes",
            summary.run_id,
            candidates.objects,
            candidates.bytes,
        )
        return summary_record(summary)


def _expectation_text(expectation: Expectation) -> str:
    """`suite: type(kwargs) observed figures`, GX's own names and numbers."""
    kwargs = ", ".join(f"{k}={v!r}" for k, v in sorted(expectation.kwargs.items()))
    figures = ", ".join(f"{k}={v!r}" for k, v in expectation.observed.items()) or "nothing"
    return f"{expectation.suite}: {expectation.type}({kwargs}) observed {figures}"


class BranchwaterGCReportOperator(BranchwaterOperator):
    """Points at GC run `run_id`'s (templated) report: returns the run's figures
    (`summary_record`, the report's URI under `report`) and shows the report as an extra
    link.

    :param run_id: the GC run (templated)
    """

    template_fields: Sequence[str] = ("repository", "run_id")
    operator_extra_links = (BranchwaterGCReportLink(),)

    def __init__(self, *, run_id: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.run_id = run_id
        self.report_url = ""

    def execute_on(self, repo: Repository, context: Context) -> dict[str, Any]:
        summary = self.hook.gc_run(repo.name, self.run_id)
        record = summary_record(summary)
        self.report_url = summary.report_uri
        self.log.info(
            "GC run %s (%s): %d candidates, %d deleted; report at %s",
            summary.run_id,
            summary.status,
            record["candidates"],
            record["deleted"],
            summary.report_uri,
        )
        return record
