"""`make stack` end to end: the shipped DAGs run through Airflow's REST API on the stack.

The stack is the session's `stack` fixture (PostgreSQL, SeaweedFS, Spark standalone, Airflow's
four processes); these tests trigger DAGs the way a user would, from outside, and check what
landed in the lake. The fixture asserts at the end that no process of the stack survives.
"""

from __future__ import annotations

import io

import pyarrow.parquet as pq
import pytest

from branchwater.engine import Lake
from branchwater.stack import StackHandle
from tests.fixtures.stack import stack_log, task_errors
from tests.helpers import AirflowClient

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
"""A safety net for a stuck run, far above what a run takes (about a minute on an idle machine)."""
ROWS = 40


def run_dag(stack: StackHandle, dag_id: str, conf: dict[str, object]) -> None:
    """Trigger `dag_id` through the REST API and wait for it to succeed."""
    client = AirflowClient(stack.airflow_url, *stack.admin)
    client.wait_for_dag(dag_id, PARSE_TIMEOUT)
    run_id = client.trigger(dag_id, conf)
    state = client.wait_for_run(dag_id, run_id, RUN_TIMEOUT)
    assert state == "success", (
        f"{dag_id} run {run_id} ended {state}: {client.failed_tasks(dag_id, run_id)}\n"
        + "\n".join(task_errors(stack, dag_id))
        + f"\nscheduler log:\n{stack_log(stack, 'airflow-scheduler')}"
    )


def test_example_etl_lands_every_partition_on_main(stack: StackHandle) -> None:
    partitions = ["north", "south"]
    run_dag(
        stack,
        "branchwater_example_etl",
        {
            "repository": "stack-etl",
            "partitions": partitions,
            "rows": ROWS,
            "spark_master": stack.spark_master_url,
        },
    )
    with Lake.connect(stack.kv_url, s3_options=stack.s3.options) as lake:
        repo = lake.repository("stack-etl")
        assert repo.storage_namespace == f"{stack.config.default_namespace}/stack-etl"
        main = repo.branch("main")
        for partition in partitions:
            entries = list(main.list(prefix=f"sales/partition={partition}/"))
            assert entries, f"nothing of {partition} on main"
            rows = sum(pq.read_table(io.BytesIO(main.read(e.path))).num_rows for e in entries)
            assert rows == ROWS
        assert [b.name for b in repo.branches()] == ["main"]
    listed = stack.s3.client().list_objects_v2(
        Bucket=stack.config.bucket, Prefix="lakes/stack-etl/"
    )
    assert listed["KeyCount"] > 0
