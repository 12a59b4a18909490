"""The GC job operators refuse what a retry cannot fix before `spark-submit` starts, without
their retries: an unknown repository or run, and arguments the job would refuse, when the
DAG is parsed where they are not templated, when the task runs where they are."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from airflow.sdk import DAG

from branchwater.engine import InvalidArgument, Repository
from branchwater.plugin.operators import (
    BranchwaterGCJobOperator,
    BranchwaterGCMarkOperator,
    BranchwaterGCSweepOperator,
)
from tests.plugin.conftest import LakeConnection, RunDag

RUN = "18f2a9c3b7d1-a1b2c3"
RETRIED: dict[str, Any] = {"retries": 2, "retry_delay": timedelta(seconds=0)}


class DryRunJob(BranchwaterGCJobOperator):
    """The base GC job operator as a subclass completes it: a dry-run mark."""

    def job_arguments(self) -> list[str]:
        return ["--dry-run"]

    def run_id(self) -> str:
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
