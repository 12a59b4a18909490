"""What a new DAG author tripped on, each through `dag.test()` on a real lake: merges that
fast-forwarded recorded nothing, no operator created a repository and a missing one was
retried, a local lake demanded AWS credentials, and knobs nobody had documented."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from airflow.sdk import DAG

from branchwater.engine import InvalidArgument, Lake, Repository
from branchwater.plugin.operators import (
    BranchwaterCommitOperator,
    BranchwaterCreateBranchOperator,
    BranchwaterCreateRepositoryOperator,
    BranchwaterMergeOperator,
    BranchwaterUploadOperator,
)
from tests.plugin.conftest import LakeConnection, RunDag, set_connection

pytestmark = [pytest.mark.airflow, pytest.mark.slow]

RETRIED = {"retries": 2, "retry_delay": timedelta(seconds=0)}


def feature(repo: Repository, name: str) -> str:
    """A branch one commit past `main`, which has not moved since: a merge could
    fast-forward."""
    branch = repo.create_branch(name)
    branch.upload(f"{name}.csv", name.encode())
    return branch.commit(name).id


def test_a_merge_writes_a_commit_with_the_tasks_identity_unless_told_to_fast_forward(
    run_dag: RunDag, lake_conn: LakeConnection, repo: Repository
) -> None:
    recorded = feature(repo, "recorded")
    names = {"repository": repo.name}
    with DAG("bw_merge_records", schedule=None) as dag:
        BranchwaterMergeOperator(
            task_id="merge",
            source_ref="recorded",
            message="Merge {{ dag.dag_id }}",
            metadata={"why": "audit"},
            **names,
        ) >> BranchwaterMergeOperator(
            task_id="fast", source_ref="recorded", fast_forward=True, **names
        )

    result = run_dag(dag)

    assert result.states == {"merge": "success", "fast": "success"}
    main = repo.branch("main")
    merged = main.head()
    assert result.value("merge") == merged.id != recorded
    assert merged.parents[1] == recorded
    assert merged.message == "Merge bw_merge_records"
    assert merged.metadata["why"] == "audit"
    assert merged.metadata["airflow.task_id"] == "merge"
    assert merged.metadata["airflow.run_id"] == result.run_id
    assert result.value("fast") == merged.id  # contained already: nothing to record

    fast = feature(repo, "fast")
    with DAG("bw_merge_fast", schedule=None) as dag:
        BranchwaterMergeOperator(task_id="fast", source_ref="fast", fast_forward=True, **names)
    result = run_dag(dag)
    assert result.state == "success", result.states
    assert main.commit_id == fast == result.value("fast")


def test_the_repository_operator_creates_once_and_refuses_another_namespace_at_once(
    run_dag: RunDag, lake_conn: LakeConnection, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    taken = lake_conn.create_repository("taken-")
    elsewhere = (tmp_path / "elsewhere").as_uri()
    set_connection(monkeypatch, "bw_no_ns", "branchwater", password=lake_conn.kv_url)
    with DAG("bw_create_repository", schedule=None, params={"name": "fresh"}) as dag:
        BranchwaterCreateRepositoryOperator(
            task_id="create", repository="{{ params.name }}", **RETRIED
        ) >> BranchwaterCreateRepositoryOperator(
            task_id="again", repository="{{ params.name }}", **RETRIED
        )
        BranchwaterCreateRepositoryOperator(
            task_id="explicit",
            repository="explicit",
            storage_namespace=f"{elsewhere}/explicit/",
            default_branch="trunk",
        )
        BranchwaterCreateRepositoryOperator(
            task_id="moved", repository=taken.name, storage_namespace=elsewhere, **RETRIED
        )
        BranchwaterCreateRepositoryOperator(
            task_id="namespace_taken",
            repository="squatter",
            storage_namespace=taken.storage_namespace,
            **RETRIED,
        )
        BranchwaterCreateRepositoryOperator(
            task_id="no_namespace", repository="nowhere", branchwater_conn_id="bw_no_ns", **RETRIED
        )
        BranchwaterCommitOperator(
            task_id="missing", repository="never-created", branch="main", message="m", **RETRIED
        )

    result = run_dag(dag)

    assert result.states == {
        "create": "success",
        "again": "success",
        "explicit": "success",
        "moved": "failed",
        "namespace_taken": "failed",
        "no_namespace": "failed",
        "missing": "failed",
    }
    fresh = lake_conn.lake.repository("fresh")
    assert fresh.storage_namespace == f"{lake_conn.namespace}/fresh"
    assert (
        result.value("create")
        == result.value("again")
        == {
            "name": "fresh",
            "storage_namespace": fresh.storage_namespace,
            "default_branch": "main",
        }
    )
    explicit = lake_conn.lake.repository("explicit")
    assert (explicit.storage_namespace, explicit.default_branch) == (
        f"{elsewhere}/explicit",
        "trunk",
    )
    for task in ("moved", "namespace_taken", "no_namespace", "missing"):
        assert result.tries[task] == 1, task
    assert lake_conn.lake.repository(taken.name).storage_namespace == taken.storage_namespace


def test_a_local_lake_never_asks_for_aws_credentials_and_an_s3_one_names_the_connection(
    run_dag: RunDag,
    lake_conn: LakeConnection,
    repo: Repository,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
    no_aws_credentials: None,
) -> None:
    local = {**lake_conn.extra, "aws_conn_id": "aws_default"}
    set_connection(
        monkeypatch, "branchwater_default", "branchwater", password=lake_conn.kv_url, extra=local
    )
    on_s3 = {"default_namespace": "s3://bucket/lakes", "aws_conn_id": "aws_default"}
    set_connection(monkeypatch, "bw_s3", "branchwater", password=lake_conn.kv_url, extra=on_s3)
    names = {"repository": repo.name}
    with DAG("bw_local_lake", schedule=None) as dag:
        (
            BranchwaterCreateRepositoryOperator(task_id="local_repository", repository="local")
            >> BranchwaterCreateBranchOperator(task_id="branch", branch="etl", **names)
            >> BranchwaterUploadOperator(
                task_id="load", branch="etl", path="a.csv", data="a", **names
            )
            >> BranchwaterCommitOperator(task_id="commit", branch="etl", message="a", **names)
            >> BranchwaterMergeOperator(task_id="merge", source_ref="etl", **names)
        )
        BranchwaterCreateRepositoryOperator(
            task_id="s3_repository", repository="remote", branchwater_conn_id="bw_s3", **RETRIED
        )

    result = run_dag(dag)

    assert result.states.pop("s3_repository") == "failed"
    assert set(result.states.values()) == {"success"}, result.states
    assert result.tries["s3_repository"] == 1
    assert repo.branch("main").read("a.csv") == b"a"
    output = capfd.readouterr().out
    assert (
        "connection 'bw_s3' reaches S3 through the AWS connection 'aws_default', which gave "
        "no credentials" in output
    )
    assert "get_frozen_credentials" not in output


def test_the_knobs_the_readme_did_not_name(
    run_dag: RunDag,
    lake_conn: LakeConnection,
    repo: Repository,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`branchwater_conn_id` reaches another lake, `destination_branch` merges elsewhere than
    the default branch, `allow_empty` commits nothing staged."""
    other_url = f"sqlite:///{tmp_path / 'other.db'}"
    set_connection(monkeypatch, "bw_other", "branchwater", password=other_url)
    with Lake.connect(other_url) as other_lake:
        other = other_lake.create_repository("other", (tmp_path / "other").as_uri())
        feature(repo, "work")
        repo.create_branch("release")
        names = {"repository": repo.name}
        with DAG("bw_knobs", schedule=None) as dag:
            BranchwaterMergeOperator(
                task_id="merge", source_ref="work", destination_branch="release", **names
            )
            BranchwaterCommitOperator(
                task_id="empty", branch="main", message="heartbeat", allow_empty=True, **names
            )
            BranchwaterCommitOperator(
                task_id="other_lake",
                repository="other",
                branch="main",
                message="other",
                allow_empty=True,
                branchwater_conn_id="bw_other",
            )

        result = run_dag(dag)

        assert set(result.states.values()) == {"success"}, result.states
        assert repo.branch("release").read("work.csv") == b"work"
        assert result.value("merge") == repo.branch("release").commit_id
        assert "work.csv" not in {e.path for e in repo.branch("main").list()}
        assert repo.branch("main").head().message == "heartbeat"
        assert result.value("empty") == repo.branch("main").commit_id
        assert other.branch("main").head().message == "other"


def test_impossible_options_fail_when_the_dag_file_is_parsed() -> None:
    with pytest.raises(InvalidArgument, match="on_no_changes must be one of skip, fail"):
        BranchwaterCommitOperator(
            task_id="c", repository="r", branch="b", message="m", on_no_changes="ignore"
        )
    with pytest.raises(InvalidArgument, match="lookup_depth must be a positive number"):
        BranchwaterMergeOperator(task_id="m", repository="r", source_ref="b", lookup_depth=0)
