"""`make stack` end to end: the shipped DAGs run through Airflow's REST API on the stack.

The stack is the session's `stack` fixture (PostgreSQL, SeaweedFS, Spark standalone, Airflow's
four processes); these tests trigger DAGs the way a user would, from outside, and check what
landed in the lake. The fixture asserts at the end that no process of the stack survives.
"""

from __future__ import annotations

import io
import json

import pyarrow.parquet as pq
import pytest

from branchwater.demo.main_job import gc_task
from branchwater.engine import Lake
from branchwater.stack import StackHandle
from branchwater.stack.backends import EXAMPLE_REPOSITORY
from tests.fixtures.stack import stack_log, task_errors
from tests.helpers.airflow import GC_TASKS, AirflowClient

pytestmark = [
    pytest.mark.slow,
    pytest.mark.postgres,
    pytest.mark.s3,
    pytest.mark.spark,
    pytest.mark.airflow,
    pytest.mark.timeout(1800),
]

PARSE_TIMEOUT = 120.0
RUN_TIMEOUT = 900.0
"""A safety net for a stuck run, far above what a run takes."""
REPOSITORY = EXAMPLE_REPOSITORY
"""The one the init step created with `main` protected: the run must pass its checks."""
PARTITIONS = ["north", "south"]
ROWS = 40


def run_dag(stack: StackHandle, dag_id: str, conf: dict[str, object]) -> dict[str, str]:
    """Trigger `dag_id` through the REST API, wait for it to succeed; its task states. (The
    test stack makes no scheduled runs, which would go ahead of it.)"""
    client = AirflowClient(stack.airflow_url, *stack.admin)
    client.wait_for_dag(dag_id, PARSE_TIMEOUT)
    run_id = client.trigger(dag_id, conf)
    client.unpause(dag_id)
    state = client.wait_for_run(dag_id, run_id, RUN_TIMEOUT)
    assert state == "success", (
        f"{dag_id} run {run_id} ended {state}: {client.failed_tasks(dag_id, run_id)}\n"
        + "\n".join(task_errors(stack, dag_id))
        + f"\nscheduler log:\n{stack_log(stack, 'airflow-scheduler')}"
    )
    return client.task_states(dag_id, run_id)


@pytest.fixture(scope="module")
def etl_repository(stack: StackHandle) -> str:
    """The example ETL run once on the stack's Spark cluster; the repository it loaded."""
    conf = {
        "repository": REPOSITORY,
        "partitions": PARTITIONS,
        "rows": ROWS,
        "spark_master": stack.spark_master_url,
    }
    run_dag(stack, "branchwater_example_etl", conf)
    return REPOSITORY


def test_example_etl_lands_every_partition_on_main(stack: StackHandle, etl_repository: str) -> None:
    with Lake.connect(stack.kv_url, s3_options=stack.s3.options) as lake:
        repo = lake.repository(etl_repository)
        assert repo.storage_namespace == f"{stack.config.default_namespace}/{etl_repository}"
        main = repo.branch("main")
        for partition in PARTITIONS:
            entries = list(main.list(prefix=f"sales/partition={partition}/"))
            assert entries, f"nothing of {partition} on main"
            rows = sum(pq.read_table(io.BytesIO(main.read(e.path))).num_rows for e in entries)
            assert rows == ROWS
        assert [b.name for b in repo.branches()] == ["main"]
        (rule,) = repo.protections()
        assert (rule.pattern, rule.no_direct_writes, rule.required_checks) == (
            "main",
            True,
            ("quality",),
        )
        merges = [c for c in repo.log("main") if len(c.parents) > 1]
        assert len(merges) == len(PARTITIONS)
        for merge in merges:
            assert [(c.name, c.passed) for c in repo.checks(merge.parents[1])] == [
                ("quality", True)
            ]
    prefix = f"{stack.config.namespace_prefix}/{etl_repository}/data/"
    listed = stack.s3.client().list_objects_v2(Bucket=stack.config.bucket, Prefix=prefix)
    assert listed["KeyCount"] >= len(PARTITIONS)


def test_gc_clean_saves_its_report_in_the_lake(stack: StackHandle, etl_repository: str) -> None:
    # A dry run: the mark and its gate run as Spark jobs on the cluster; the sweep, one more
    # Spark job deleting nothing young enough to keep, would only lengthen the test.
    conf = {"repositories": [etl_repository], "dry_run": True}
    states = run_dag(stack, "branchwater_gc_clean", conf)
    assert states == {
        "repositories[-1]": "success",
        **{gc_task(task): "success" for task in GC_TASKS},
        gc_task("sweep"): "skipped",
    }
    client = stack.s3.client()
    prefix = f"{stack.config.namespace_prefix}/{etl_repository}/_branchwater/retention/gc/"
    keys = [
        item["Key"]
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=stack.config.bucket, Prefix=prefix
        )
        for item in page.get("Contents", [])
    ]
    summaries = [key for key in keys if key.endswith("/summary.json")]
    assert summaries, f"no GC summary under {prefix}: {keys}"
    assert any(key.endswith("/report.html") for key in keys)
    summary = json.loads(
        client.get_object(Bucket=stack.config.bucket, Key=summaries[0])["Body"].read()
    )
    assert summary["repository"] == etl_repository
    assert (summary["mode"], summary["status"], summary["gate_success"]) == (
        "clean",
        "marked",
        True,
    )
