"""`BranchwaterCommitSensor` in poke, reschedule and deferrable modes, through `dag.test()`
(which runs a deferred task's trigger in line), while another thread commits once the
sensor waits."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import pytest
from airflow.sdk import DAG, PokeReturnValue

from branchwater.engine import Repository
from branchwater.plugin.sensors import BranchwaterCommitSensor
from tests.plugin.conftest import LakeConnection, RunDag

if TYPE_CHECKING:
    from airflow.sdk import Context

pytestmark = [pytest.mark.airflow, pytest.mark.slow, pytest.mark.timeout(120)]


class SignallingSensor(BranchwaterCommitSensor):
    """The sensor, telling the test when it has seen the branch's HEAD."""

    poked = threading.Event()

    def poke(self, context: Context) -> PokeReturnValue:
        result = super().poke(context)
        self.poked.set()
        return result


@contextmanager
def commit_once_poked(repo: Repository) -> Iterator[list[str]]:
    """Commit to `main` from another thread once the sensor has poked; yields (a list that
    then holds) the new commit's id."""
    made: list[str] = []
    SignallingSensor.poked.clear()

    def commit() -> None:
        if not SignallingSensor.poked.wait(timeout=90):
            return
        time.sleep(1.0)
        main = repo.branch("main")
        main.upload("later.csv", b"later")
        made.append(main.commit("later").id)

    thread = threading.Thread(target=commit)
    thread.start()
    try:
        yield made
    finally:
        SignallingSensor.poked.set()
        thread.join()


@pytest.mark.parametrize(
    "mode",
    [
        {"mode": "poke"},
        {"mode": "reschedule"},
        pytest.param({"deferrable": True}, id="deferrable"),
    ],
    ids=lambda mode: str(next(iter(mode.values()))),
)
def test_the_sensor_returns_the_first_new_commit(
    run_dag: RunDag,
    lake_conn: LakeConnection,
    repo: Repository,
    mode: dict[str, object],
    caplog: pytest.LogCaptureFixture,
) -> None:
    with DAG(f"bw_sensor_{next(iter(mode.values()))}", schedule=None) as dag:
        SignallingSensor(
            task_id="wait",
            repository="{{ params.repository }}",
            branch="main",
            poke_interval=0.5,
            timeout=60,
            params={"repository": repo.name},
            **mode,  # type: ignore[arg-type]
        )

    with commit_once_poked(repo) as made:
        result = run_dag(dag)

    assert result.state == "success", result.states
    assert result.value("wait") == made[0]
    assert result.rendered["wait"]["repository"] == repo.name
    deferred = "[DAG TEST] running trigger in line" in caplog.text
    assert deferred == bool(mode.get("deferrable"))


def test_a_commit_after_the_given_one_ends_the_wait_at_once(
    run_dag: RunDag, lake_conn: LakeConnection, repo: Repository
) -> None:
    head = repo.branch("main").commit_id
    with DAG("bw_sensor_since", schedule=None) as dag:
        BranchwaterCommitSensor(
            task_id="wait",
            repository=repo.name,
            branch="main",
            since_commit="main~1",
            deferrable=True,
            timeout=5,
        )

    result = run_dag(dag)

    assert result.state == "success", result.states
    assert result.value("wait") == head


def test_an_unknown_branch_fails_the_sensor(
    run_dag: RunDag,
    lake_conn: LakeConnection,
    repo: Repository,
    capfd: pytest.CaptureFixture[str],
) -> None:
    with DAG("bw_sensor_unknown", schedule=None) as dag:
        BranchwaterCommitSensor(
            task_id="wait", repository=repo.name, branch="nowhere", deferrable=True, timeout=5
        )

    result = run_dag(dag)

    assert result.states == {"wait": "failed"}
    assert f"branch 'nowhere' not found in repository '{repo.name}'" in capfd.readouterr().out
