"""Fixtures of the provider tests: a lake behind the `branchwater_default` connection, and DAG
runs through `dag.test()` on the session's Airflow metadata DB.

The connection is an `AIRFLOW_CONN_…` variable, as a deployment could set it; tasks run in
this process and read it from there. The engine is real everywhere: SQLite by default,
PostgreSQL where a test asks `kv_url` for it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from branchwater.engine import Lake, Repository
from tests.helpers import unique_name

if TYPE_CHECKING:
    from airflow.sdk import DAG

LINK_TEMPLATE = "https://airflow.example.com/branchwater/{repository}/{branch}/{commit_id}"


@dataclass
class LakeConnection:
    """The lake a `branchwater` connection points at, opened by the test as well."""

    conn_id: str
    kv_url: str
    namespace: Path
    lake: Lake
    extra: dict[str, Any] = field(default_factory=dict)

    def create_repository(self, prefix: str = "repo-") -> Repository:
        name = unique_name(prefix)
        return self.lake.create_repository(name, (self.namespace / name).as_uri())


def connection_env(conn_id: str) -> str:
    return f"AIRFLOW_CONN_{conn_id.upper()}"


def set_connection(
    monkeypatch: pytest.MonkeyPatch, conn_id: str, conn_type: str, **fields: Any
) -> None:
    """Define a connection the way a deployment can: an `AIRFLOW_CONN_…` variable of JSON."""
    monkeypatch.setenv(connection_env(conn_id), json.dumps({"conn_type": conn_type, **fields}))


@pytest.fixture
def kv_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """SQLite by default; `@pytest.mark.parametrize("kv_url", [...], indirect=True)` with
    "sqlite" and "postgres" runs a test on both."""
    kind = getattr(request, "param", "sqlite")
    if kind == "postgres":
        return str(request.getfixturevalue("postgres_url"))
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
        yield LakeConnection("branchwater_default", kv_url, namespace, lake, extra)


@pytest.fixture
def repo(lake_conn: LakeConnection) -> Repository:
    """A repository with one object committed on `main`."""
    repository = lake_conn.create_repository()
    main = repository.branch("main")
    main.upload("base.csv", b"id\n0\n")
    main.commit("base")
    return repository


@dataclass(frozen=True)
class RunResult:
    """A finished DAG run, read back from the metadata DB."""

    dag_id: str
    run_id: str
    state: str
    states: dict[str, str]
    """Each task instance's state, keyed `task_id` or `task_id[map_index]` when mapped."""
    tries: dict[str, int]
    xcoms: dict[tuple[str, str], Any]
    """XCom values keyed (`task_id` or `task_id[map_index]`, key)."""
    rendered: dict[str, dict[str, Any]]
    """Each task instance's rendered template fields, as the UI shows them."""

    def value(self, task: str, key: str = "return_value") -> Any:
        return self.xcoms[(task, key)]


RunDag = Callable[..., RunResult]


@pytest.fixture
def run_dag(airflow_home: Path) -> RunDag:
    """Run a DAG once with `dag.test()`, after writing it to the metadata DB as the DAG
    processor would (`dag.test()` only runs DAGs that are serialized there)."""

    def run(dag: DAG, conf: dict[str, Any] | None = None) -> RunResult:
        register(dag)
        dag_run = dag.test(run_conf=conf)
        return collect(dag.dag_id, dag_run.run_id, str(dag_run.state))

    return run


def register(dag: DAG) -> None:
    from airflow.dag_processing.bundles.manager import DagBundlesManager
    from airflow.dag_processing.collection import update_dag_parsing_results_in_db
    from airflow.serialization.serialized_objects import LazyDeserializedDAG
    from airflow.utils.session import create_session

    DagBundlesManager().sync_bundles_to_db()
    with create_session() as session:
        update_dag_parsing_results_in_db(
            "dags-folder", None, [LazyDeserializedDAG.from_dag(dag)], {}, None, set(), session
        )


def collect(dag_id: str, run_id: str, state: str) -> RunResult:
    from airflow.models.renderedtifields import RenderedTaskInstanceFields
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    def name(task_id: str, map_index: int) -> str:
        return task_id if map_index < 0 else f"{task_id}[{map_index}]"

    with create_session() as session:
        tis = session.scalars(
            select(TaskInstance).where(TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id)
        ).all()
        xcoms = session.scalars(XComModel.get_many(run_id=run_id, dag_ids=dag_id)).all()
        rendered = session.scalars(
            select(RenderedTaskInstanceFields).where(
                RenderedTaskInstanceFields.dag_id == dag_id,
                RenderedTaskInstanceFields.run_id == run_id,
            )
        ).all()
        return RunResult(
            dag_id=dag_id,
            run_id=run_id,
            state=state,
            states={name(ti.task_id, ti.map_index): str(ti.state) for ti in tis},
            tries={name(ti.task_id, ti.map_index): ti.try_number for ti in tis},
            xcoms={
                (name(x.task_id, x.map_index), x.key): XComModel.deserialize_value(x) for x in xcoms
            },
            rendered={name(r.task_id, r.map_index): r.rendered_fields for r in rendered},
        )
