"""`BranchwaterCommitSensor` and `BranchwaterCompactionSensor` in poke, reschedule and
deferrable modes, through `dag.test()` (which runs a deferred task's trigger in line), while
another thread changes the branch once the sensor waits."""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import pytest
from airflow.sdk import DAG, PokeReturnValue

from branchwater.engine import Repository
from branchwater.plugin.operators.base import InvalidOperatorArgument
from branchwater.plugin.sensors import (
    BranchwaterBranchSensor,
    BranchwaterCommitSensor,
    BranchwaterCompactionSensor,
)
from tests.plugin.conftest import LakeConnection, RunDag

if TYPE_CHECKING:
    from airflow.sdk import Context

pytestmark = [pytest.mark.airflow, pytest.mark.slow, pytest.mark.timeout(120)]


POKED = threading.Event()
"""Set by the signalling sensors once they have looked at the branch."""


class SignallingSensor(BranchwaterCommitSensor):
    """The commit sensor, telling the test when it has seen the branch's HEAD."""

    def poke(self, context: Context) -> PokeReturnValue:
        result = super().poke(context)
        POKED.set()
        return result


class SignallingCompactionSensor(BranchwaterCompactionSensor):
    """The compaction sensor, telling the test when it has seen the branch's figures."""

    def poke(self, context: Context) -> PokeReturnValue:
        result = super().poke(context)
        POKED.set()
        return result


@contextmanager
def once_poked(change: Callable[[], Any]) -> Iterator[list[Any]]:
    """Call `change` from another thread once a sensor has poked; yields (a list that then
    holds) what it returned."""
    made: list[Any] = []
    POKED.clear()

    def later() -> None:
        if not POKED.wait(timeout=90):
            return
        time.sleep(1.0)
        made.append(change())

    thread = threading.Thread(target=later)
    thread.start()
    try:
        yield made
    finally:
        POKED.set()
        thread.join()


def commit_later(repo: Repository) -> Callable[[], str]:
    def commit() -> str:
        main = repo.branch("main")
        main.upload("later.csv", b"later")
        return main.commit("later").id

    return commit


MODES = pytest.mark.parametrize(
    "mode",
    [
        {"mode": "poke"},
        {"mode": "reschedule"},
        pytest.param({"deferrable": True}, id="deferrable"),
    ],
    ids=lambda mode: str(next(iter(mode.values()))),
)


def deferred_as_asked(caplog: pytest.LogCaptureFixture, mode: dict[str, object]) -> bool:
    """Whether the sensor deferred exactly when its `mode` asked it to: `dag.test()` logs
    running a trigger in line."""
    deferred = "[DAG TEST] running trigger in line" in caplog.text
    return deferred == bool(mode.get("deferrable"))


@MODES
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

    with once_poked(commit_later(repo)) as made:
        result = run_dag(dag)

    assert result.state == "success", result.states
    assert result.value("wait") == made[0]
    assert result.rendered["wait"]["repository"] == repo.name
    assert deferred_as_asked(caplog, mode)


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


def test_an_unknown_branch_or_repository_fails_the_sensor_without_retries(
    run_dag: RunDag,
    lake_conn: LakeConnection,
    repo: Repository,
    capfd: pytest.CaptureFixture[str],
) -> None:
    retried = {"retries": 2, "retry_delay": timedelta(seconds=0), "timeout": 5}
    with DAG("bw_sensor_unknown", schedule=None) as dag:
        BranchwaterCommitSensor(
            task_id="wait", repository=repo.name, branch="nowhere", deferrable=True, **retried
        )
        BranchwaterCommitSensor(task_id="poke", repository="no-repo", branch="main", **retried)

    result = run_dag(dag)

    assert result.states == {"wait": "failed", "poke": "failed"}
    assert result.tries == {"wait": 1, "poke": 1}
    output = capfd.readouterr().out
    assert f"branch 'nowhere' not found in repository '{repo.name}'" in output
    assert "repository 'no-repo' not found" in output


@MODES
def test_the_compaction_sensor_returns_the_figures_once_compaction_is_due(
    run_dag: RunDag,
    lake_conn: LakeConnection,
    repo: Repository,
    mode: dict[str, object],
    caplog: pytest.LogCaptureFixture,
) -> None:
    etl = repo.create_branch("etl")
    for i in range(3):
        etl.upload(f"{i}.csv", b"x")
    etl.commit("three")
    etl.delete("0.csv")

    def delete_two_more() -> None:
        etl.delete("1.csv")
        etl.delete("2.csv")

    with DAG(f"bw_compaction_sensor_{next(iter(mode.values()))}", schedule=None) as dag:
        SignallingCompactionSensor(
            task_id="due",
            repository=repo.name,
            branch="{{ params.branch }}",
            policy={"max_tombstones": "{{ params.tombstones }}"},
            poke_interval=0.5,
            timeout=60,
            params={"branch": "etl", "tombstones": 3},
            **mode,  # type: ignore[arg-type]
        )

    with once_poked(delete_two_more):
        result = run_dag(dag)

    assert result.state == "success", result.states
    figures = result.value("due")
    assert (figures["due"], figures["staged_tombstones"]) == (True, 3)
    assert figures["reasons"] == ["3 staged tombstones >= 3"]
    assert result.rendered["due"]["branch"] == "etl"
    assert result.rendered["due"]["policy"] == {"max_tombstones": "3"}
    assert deferred_as_asked(caplog, mode)


def test_the_compaction_sensor_fails_or_skips_a_missing_branch_and_says_why(
    run_dag: RunDag,
    lake_conn: LakeConnection,
    repo: Repository,
    capfd: pytest.CaptureFixture[str],
) -> None:
    names = {"repository": repo.name, "timeout": 0}
    with DAG("bw_compaction_sensor_failures", schedule=None) as dag:
        BranchwaterCompactionSensor(task_id="gone", branch="gone", **names)
        BranchwaterCompactionSensor(task_id="gone_ok", branch="gone", missing_ok=True, **names)
        BranchwaterCompactionSensor(task_id="gone_soft", branch="gone", soft_fail=True, **names)
        BranchwaterCommitSensor(
            task_id="gone_soft_deferrable", branch="gone", soft_fail=True, deferrable=True, **names
        )
        BranchwaterCommitSensor(task_id="gone_never", branch="gone", never_fail=True, **names)
        BranchwaterCommitSensor(
            task_id="gone_never_deferrable",
            branch="gone",
            never_fail=True,
            deferrable=True,
            **names,
        )
        BranchwaterCompactionSensor(
            task_id="bad_policy", branch="main", policy={"max_tombstones": "many"}, **names
        )
        BranchwaterCompactionSensor(
            task_id="not_due", branch="main", soft_fail=True, poke_interval=0, **names
        )

    result = run_dag(dag)

    assert result.states == {
        "gone": "failed",
        "gone_ok": "skipped",
        "gone_soft": "skipped",
        "gone_soft_deferrable": "skipped",
        "gone_never": "skipped",
        "gone_never_deferrable": "skipped",
        "bad_policy": "failed",
        "not_due": "skipped",
    }
    output = capfd.readouterr().out
    assert f"branch 'gone' not found in repository '{repo.name}'" in output
    assert "compaction threshold max_tombstones must be a number, not 'many'" in output


def deleting_the_branch(sensor: BranchwaterBranchSensor, found: PokeReturnValue) -> PokeReturnValue:
    """`found`, after deleting the sensor's branch if it was not done: the sensor's next look
    (its next poke, or its trigger's first poll once deferred) finds the branch gone."""
    if not found.is_done:
        sensor.hook.repository(sensor.repository).delete_branch(sensor.branch)
    return found


class CommitSensorLosingItsBranch(BranchwaterCommitSensor):
    def poke(self, context: Context) -> PokeReturnValue:
        return deleting_the_branch(self, super().poke(context))


class CompactionSensorLosingItsBranch(BranchwaterCompactionSensor):
    def poke(self, context: Context) -> PokeReturnValue:
        return deleting_the_branch(self, super().poke(context))


@MODES
def test_a_branch_deleted_while_the_sensor_waits_fails_it_at_once_or_skips_it(
    run_dag: RunDag,
    lake_conn: LakeConnection,
    repo: Repository,
    mode: dict[str, object],
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Deferred, the trigger finds the branch gone; otherwise the next poke does. Either way
    `missing_ok` and `soft_fail` skip, and without them the sensor fails without its retries."""
    tasks = ("commit", "compaction", "skipped", "soft")
    for name in tasks:
        repo.create_branch(name)
    waits = {"poke_interval": 0.1, "timeout": 30, "retries": 2, "retry_delay": timedelta(0)}
    names = {"repository": repo.name, **waits, **mode}
    with DAG(f"bw_sensor_branch_deleted_{next(iter(mode.values()))}", schedule=None) as dag:
        CommitSensorLosingItsBranch(task_id="commit", branch="commit", **names)
        CompactionSensorLosingItsBranch(task_id="compaction", branch="compaction", **names)
        CompactionSensorLosingItsBranch(
            task_id="skipped", branch="skipped", missing_ok=True, **names
        )
        CommitSensorLosingItsBranch(task_id="soft", branch="soft", soft_fail=True, **names)

    result = run_dag(dag)

    assert result.states == {
        "commit": "failed",
        "compaction": "failed",
        "skipped": "skipped",
        "soft": "skipped",
    }
    assert result.tries == dict.fromkeys(tasks, 1)
    assert not set(tasks) & {b.name for b in repo.branches()}
    output = capfd.readouterr().out
    for name in ("commit", "compaction", "skipped"):
        assert f"branch {name!r} not found in repository {repo.name!r}" in output
    assert deferred_as_asked(caplog, mode)


class TriggerWithoutTheConnection(BranchwaterCommitSensor):
    """A deferred commit sensor whose triggerer cannot read the connection its worker read."""

    def trigger_arguments(self) -> dict[str, Any]:
        return {**super().trigger_arguments(), "branchwater_conn_id": "not_in_the_triggerer"}


def test_a_wait_failed_by_what_a_retry_may_fix_is_retried(
    run_dag: RunDag,
    lake_conn: LakeConnection,
    repo: Repository,
    capfd: pytest.CaptureFixture[str],
) -> None:
    with DAG("bw_sensor_trigger_retried", schedule=None) as dag:
        TriggerWithoutTheConnection(
            task_id="wait",
            repository=repo.name,
            branch="main",
            deferrable=True,
            timeout=30,
            retries=1,
            retry_delay=timedelta(0),
        )

    result = run_dag(dag)

    assert result.states == {"wait": "failed"} and result.tries == {"wait": 2}
    output = capfd.readouterr().out
    assert "waiting for a commit on 'main' failed: " in output
    assert "The conn_id `not_in_the_triggerer` isn't defined" in output


@MODES
def test_a_sensor_that_times_out_skips_under_soft_fail_and_fails_without_retries_otherwise(
    run_dag: RunDag,
    lake_conn: LakeConnection,
    repo: Repository,
    mode: dict[str, object],
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Whether it pokes, reschedules or defers. Deferred, the wait ended only when the
    scheduler noticed the deferral's timeout: `dag.test()`, which runs the trigger in line
    and has no scheduler, never ended it, where a poking sensor timed out."""
    waits = {"poke_interval": 0.2, "timeout": 1, "retries": 2, "retry_delay": timedelta(0)}
    names = {"repository": repo.name, "branch": "main", **waits, **mode}
    with DAG(f"bw_sensor_timeout_{next(iter(mode.values()))}", schedule=None) as dag:
        BranchwaterCommitSensor(task_id="commit", **names)
        BranchwaterCommitSensor(task_id="commit_soft", soft_fail=True, **names)
        BranchwaterCompactionSensor(task_id="compaction", **names)
        BranchwaterCompactionSensor(task_id="compaction_soft", soft_fail=True, **names)

    result = run_dag(dag)

    assert result.states == {
        "commit": "failed",
        "commit_soft": "skipped",
        "compaction": "failed",
        "compaction_soft": "skipped",
    }
    assert result.tries == dict.fromkeys(result.states, 1)
    assert "Sensor has timed out" in capfd.readouterr().out
    assert deferred_as_asked(caplog, mode)


def test_under_soft_fail_a_wait_failed_by_what_a_retry_may_fix_is_retried_however_it_waits(
    run_dag: RunDag,
    lake_conn: LakeConnection,
    repo: Repository,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Poking, an error a retry may fix (no connection, the lake unreachable) fails the
    sensor for its retries, `soft_fail` or not (Airflow's sensors skip only a timeout or a
    failure without retries); deferred, such an error ending the trigger skipped it under
    `soft_fail`. `never_fail` skips it either way."""
    retried = {"timeout": 30, "retries": 1, "retry_delay": timedelta(0)}
    names = {"repository": repo.name, "branch": "main", **retried}
    lost = {"branchwater_conn_id": "not_on_the_worker", **names}
    with DAG("bw_sensor_soft_fail_retried", schedule=None) as dag:
        BranchwaterCommitSensor(task_id="poke", soft_fail=True, **lost)
        BranchwaterCommitSensor(task_id="reschedule", mode="reschedule", soft_fail=True, **lost)
        TriggerWithoutTheConnection(task_id="deferrable", deferrable=True, soft_fail=True, **names)
        BranchwaterCommitSensor(task_id="poke_never", never_fail=True, **lost)
        TriggerWithoutTheConnection(
            task_id="deferrable_never", deferrable=True, never_fail=True, **names
        )

    result = run_dag(dag)

    assert result.states == {
        "poke": "failed",
        "reschedule": "failed",
        "deferrable": "failed",
        "poke_never": "skipped",
        "deferrable_never": "skipped",
    }
    assert result.tries == {
        "poke": 2,
        "reschedule": 2,
        "deferrable": 2,
        "poke_never": 1,
        "deferrable_never": 1,
    }
    output = capfd.readouterr().out
    assert "The conn_id `not_on_the_worker` isn't defined" in output
    assert "waiting for a commit on 'main' failed: " in output
    assert "The conn_id `not_in_the_triggerer` isn't defined" in output


IMPOSSIBLE_BRANCHES = ("main..x", "", "a b", "-x")
"""Branch names the engine's rules refuse: no branch can ever have them."""


@pytest.mark.parametrize("sensor", [BranchwaterCommitSensor, BranchwaterCompactionSensor])
def test_a_name_no_branch_or_repository_can_have_is_refused_where_the_sensor_is_declared(
    sensor: type[BranchwaterBranchSensor],
) -> None:
    """It was looked for in the lake when the task ran: not found, or skipped as a branch
    gone under `missing_ok`. A templated name is checked once rendered."""
    for name in IMPOSSIBLE_BRANCHES:
        with pytest.raises(
            InvalidOperatorArgument, match=f"task 'wait': invalid branch name {name!r}"
        ):
            sensor(task_id="wait", repository="sales", branch=name)
    with pytest.raises(
        InvalidOperatorArgument, match="task 'wait': invalid repository name 'Sales'"
    ):
        sensor(task_id="wait", repository="Sales", branch="main")
    sensor(task_id="wait", repository="{{ params.repository }}", branch="{{ params.branch }}")


def test_a_rendered_name_no_branch_or_repository_can_have_fails_the_sensor_at_once(
    run_dag: RunDag,
    lake_conn: LakeConnection,
    repo: Repository,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Poking or deferred, without its retries and before the lake is read; `missing_ok`
    does not skip it as a branch gone, and `soft_fail` skips it as any failure."""
    retried = {"retries": 2, "retry_delay": timedelta(seconds=0), "timeout": 30}
    branch = {"repository": repo.name, "branch": "{{ params.branch }}", **retried}
    with DAG("bw_sensor_impossible_names", schedule=None, params={"branch": "main..x"}) as dag:
        BranchwaterCommitSensor(task_id="poke", **branch)
        BranchwaterCompactionSensor(
            task_id="deferrable", missing_ok=True, deferrable=True, **branch
        )
        BranchwaterCompactionSensor(task_id="soft", soft_fail=True, deferrable=True, **branch)
        BranchwaterCommitSensor(
            task_id="repository",
            repository="{{ params.branch }}",
            branch="main",
            mode="reschedule",
            **retried,
        )

    result = run_dag(dag)

    assert result.states == {
        "poke": "failed",
        "deferrable": "failed",
        "soft": "skipped",
        "repository": "failed",
    }
    assert result.tries == dict.fromkeys(result.states, 1)
    output = capfd.readouterr().out
    assert "InvalidOperatorArgument: task 'poke': invalid branch name 'main..x'" in output
    assert "task 'deferrable': invalid branch name 'main..x'" in output
    assert "task 'repository': invalid repository name 'main..x'" in output


def test_a_deferred_sensor_backs_off_as_a_poking_one_with_exponential_backoff(
    run_dag: RunDag,
    lake_conn: LakeConnection,
    repo: Repository,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Its trigger polled every `poke_interval`, `exponential_backoff` and `max_wait` ignored.
    A poking sensor's waits from 1 s, at most 2 s, are 1, 1, 2, 2... (Airflow's backoff
    doubles from half the interval, in whole seconds, at least one)."""
    with DAG("bw_sensor_backoff", schedule=None) as dag:
        BranchwaterCommitSensor(
            task_id="wait",
            repository=repo.name,
            branch="main",
            deferrable=True,
            exponential_backoff=True,
            poke_interval=1,
            max_wait=2,
            timeout=8,
        )

    result = run_dag(dag)

    assert result.states == {"wait": "failed"}
    output = capfd.readouterr().out
    assert "Sensor has timed out" in output
    waits = re.findall(r"Polling branch 'main' again in (\S+)s \(exponential backoff\)", output)
    assert waits[:4] == ["1", "1", "2", "2"], output
