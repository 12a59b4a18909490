"""`branchwater_example_etl`, run for real by `dag.test()` with Spark local and Great
Expectations: partitions load on their own branches and all land on a `main` protected
with the `quality` check required (each commit carries its validation as that check);
failed validation stops a partition before its commit.

`dag.test()` runs tasks in this process, so the DAG's writers use the session's Spark."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from branchwater.demo.airflow_home import DAGS_FOLDER
from tests.helpers.servers import unique_name
from tests.plugin.conftest import LakeConnection, RunDag

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.airflow, pytest.mark.spark, pytest.mark.slow]


def example_etl() -> object:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=DAGS_FOLDER / "branchwater_example_etl.py")
    assert bag.import_errors == {}
    return bag.dags["branchwater_example_etl"]


@pytest.mark.parametrize(
    "kv_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_four_partitions_load_and_merge_into_main(
    run_dag: RunDag, lake_conn: LakeConnection, spark: SparkSession
) -> None:
    repository = unique_name("etl-")
    partitions = ["north", "south", "east", "west"]
    namespace = f"{lake_conn.namespace}/{repository}"
    protected = lake_conn.lake.create_repository(repository, storage_namespace=namespace)
    protected.protect("main", no_direct_writes=True, required_checks=["quality"])

    result = run_dag(
        example_etl(), {"repository": repository, "partitions": partitions, "rows": 25}
    )

    assert result.state == "success", result.states
    repo = lake_conn.lake.repository(repository)
    assert repo.storage_namespace == f"{lake_conn.namespace}/{repository}"
    main = repo.branch("main")
    objects = [e.path for e in main.list(prefix="sales/")]
    assert {path.rsplit("/", 1)[0] for path in objects} == {
        f"sales/partition={p}" for p in partitions
    }
    assert result.value("report") == {"commit_id": main.commit_id, "objects": objects}
    assert [b.name for b in repo.branches()] == ["main"]
    loads = [c for c in repo.log("main") if c.metadata.get("airflow.task_id") == "load.commit"]
    assert sorted(c.metadata["partition"] for c in loads) == sorted(partitions)
    assert sorted(c.metadata["airflow.map_index"] for c in loads) == ["0", "1", "2", "3"]
    for i in range(4):
        assert result.states[f"load.merge[{i}]"] == "success"
        validation = result.value(f"load.validate[{i}]")
        assert (validation["rows"], validation["success_percent"]) == (25, 100.0)
    for commit in loads:
        (check,) = repo.checks(commit.id)
        assert (check.name, check.passed, check.details["rows"]) == ("quality", True, 25)


def test_failed_validation_stops_the_partition_before_its_commit(
    run_dag: RunDag,
    lake_conn: LakeConnection,
    spark: SparkSession,
    capfd: pytest.CaptureFixture[str],
) -> None:
    repository = unique_name("etl-")

    result = run_dag(
        example_etl(),
        {"repository": repository, "partitions": ["north"], "rows": 10, "bad_rows": 2},
    )

    assert result.state == "failed"
    assert result.states["load.validate[0]"] == "failed"
    for task in ("commit", "merge", "delete_branch"):
        assert result.states[f"load.{task}[0]"] == "upstream_failed"
    assert "partition 'north'" in (output := capfd.readouterr().out)
    assert "expect_column_values_to_be_between (2)" in output
    repo = lake_conn.lake.repository(repository)
    assert list(repo.branch("main").list(prefix="sales/")) == []
    (kept,) = [b for b in repo.branches() if b.name != "main"]
    assert {c.path.rsplit("/", 1)[0] for c in kept.uncommitted()} == {"sales/partition=north"}
