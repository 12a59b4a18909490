"""Airflow tasks stopped inside the engine's operations (issue 43, item 5): commit, merge and
compaction tasks that fail at a failpoint of their operation, or whose process is killed
there, end their DAG run `success` once Airflow runs them again, with the lake exactly as a
run without the fault leaves it (no commit twice, nothing staged left behind).

`dag.test()` runs tasks in its own process, so a task armed with `raise` fails its try and
Airflow retries it in the same run (`retries=1`); a `kill` takes the whole `dag.test()` with
it, so that test runs it in a child process (SIGKILL at the failpoint, armed by the child's
environment) and then runs the DAG run again under the same run id, as clearing a run whose
worker died does.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from branchwater.engine import Repository, failpoints
from branchwater.engine.failpoints import FailpointHit

if TYPE_CHECKING:
    from airflow.sdk import DAG

    from tests.plugin.conftest import LakeConnection, RunDag

pytestmark = [pytest.mark.airflow, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]
DAG_ID = "branchwater_task_kills"
REFERENCE, FAULTY = (datetime(2026, 11, day, tzinfo=timezone.utc) for day in (24, 25))
TASKS = ("commit", "merge", "compact")
RAISED_AT = ("commit.after_seal", "merge.before_set", "compaction.before_install")
"""One point of each task's operation, each failing that task's first try."""
KILLED_AT = "commit.after_set"
"""The commit landed, its task died before Airflow heard of it: the rerun must find it."""
CHILD_TIMEOUT_S = 300


def task_kills_dag() -> DAG:
    """Commit `feature`, merge it into `main`, compact `side`; one retry each, at once."""
    from airflow.sdk import DAG

    from branchwater.plugin.operators import (
        BranchwaterCommitOperator,
        BranchwaterCompactOperator,
        BranchwaterMergeOperator,
    )

    repository = "{{ params.repository }}"
    retry = {"retries": 1, "retry_delay": timedelta(0)}
    with DAG(DAG_ID, schedule=None, params={"repository": ""}, default_args=retry) as dag:
        commit = BranchwaterCommitOperator(
            task_id="commit", repository=repository, branch="feature", message="load"
        )
        merge = BranchwaterMergeOperator(
            task_id="merge", repository=repository, source_ref="feature", message="merge"
        )
        compact = BranchwaterCompactOperator(
            task_id="compact", repository=repository, branch="side"
        )
        commit >> merge >> compact
    return dag


def prepared(lake_conn: LakeConnection, prefix: str) -> Repository:
    """`main` with a commit of its own beside `feature`'s staged rows (so the merge is a real
    one), and `side` with a staged write and a staged delete to compact."""
    repo = lake_conn.create_repository(prefix)
    main = repo.branch("main")
    main.upload("old.csv", b"old")
    main.commit("base")
    feature = repo.create_branch("feature", "main")
    side = repo.create_branch("side", "main")
    main.upload("main.csv", b"main")
    main.commit("main moves")
    feature.upload("feature.csv", b"feature")
    side.upload("side.csv", b"side")
    side.delete("old.csv")
    return repo


def lake_state(repo: Repository) -> dict[str, Any]:
    """What the DAG changed, without ids (commit metadata names the run and the try)."""
    side = repo.branch("side")
    return {
        "main": {e.path: repo.ref("main").read(e.path) for e in repo.ref("main").list()},
        "main commits": [c.message for c in repo.log("main", first_parent=True)],
        "feature staged": [c.path for c in repo.branch("feature").uncommitted()],
        "side": {e.path: side.read(e.path) for e in side.list()},
        "side compacted": side.compaction_status().compacted,
        "side sealed": side.compaction_status().sealed_tokens,
    }


def run_once(repository: str, logical_date: str) -> str:
    """One `dag.test()` of the DAG on `repository` (in the child that may be killed)."""
    from branchwater.demo.dag_run import run_dag

    result = run_dag(
        task_kills_dag(),
        {"repository": repository},
        logical_date=datetime.fromisoformat(logical_date),
    )
    return result.state


def fails_once(point: str) -> Callable[[], None]:
    """A failpoint action raising the first time only, as a killed worker fails one try."""
    fired: list[str] = []

    def action() -> None:
        if not fired:
            fired.append(point)
            raise FailpointHit(f"failpoint {point} fired")

    return action


def test_tasks_failing_at_each_operations_failpoint_are_retried_to_the_same_lake(
    run_dag: RunDag, lake_conn: LakeConnection
) -> None:
    reference = prepared(lake_conn, "ref-")
    assert (
        run_dag(task_kills_dag(), {"repository": reference.name}, logical_date=REFERENCE).state
        == "success"
    )
    faulty = prepared(lake_conn, "faulty-")
    with (
        failpoints.armed(RAISED_AT[0], fails_once(RAISED_AT[0])),
        failpoints.armed(RAISED_AT[1], fails_once(RAISED_AT[1])),
        failpoints.armed(RAISED_AT[2], fails_once(RAISED_AT[2])),
    ):
        result = run_dag(task_kills_dag(), {"repository": faulty.name}, logical_date=FAULTY)
    assert result.state == "success", result.states
    assert {task: result.tries[task] for task in TASKS} == dict.fromkeys(TASKS, 2)
    assert lake_state(faulty) == lake_state(reference)
    assert lake_state(faulty)["side compacted"]


def test_a_task_process_killed_after_its_commit_landed_reruns_to_the_same_lake(
    run_dag: RunDag, lake_conn: LakeConnection
) -> None:
    reference = prepared(lake_conn, "ref-")
    assert (
        run_dag(task_kills_dag(), {"repository": reference.name}, logical_date=REFERENCE).state
        == "success"
    )
    killed = prepared(lake_conn, "killed-")
    script = (
        "import sys\nfrom tests.dags.test_task_kills import run_once\nrun_once(*sys.argv[1:])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, killed.name, FAULTY.isoformat()],
        env={**os.environ, failpoints.ENV: f"{KILLED_AT}=kill"},
        cwd=ROOT,
        capture_output=True,
        timeout=CHILD_TIMEOUT_S,
    )
    assert done.returncode == -9, done.stderr.decode()[-3000:]
    assert killed.branch("feature").head().message == "load"
    assert lake_state(killed)["main commits"] == lake_state(reference)["main commits"][1:]
    rerun = run_dag(task_kills_dag(), {"repository": killed.name}, logical_date=FAULTY)
    assert rerun.state == "success", rerun.states
    assert lake_state(killed) == lake_state(reference)
