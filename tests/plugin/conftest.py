"""Fixtures of the provider tests: a lake behind the `branchwater_default` connection, and DAG
runs through `dag.test()` on the session's Airflow metadata DB.

The connection is an `AIRFLOW_CONN_…` variable, as a deployment could set it; tasks run in
this process and read it from there. The engine is real everywhere: SQLite by default,
PostgreSQL where a test asks `kv_url` for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from branchwater.demo.airflow_home import connection_variable
from branchwater.demo.dag_run import RunResult
from branchwater.demo.dag_run import run_dag as run_dag_once
from branchwater.engine import Lake, Repository
from tests.helpers.servers import unique_name

if TYPE_CHECKING:
    pass

LINK_TEMPLATE = "https://airflow.example.com/branchwater/{repository}/{branch}/{commit_id}"


@dataclass
class LakeConnection:
    """The lake a `branchwater` connection points at, opened by the test as well."""

    conn_id: str
    kv_url: str
    namespace: str
    """The URI under which the test's repositories live (`file://…` or `s3://…`)."""
    lake: Lake
    extra: dict[str, Any] = field(default_factory=dict)
    s3_options: dict[str, str] = field(default_factory=dict)

    def create_repository(self, prefix: str = "repo-") -> Repository:
        name = unique_name(prefix)
        return self.lake.create_repository(name, f"{self.namespace}/{name}")


def set_connection(
    monkeypatch: pytest.MonkeyPatch, conn_id: str, conn_type: str, **fields: Any
) -> None:
    """Define a connection the way a deployment can: an `AIRFLOW_CONN_…` variable of JSON."""
    for name, value in connection_variable(conn_id, conn_type, **fields).items():
        monkeypatch.setenv(name, value)


@pytest.fixture
def kv_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """SQLite by default; `@pytest.mark.parametrize("kv_url", [...], indirect=True)` with
    "sqlite" and "postgres" runs a test on both. Each test has a lake of its own (on
    PostgreSQL, a table of the session's database), so fixed names like the README's `sales`
    meet no other test's."""
    kind = getattr(request, "param", "sqlite")
    if kind == "postgres":
        return f"{request.getfixturevalue('postgres_url')}?table={unique_name('lake_')}"
    return f"sqlite:///{tmp_path / 'lake.db'}"


@pytest.fixture
def lake_conn(
    kv_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[LakeConnection]:
    """`branchwater_default` on a fresh lake, with a default namespace and a link template."""
    namespace = tmp_path / "namespaces"
    namespace.mkdir()
    extra = {"default_namespace": namespace.as_uri(), "link_template": LINK_TEMPLATE}
    set_connection(monkeypatch, "branchwater_default", "branchwater", password=kv_url, extra=extra)
    with Lake.connect(kv_url) as lake:
        yield LakeConnection("branchwater_default", kv_url, namespace.as_uri(), lake, extra)


@pytest.fixture
def repo(lake_conn: LakeConnection) -> Repository:
    """A repository with one object committed on `main`."""
    repository = lake_conn.create_repository()
    main = repository.branch("main")
    main.upload("base.csv", b"id\n0\n")
    main.commit("base")
    return repository


@pytest.fixture
def no_aws_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    """boto3's default chain finds nothing: no keys in the environment or in files, no
    instance metadata service, no `aws_default` connection."""
    for variable in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(variable, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.delenv("AIRFLOW_CONN_AWS_DEFAULT", raising=False)


RunDag = Callable[..., RunResult]


@pytest.fixture
def run_dag(airflow_home: Path, monkeypatch: pytest.MonkeyPatch) -> RunDag:
    """Run a DAG once with `dag.test()` on the session's metadata DB (`register`ed first, as
    the DAG processor would: `dag.test()` only runs DAGs that are serialized there). A rerun
    of a logical date keeps what its tasks kept in their state store, as clearing the run
    does (`clearing_keeps_task_state`)."""
    clearing_keeps_task_state(monkeypatch)
    return run_dag_once


def clearing_keeps_task_state(monkeypatch: pytest.MonkeyPatch) -> None:
    """`dag.test()` reruns a logical date by deleting its DAG run and creating it again, and
    the task state store goes with the run it belongs to; clearing a run, which such a rerun
    stands for, keeps both. The rows of the deleted run are written again for the new one."""
    from airflow.models import dagrun
    from airflow.models.task_state_store import TaskStateStoreModel
    from sqlalchemy import select

    create = dagrun.get_or_create_dagrun
    columns = [getattr(TaskStateStoreModel, name) for name in STATE_COLUMNS]

    def recreated(**kwargs: Any) -> Any:
        session, run = kwargs["session"], dagrun.DagRun
        kept = session.execute(
            select(*columns)
            .join(run, run.id == TaskStateStoreModel.dag_run_id)
            .where(run.dag_id == kwargs["dag"].dag_id, run.logical_date == kwargs["logical_date"])
        ).mappings()
        rows = [dict(row) for row in kept]
        created = create(**kwargs)
        session.add_all(TaskStateStoreModel(dag_run_id=created.id, **row) for row in rows)
        session.commit()
        return created

    monkeypatch.setattr(dagrun, "get_or_create_dagrun", recreated)


STATE_COLUMNS = ("task_id", "map_index", "key", "dag_id", "run_id", "value", "expires_at")
"""What a task state store row holds besides the id of the DAG run it belongs to."""


NO_RETRY_DELAY = {"retries": 1, "retry_delay": timedelta(seconds=0)}
"""Task arguments for one retry, run at once."""
