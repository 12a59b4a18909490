"""The README's DAG, as printed with only its export folder moved, run by `dag.test()`: its
first run creates the repository and leaves a merge commit naming the merge task; reruns of
the same day, and of an earlier day after later ones, succeed with no new commit and no
branch left behind; a local lake runs with an AWS connection named and not defined."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tests.test_walkthroughs import README, python_blocks

if TYPE_CHECKING:
    from airflow.sdk import DAG

    from branchwater.engine import Repository
    from tests.plugin.conftest import LakeConnection, RunDag

pytestmark = [pytest.mark.airflow, pytest.mark.slow]

EXPORTS = "/exports/"
DAYS = [datetime(2026, 11, day, tzinfo=timezone.utc) for day in (20, 21, 22)]


def readme_dag(folder: Path) -> DAG:
    """`daily_orders` from the README, its exports read from `folder`, parsed as the DAG
    processor parses a DAG file."""
    from airflow.dag_processing.dagbag import DagBag

    (code,) = [block for block in python_blocks(README.read_text()) if "def daily_orders" in block]
    assert code.count(EXPORTS) == 1
    dag_file = folder / "daily_orders.py"
    dag_file.write_text(code.replace(EXPORTS, f"{folder}/exports/"))
    bag = DagBag(dag_folder=dag_file)
    assert bag.import_errors == {}
    return bag.dags["daily_orders"]


def export(folder: Path, day: datetime) -> None:
    exports = folder / "exports"
    exports.mkdir(exist_ok=True)
    ds = day.date().isoformat()
    (exports / f"{ds}.csv").write_text(f"id,amount,day\n1,10,{ds}\n")


def history(repo: Repository) -> list[str]:
    return [commit.id for commit in repo.log("main")]


def made_by_run(repo: Repository, run_id: str) -> list[str]:
    """The tasks whose commits of run `run_id` are on `main`, newest first."""
    return [
        c.metadata["airflow.task_id"] for c in repo.log("main", where={"airflow.run_id": run_id})
    ]


def test_the_readme_dag_creates_the_repository_and_records_its_merge(
    run_dag: RunDag, lake_conn: LakeConnection, tmp_path: Path
) -> None:
    dag = readme_dag(tmp_path)
    export(tmp_path, DAYS[0])

    result = run_dag(dag, logical_date=DAYS[0])

    assert result.state == "success", result.states
    repo = lake_conn.lake.repository("sales")
    assert repo.storage_namespace == f"{lake_conn.namespace}/sales"
    assert result.value("repository")["storage_namespace"] == repo.storage_namespace
    main = repo.branch("main")
    merged = main.head()
    assert len(merged.parents) == 2, "the merge task wrote a merge commit"
    assert result.value("merge") == merged.id
    assert merged.metadata["airflow.task_id"] == "merge"
    assert merged.metadata["airflow.run_id"] == result.run_id
    assert repo.commit(merged.parents[1]).message == "Orders of 2026-11-20"
    assert main.read("orders/2026-11-20.csv").startswith(b"id,amount")
    assert made_by_run(repo, result.run_id) == ["merge", "commit"]
    assert [b.name for b in repo.branches()] == ["main"]


@pytest.mark.parametrize(
    "kv_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_reruns_of_a_day_and_of_an_earlier_day_after_later_ones_add_nothing(
    run_dag: RunDag, lake_conn: LakeConnection, tmp_path: Path
) -> None:
    dag = readme_dag(tmp_path)
    for day in DAYS:
        export(tmp_path, day)
    first = run_dag(dag, logical_date=DAYS[0])
    repo = lake_conn.lake.repository("sales")
    assert first.state == "success", first.states
    before = history(repo)

    again = run_dag(dag, logical_date=DAYS[0])

    assert again.state == "success", again.states
    assert (again.run_id, history(repo)) == (first.run_id, before)
    assert again.value("commit") == first.value("commit")
    assert again.value("merge") == first.value("merge")

    later = [run_dag(dag, logical_date=day) for day in DAYS[1:]]
    assert [run.state for run in later] == ["success", "success"]
    before = history(repo)
    for day, run in ((DAYS[0], first), (DAYS[1], later[0])):
        rerun = run_dag(dag, logical_date=day)
        assert rerun.state == "success", rerun.states
        assert history(repo) == before
        assert rerun.value("commit") == run.value("commit")
        assert rerun.value("merge") == run.value("merge")
        assert made_by_run(repo, run.run_id) == ["merge", "commit"]
    assert [b.name for b in repo.branches()] == ["main"]
    assert {e.path for e in repo.branch("main").list()} == {
        f"orders/{day.date().isoformat()}.csv" for day in DAYS
    }


def test_a_local_lake_runs_with_an_undefined_aws_connection_named(
    run_dag: RunDag,
    lake_conn: LakeConnection,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    no_aws_credentials: None,
) -> None:
    """The README's connection variable names `aws_default`; no task of a lake whose
    namespaces are all local asks for it."""
    from tests.plugin.conftest import set_connection

    extra = {**lake_conn.extra, "aws_conn_id": "aws_default"}
    set_connection(
        monkeypatch, "branchwater_default", "branchwater", password=lake_conn.kv_url, extra=extra
    )
    dag = readme_dag(tmp_path)
    export(tmp_path, DAYS[0])

    result = run_dag(dag, logical_date=DAYS[0])

    assert result.state == "success", result.states
    assert lake_conn.lake.repository("sales").branch("main").read("orders/2026-11-20.csv")
