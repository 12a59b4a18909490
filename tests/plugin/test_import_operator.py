"""`BranchwaterImportOperator` run by Airflow through `dag.test()`: templated fields, the
XCom value, the commit's run metadata and link, a retry after the work was done, and a bad
source failing without retries."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from airflow.sdk import DAG

from branchwater.engine import Repository
from branchwater.plugin.operators import BranchwaterImportOperator
from tests.plugin.conftest import LINK_TEMPLATE, NO_RETRY_DELAY, LakeConnection, RunDag

if TYPE_CHECKING:
    from airflow.sdk import Context

pytestmark = [pytest.mark.airflow, pytest.mark.slow]


class FlakyImport(BranchwaterImportOperator):
    """Its first try fails after the import landed, as a worker lost before Airflow
    recorded the result."""

    def execute_on(self, repo: Repository, context: Context) -> Any:
        result = super().execute_on(repo, context)
        if context["ti"].try_number == 1:
            raise RuntimeError("worker lost after the work was done")
        return result


def test_an_import_task_commits_once_and_its_retry_returns_that_commit(
    run_dag: RunDag,
    lake_conn: LakeConnection,
    repo: Repository,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    source = tmp_path_factory.mktemp("landing")
    (source / "day=2026-11-01").mkdir()
    (source / "day=2026-11-01" / "part-0.csv").write_bytes(b"a,b\n1,2\n")
    (source / "readme.txt").write_bytes(b"hello")
    commits_before = len(list(repo.log("main")))
    names = {"repository": repo.name, **NO_RETRY_DELAY}
    with DAG("bw_import", schedule=None, params={"area": "landing"}) as dag:
        FlakyImport(
            task_id="import",
            branch="main",
            source_uri=source.as_uri(),
            prefix="{{ params.area }}/",
            message="Import {{ params.area }}",
            **names,
        )
        BranchwaterImportOperator(
            task_id="inside_namespace",
            branch="main",
            source_uri=repo.storage_namespace,
            **names,
        )

    result = run_dag(dag)

    assert result.states == {"import": "success", "inside_namespace": "failed"}
    assert (result.tries["import"], result.tries["inside_namespace"]) == (2, 1)
    head = repo.branch("main").head()
    assert result.value("import") == {
        "commit_id": head.id,
        "count": 2,
        "bytes": 13,
        "folder_markers": 0,
    }
    assert result.value("import", "_link_BranchwaterCommitLink") == LINK_TEMPLATE.format(
        repository=repo.name, branch="main", commit_id=head.id
    )
    assert head.message == "Import landing"
    assert head.metadata["airflow.task_id"] == "import"
    assert head.metadata["airflow.try_number"] == "1"
    assert repo.ref("main").read("landing/day=2026-11-01/part-0.csv") == b"a,b\n1,2\n"
    assert len(list(repo.log("main"))) == commits_before + 1
