"""The KV URL's password never shows in task logs, rendered fields or XCom, including when a
task logs the URL itself or fails to reach the store.

A worker's task logs pass through the Task SDK's log processors, which mask secrets; the
test process logs as the scheduler does, without them. So the DAG runs in a child process
that configures logging as a worker does, and the test reads what it printed and what it
left in the metadata DB.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from branchwater.demo.airflow_home import connection_env
from branchwater.demo.dag_run import collect
from branchwater.engine import Lake
from tests.helpers.servers import unique_name
from tests.plugin.conftest import LINK_TEMPLATE

pytestmark = [pytest.mark.airflow, pytest.mark.slow, pytest.mark.postgres]

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "Sup3r-Secret-KV-pw"
"""PostgreSQL on loopback trusts local users, so it accepts any password: this one only
has to stay out of sight."""

DAG_FILE = """
import logging

from airflow.sdk import DAG, task

from branchwater.plugin.hooks import BranchwaterHook
from branchwater.plugin.operators import (
    BranchwaterCommitOperator,
    BranchwaterCreateBranchOperator,
    BranchwaterMergeOperator,
    BranchwaterUploadOperator,
)


@task
def log_the_url():
    logging.getLogger("etl").warning("careless: %s", BranchwaterHook().settings.kv_url)


names = {"repository": "REPOSITORY"}
with DAG("bw_secrets", schedule=None) as dag:
    (
        BranchwaterCreateBranchOperator(task_id="create", branch="b", **names)
        >> BranchwaterUploadOperator(task_id="upload", branch="b", path="p", data="d", **names)
        >> BranchwaterCommitOperator(task_id="commit", branch="b", message="m", **names)
        >> BranchwaterMergeOperator(task_id="merge", source_ref="b", **names)
        >> log_the_url()
    )
    BranchwaterCreateBranchOperator(
        task_id="unreachable", branch="b", branchwater_conn_id="bw_down", **names
    )
"""

RUN_AS_A_WORKER = """
import sys

from airflow.sdk.log import configure_logging

configure_logging(output=sys.stdout, colored_console_log=False)

from airflow.dag_processing.dagbag import DagBag

from branchwater.demo.dag_run import register

dag = DagBag(dag_folder=sys.argv[1]).dags["bw_secrets"]
register(dag)
print("RUN_ID", dag.test().run_id)
"""


def test_the_kv_password_stays_hidden(
    airflow_home: Path, postgres_url: str, tmp_path: Path
) -> None:
    kv_url = postgres_url.replace("postgres@", f"postgres:{PASSWORD}@", 1)
    assert PASSWORD in kv_url
    name = unique_name("secret-")
    with Lake.connect(kv_url) as lake:
        lake.create_repository(name, (tmp_path / name).as_uri())
    dag_file = tmp_path / "bw_secrets.py"
    dag_file.write_text(DAG_FILE.replace("REPOSITORY", name))
    extra = {"default_namespace": tmp_path.as_uri(), "link_template": LINK_TEMPLATE}
    down = kv_url.replace("127.0.0.1:5432", "127.0.0.1:1")
    env = {
        **os.environ,
        connection_env("branchwater_default"): json_connection(kv_url, extra),
        connection_env("bw_down"): json_connection(down, {}),
    }

    child = subprocess.run(
        [sys.executable, "-c", RUN_AS_A_WORKER, str(dag_file)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )

    logs = child.stdout + child.stderr
    assert child.returncode == 0, logs[-4000:]
    run_id = logs.split("RUN_ID ", 1)[1].split()[0]
    result = collect("bw_secrets", run_id, "")
    assert result.states["merge"] == "success"
    assert result.states["log_the_url"] == "success"
    assert result.states["unreachable"] == "failed"
    assert "careless: ***" in logs
    assert "127.0.0.1:1" in logs
    assert PASSWORD not in logs
    assert PASSWORD not in repr(result.xcoms)
    assert PASSWORD not in repr(result.rendered)


def json_connection(kv_url: str, extra: dict[str, str]) -> str:
    return json.dumps({"conn_type": "branchwater", "password": kv_url, "extra": extra})
