"""`branchwater_gc_clean` and `branchwater_gc_optimized`, run for real by `dag.test()`: the
mark and the sweep are `spark-submit` runs of the GC job on `local[*]` (no Spark connection
is defined), the gate and the report read what the job saved.

Each `spark-submit` starts a JVM, so this file runs one such run, a dry one: two
repositories on PostgreSQL, one whose gate fails and one whose gate passes, with a KV
password that must stay hidden. The happy path (a clean run and an optimized run of every
repository, each with its sweep) is the main job's (tests/demo), and a dry run the stack's
(tests/stack)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import pytest

from branchwater.demo.airflow_home import DAGS_FOLDER
from branchwater.demo.main_job import gc_task
from branchwater.engine import Lake, NotFound, Repository
from tests.helpers.airflow import GC_TASKS
from tests.helpers.gc import data_objects, put_garbage
from tests.plugin.conftest import LakeConnection, RunDag, RunResult, set_connection

if TYPE_CHECKING:
    from airflow.sdk import DAG

pytestmark = [
    pytest.mark.airflow,
    pytest.mark.spark,
    pytest.mark.slow,
    pytest.mark.timeout(900),
    pytest.mark.usefixtures("spark_submit_conf"),
]

PASSWORD = "Gc-Secret-KV-pw"


def gc_dag(dag_id: str) -> DAG:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=DAGS_FOLDER / "branchwater_gc.py")
    assert bag.import_errors == {}
    dag: DAG = bag.dags[dag_id]
    return dag


@dataclass
class GCHistory:
    """A repository whose objects are committed, staged, or garbage no entry names."""

    lake: Lake
    repo: Repository
    keep: set[str]
    garbage: set[str]

    def objects(self) -> set[str]:
        return set(data_objects(self.lake, self.repo))


def history(lake_conn: LakeConnection, kept: int, garbage: int) -> GCHistory:
    """`kept` objects half committed, half staged on a branch; `garbage` unreferenced ones."""
    repo = lake_conn.create_repository("gc-")
    main = repo.branch("main")
    keep = {main.upload(f"committed/{i}.csv", f"c{i}".encode()).address for i in range(kept // 2)}
    main.commit("committed")
    etl = repo.create_branch("etl")
    keep |= {etl.upload(f"staged/{i}.csv", f"s{i}".encode()).address for i in range(kept // 2)}
    return GCHistory(lake_conn.lake, repo, keep, set(put_garbage(lake_conn.lake, repo, garbage)))


def assert_tasks(result: RunResult, index: int, **states: str) -> None:
    """The states of the `index`-th repository's tasks: `states`, else success."""
    assert {task: result.states[gc_task(task, index)] for task in GC_TASKS} == {
        task: states.get(task, "success") for task in GC_TASKS
    }


@pytest.mark.postgres
@pytest.mark.parametrize("kv_url", ["postgres"], indirect=True)
def test_a_failed_gate_stops_its_repository_before_the_sweep_and_no_other(
    run_dag: RunDag,
    lake_conn: LakeConnection,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    secret_url = lake_conn.kv_url.replace("postgres@", f"postgres:{PASSWORD}@", 1)
    assert PASSWORD in secret_url
    set_connection(
        monkeypatch,
        "branchwater_default",
        "branchwater",
        password=secret_url,
        extra=lake_conn.extra,
    )
    mostly_garbage = history(lake_conn, kept=2, garbage=4)
    little_garbage = history(lake_conn, kept=8, garbage=2)
    conf = {
        "repositories": [mostly_garbage.repo.name, little_garbage.repo.name],
        "min_age": "0s",
        "max_share": 0.4,
        "dry_run": True,
        "keep_runs": 3,
    }

    result = run_dag(gc_dag("branchwater_gc_clean"), conf)

    captured = capfd.readouterr()
    output = captured.out + captured.err
    assert result.state == "failed"
    assert result.value("repositories") == conf["repositories"]
    assert_tasks(result, 0, gate="failed", sweep="upstream_failed", report="upstream_failed")
    assert result.tries[gc_task("gate", 0)] == 1
    assert mostly_garbage.objects() == mostly_garbage.keep | mostly_garbage.garbage
    assert result.value(gc_task("mark", 0))["status"] == "gate_failed"
    run_id = result.value(gc_task("prepare", 0))["run_id"]
    assert f"GC run {run_id} failed its quality gate, nothing was deleted" in output
    assert (
        "gc-candidates: expect_table_row_count_to_be_between(max_value=2, min_value=0) "
        "observed observed_value=4. Report: file://" in output
    )
    assert result.rendered[gc_task("mark", 0)]["max_share"] == "0.4"
    assert result.rendered[gc_task("mark", 0)]["keep_runs"] == "3"

    assert_tasks(result, 1, sweep="skipped")
    assert result.value(gc_task("report", 1))["candidates"] == 2
    assert little_garbage.objects() == little_garbage.keep | little_garbage.garbage

    assert "Spark-Submit cmd: spark-submit --master local[*]" in output
    assert f"--name branchwater_gc_clean-mark-{little_garbage.repo.name}" in output
    assert "--kv-env BRANCHWATER_GC_KV_URL" in output
    assert "--keep-runs 3" in output
    assert PASSWORD not in output
    assert PASSWORD not in repr(result.rendered)
    assert PASSWORD not in repr(result.xcoms)


def test_a_repository_that_does_not_exist_fails_the_run_before_any_gc(
    run_dag: RunDag, lake_conn: LakeConnection, capfd: pytest.CaptureFixture[str]
) -> None:
    lake_conn.create_repository("gc-")

    result = run_dag(gc_dag("branchwater_gc_optimized"), {"repositories": ["no-such-repo"]})

    output = "".join(capfd.readouterr())
    assert result.state == "failed"
    assert result.states["repositories"] == "failed"
    collect = {t: state for t, state in result.states.items() if t.startswith("collect.")}
    assert collect == {f"collect.{task}": "upstream_failed" for task in GC_TASKS}
    assert NotFound.__name__ in output and "no-such-repo" in output
