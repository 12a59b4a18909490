"""The GC operators on a real lake: preparation returns where its run is; the job operators
refuse what a retry cannot fix before `spark-submit` starts, without their retries (an unknown
repository or run, a master that would show the KV URL, arguments the job would refuse: when
the DAG is parsed where they are not templated, when the task runs where they are); a sweep
with nothing to delete starts no Spark application."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from airflow.sdk import DAG

from branchwater.engine import InvalidArgument, Repository, Unavailable, failpoints
from branchwater.engine.gc import prepare
from branchwater.engine.gc.runs import files
from branchwater.engine.gc.runs.config import JobConfig
from branchwater.engine.gc.runs.storage import Namespace
from branchwater.plugin.operators import (
    BranchwaterGCJobOperator,
    BranchwaterGCMarkOperator,
    BranchwaterGCSweepOperator,
    BranchwaterPrepareUncommittedOperator,
)
from branchwater.spark_jobs.gc.job import GCJob
from tests.plugin.conftest import NO_RETRY_DELAY, LakeConnection, RunDag, set_connection

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

RUN = "18f2a9c3b7d1-a1b2c3"
RETRIED: dict[str, Any] = {"retries": 2, "retry_delay": timedelta(seconds=0)}


class DryRunJob(BranchwaterGCJobOperator):
    """The base GC job operator as a subclass completes it: a dry-run mark."""

    def job_arguments(self) -> list[str]:
        return ["--dry-run"]

    def job_run_id(self) -> str:
        return RUN


def job_output(capfd: pytest.CaptureFixture[str]) -> str:
    captured = capfd.readouterr()
    return captured.out + captured.err


@pytest.mark.airflow
@pytest.mark.slow
def test_an_unknown_repository_or_run_fails_the_gc_job_at_once_before_spark(
    run_dag: RunDag,
    lake_conn: LakeConnection,
    repo: Repository,
    capfd: pytest.CaptureFixture[str],
) -> None:
    with DAG("bw_gc_not_found", schedule=None) as dag:
        BranchwaterGCSweepOperator(
            task_id="sweep_unknown_run", repository=repo.name, run_id=RUN, **RETRIED
        )
        BranchwaterGCSweepOperator(
            task_id="sweep_unknown_repository", repository="nope", run_id=RUN, **RETRIED
        )
        DryRunJob(task_id="job_unknown_repository", repository="nope", **RETRIED)
        BranchwaterGCMarkOperator(
            task_id="mark_unknown_run", repository=repo.name, prepare_run=RUN, **RETRIED
        )

    result = run_dag(dag)

    tasks = (
        "sweep_unknown_run",
        "sweep_unknown_repository",
        "job_unknown_repository",
        "mark_unknown_run",
    )
    assert result.states == dict.fromkeys(tasks, "failed")
    assert result.tries == dict.fromkeys(tasks, 1)
    output = job_output(capfd)
    assert f"NotFound: GC run {RUN!r} has no summary in {repo.storage_namespace}" in output
    assert "NotFound: repository 'nope' not found" in output
    assert f"NotFound: GC preparation run {RUN!r} has no manifest in " in output
    assert "Spark-Submit cmd" not in output
    assert result.rendered["sweep_unknown_run"]["run_id"] == RUN


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"only": "commited"}, "task 'mark': only must be uncommitted or committed (empty: both)"),
        ({"only": "Committed"}, "task 'mark': only must be uncommitted or committed"),
        ({"mode": "clen"}, "task 'mark': mode must be clean or optimized, not 'clen'"),
    ],
)
def test_a_mark_argument_the_job_would_refuse_fails_where_the_task_is_declared(
    arguments: dict[str, str], message: str
) -> None:
    with pytest.raises(InvalidArgument, match=re.escape(message)):
        BranchwaterGCMarkOperator(task_id="mark", repository="r", prepare_run=RUN, **arguments)


@pytest.mark.airflow
@pytest.mark.slow
def test_a_rendered_mark_argument_the_job_would_refuse_fails_at_once_before_spark(
    run_dag: RunDag,
    lake_conn: LakeConnection,
    repo: Repository,
    capfd: pytest.CaptureFixture[str],
) -> None:
    params = {"only": "commited", "mode": "clen", "min_age": "6x"}
    with DAG("bw_gc_mark_arguments", schedule=None, params=params) as dag:
        for name in params:
            BranchwaterGCMarkOperator(
                task_id=name,
                repository=repo.name,
                prepare_run=RUN,
                **{name: f"{{{{ params.{name} }}}}"},
                **RETRIED,
            )

    result = run_dag(dag)

    assert result.states == dict.fromkeys(params, "failed")
    assert result.tries == dict.fromkeys(params, 1)
    output = job_output(capfd)
    assert "only must be uncommitted or committed (empty: both), not 'commited'" in output
    assert "InvalidArgument: mode must be clean or optimized, not 'clen'" in output
    assert "InvalidArgument: branchwater-gc: argument --min-age: '6x' is not a duration" in output
    assert "Spark-Submit cmd" not in output
    assert result.rendered["only"]["only"] == "commited"


@pytest.mark.airflow
@pytest.mark.slow
def test_a_mark_argument_from_xcom_is_checked_when_the_task_runs(
    run_dag: RunDag,
    lake_conn: LakeConnection,
    repo: Repository,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """An upstream task's value (a `@task`'s result, `.output`) is known only when the mark
    runs: the DAG parses, and a value the job would refuse fails the task at once there,
    before Spark, as a rendered one does."""
    from airflow.sdk import task

    refused = {"mode": "clen", "only": "commited"}
    with DAG("bw_gc_mark_xcom", schedule=None) as dag:

        @task
        def chosen(value: str) -> str:
            return value

        for name, value in refused.items():
            BranchwaterGCMarkOperator(
                task_id=name,
                repository=repo.name,
                prepare_run=RUN,
                **{name: chosen.override(task_id=f"choose_{name}")(value)},
                **RETRIED,
            )

    result = run_dag(dag)

    assert {name: result.states[name] for name in refused} == dict.fromkeys(refused, "failed")
    assert {name: result.tries[name] for name in refused} == dict.fromkeys(refused, 1)
    output = job_output(capfd)
    assert "InvalidArgument: mode must be clean or optimized, not 'clen'" in output
    assert "only must be uncommitted or committed (empty: both), not 'commited'" in output
    assert "Spark-Submit cmd" not in output


@pytest.mark.airflow
@pytest.mark.slow
def test_gc_preparation_returns_where_its_run_is(
    run_dag: RunDag, lake_conn: LakeConnection, repo: Repository
) -> None:
    staged = repo.create_branch("staged")
    staged.upload("pending.csv", b"pending")
    with DAG("bw_gc_prepare", schedule=None, params={"repo": ""}) as dag:
        BranchwaterPrepareUncommittedOperator(task_id="prepare", repository="{{ params.repo }}")

    result = run_dag(dag, {"repo": repo.name})

    assert result.state == "success", result.states
    prepared = result.value("prepare")
    assert prepared["location"].startswith(repo.storage_namespace)
    assert prepared["run_id"] in prepared["location"]
    assert result.rendered["prepare"]["repository"] == repo.name


def test_a_retried_preparation_resumes_the_run_its_first_try_started(
    run_dag: RunDag, lake_conn: LakeConnection, repo: Repository, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first try stops part-way (its worker lost while it scans the second branch): the
    retry carries on the run that try started, from its last file, instead of scanning every
    branch again under a new run."""
    for name in ("a", "b", "c"):
        repo.create_branch(name).upload("x", name.encode())
    monkeypatch.setattr(prepare, "ROW_GROUP_ROWS", 1)
    monkeypatch.setattr(
        prepare._Run,
        "_writer",
        lambda run, stem, first, on_file: prepare._PartWriter(
            run.objects, run.prefix, stem, first, 1, on_file
        ),
    )
    scans: list[int] = []

    def lost_on_the_second_branch() -> None:
        scans.append(len(scans))
        if len(scans) == 2:
            raise Unavailable("the worker was lost")

    with DAG("bw_gc_prepare_retried", schedule=None) as dag:
        BranchwaterPrepareUncommittedOperator(
            task_id="prepare", repository=repo.name, **NO_RETRY_DELAY
        )
    with failpoints.armed("prepare.branch_scan", lost_on_the_second_branch):
        result = run_dag(dag)

    assert result.state == "success", result.states
    assert result.tries["prepare"] == 2
    run_id = result.value("prepare")["run_id"]
    objects = repo.lake.graveler.objects(repo.storage_namespace)
    assert objects.list_folder(prepare.RETENTION_PREFIX.rstrip("/")).directories == [run_id]
    table = prepare.read_run(objects, run_id)
    assert sorted(table.column("branch").to_pylist()) == ["a", "b", "c"]


@pytest.mark.airflow
@pytest.mark.slow
def test_the_gc_job_refuses_a_master_that_would_show_the_kv_url_on_its_command_line(
    run_dag: RunDag,
    lake_conn: LakeConnection,
    repo: Repository,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    set_connection(monkeypatch, "spark_yarn", "spark", host="yarn")
    prepared = repo.prepare_uncommitted_for_gc()
    with DAG("bw_gc_on_yarn", schedule=None) as dag:
        BranchwaterGCMarkOperator(
            task_id="mark",
            repository=repo.name,
            prepare_run=prepared.run_id,
            conn_id="spark_yarn",
            retries=2,
            retry_delay=timedelta(seconds=0),
        )

    result = run_dag(dag)

    assert result.states == {"mark": "failed"}
    assert result.tries == {"mark": 1}, "a refused master fails without its retries"
    output = capfd.readouterr().out
    assert "Spark master 'yarn': spark-submit would put the GC job's environment" in output
    assert "Spark-Submit cmd" not in output


@pytest.mark.airflow
@pytest.mark.slow
@pytest.mark.parametrize(
    ("keep_runs", "message"),
    [
        ("{{ params.keep }}", "keep_runs must be a whole number of runs, not 'all'"),
        (0, "(--keep-runs 1 or more), not 0"),
    ],
)
def test_a_bad_keep_runs_fails_the_gc_job_at_once_before_spark(
    run_dag: RunDag,
    lake_conn: LakeConnection,
    repo: Repository,
    capfd: pytest.CaptureFixture[str],
    keep_runs: str | int,
    message: str,
) -> None:
    with DAG("bw_gc_keep_runs", schedule=None, params={"keep": "all"}) as dag:
        BranchwaterGCMarkOperator(
            task_id="mark",
            repository=repo.name,
            prepare_run="18f2a9c3b7d1-a1b2c3",
            keep_runs=keep_runs,
            retries=2,
        )

    result = run_dag(dag)

    assert result.states == {"mark": "failed"} and result.tries["mark"] == 1
    captured = capfd.readouterr()
    output = captured.out + captured.err
    assert "InvalidArgument: " in output and message in output
    assert "Spark-Submit cmd" not in output


@pytest.mark.airflow
@pytest.mark.slow
@pytest.mark.parametrize(
    ("dry_run", "state"), [(" Yes", "skipped"), ("maybe", "failed"), (None, "failed")]
)
def test_a_sweep_skipped_by_a_rendered_flag_it_cannot_read_fails_at_once_deleting_nothing(
    run_dag: RunDag,
    lake_conn: LakeConnection,
    repo: Repository,
    capfd: pytest.CaptureFixture[str],
    dry_run: str | None,
    state: str,
) -> None:
    """Text that is not a flag is not taken for false: `skip_sweep` stands between a dry run
    and deletes."""
    with DAG("bw_gc_skip_sweep", schedule=None, params={"dry_run": dry_run}) as dag:
        BranchwaterGCSweepOperator(
            task_id="sweep",
            repository=repo.name,
            run_id="18f2a9c3b7d1-a1b2c3",
            skip_sweep="{{ params.dry_run }}",
            retries=2,
        )

    result = run_dag(dag)

    assert result.states == {"sweep": state} and result.tries["sweep"] == 1
    output = capfd.readouterr().out
    if state == "failed":
        shown = repr(str(dry_run))
        assert f"skip_sweep must be True or False (or their text), not {shown}" in output
    assert "Spark-Submit cmd" not in output


@pytest.mark.airflow
@pytest.mark.slow
@pytest.mark.spark
def test_a_sweep_of_a_mark_with_no_candidates_starts_no_spark_application(
    run_dag: RunDag,
    lake_conn: LakeConnection,
    repo: Repository,
    spark: SparkSession,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """It prunes older runs' data as a sweep on Spark does, keeping `keep_runs` (templated)."""
    config = JobConfig(lake_conn.kv_url, repo.name, dry_run=True, min_age=timedelta(0))
    older = GCJob(spark, config).run()
    mark = GCJob(spark, config).run()
    assert mark.volume("candidates").objects == 0
    with DAG("bw_gc_sweep_nothing", schedule=None, params={"keep": "1"}) as dag:
        BranchwaterGCSweepOperator(
            task_id="sweep",
            repository=repo.name,
            run_id=mark.run_id,
            keep_runs="{{ params.keep }}",
        )

    result = run_dag(dag)

    assert result.states == {"sweep": "success"}
    swept = result.value("sweep")
    assert (swept["run_id"], swept["status"], swept["deleted"]) == (mark.run_id, "swept", 0)
    output = capfd.readouterr().out
    assert f"GC run {mark.run_id} marked no candidates: sweeping it without Spark" in output
    assert "Spark-Submit cmd" not in output
    ns = Namespace.of(repo.storage_namespace)
    assert files.read_summary(ns, older.run_id).pruned_at is not None
    assert files.read_summary(ns, mark.run_id).pruned_at is None
