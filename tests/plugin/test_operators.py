"""The operators, run by Airflow through `dag.test()` on a real lake: templated fields, XCom
values, commit metadata and links, failure messages, retries and task groups."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any, NoReturn

import pytest
from airflow.sdk import DAG, TaskGroup

from branchwater.engine import InvalidArgument, MergeRaceLost, MergeResult, Repository, failpoints
from branchwater.plugin.operators import (
    BranchwaterCommitOperator,
    BranchwaterCompactOperator,
    BranchwaterCreateBranchOperator,
    BranchwaterDeleteBranchOperator,
    BranchwaterMergeOperator,
    BranchwaterRevertOperator,
    BranchwaterTagOperator,
    BranchwaterUploadOperator,
)
from branchwater.plugin.operators.base import Lineage, LineageDataset
from branchwater.plugin.operators.commits import ATTEMPTS_KEY, HINT_KEY
from branchwater.plugin.sensors import BranchwaterCompactionSensor
from tests.helpers.failpoints import PAUSE_TIMEOUT, paused_at
from tests.helpers.races import lost_merge
from tests.helpers.views import committed
from tests.plugin.conftest import (
    LINK_TEMPLATE,
    NO_RETRY_DELAY,
    LakeConnection,
    RunDag,
    set_connection,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

pytestmark = [pytest.mark.airflow, pytest.mark.slow]

LINK_KEY = "_link_BranchwaterCommitLink"
DAY1, DAY2 = (datetime(2026, 11, day, tzinfo=timezone.utc) for day in (20, 21))


def link(repo: Repository, branch: str, commit_id: str) -> str:
    return LINK_TEMPLATE.format(repository=repo.name, branch=branch, commit_id=commit_id)


@pytest.mark.parametrize(
    "kv_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_a_branch_from_creation_to_merge_with_templated_fields(
    run_dag: RunDag, lake_conn: LakeConnection, repo: Repository
) -> None:
    with DAG("bw_lifecycle", schedule=None, params={"day": "2026-01-01"}) as dag:
        names = {"repository": repo.name}
        create = BranchwaterCreateBranchOperator(
            task_id="create", branch="etl-{{ params.day }}", **names
        )
        other = BranchwaterCreateBranchOperator(task_id="other", branch="other", **names)
        upload = BranchwaterUploadOperator(
            task_id="upload",
            branch="{{ ti.xcom_pull('create') }}",
            path="day={{ params.day }}/a.csv",
            data="day,{{ params.day }}",
            metadata={"day": "{{ params.day }}"},
            **names,
        )
        commit = BranchwaterCommitOperator(
            task_id="commit",
            branch="etl-{{ params.day }}",
            message="Load {{ params.day }}",
            metadata={"source": "api-{{ params.day }}"},
            **names,
        )
        upload_other = BranchwaterUploadOperator(
            task_id="upload_other", branch="other", path="other.csv", data="x", **names
        )
        commit_other = BranchwaterCommitOperator(
            task_id="commit_other", branch="other", message="other", **names
        )
        merge_other = BranchwaterMergeOperator(task_id="merge_other", source_ref="other", **names)
        merge = BranchwaterMergeOperator(
            task_id="merge",
            source_ref="etl-{{ params.day }}",
            message="Merge {{ params.day }}",
            **names,
        )
        tag = BranchwaterTagOperator(task_id="tag", tag="v{{ params.day }}", ref="main", **names)
        delete = BranchwaterDeleteBranchOperator(
            task_id="delete", branch="etl-{{ params.day }}", **names
        )
        create >> upload >> commit >> merge
        other >> upload_other >> commit_other >> merge_other >> merge >> tag >> delete

    result = run_dag(dag, {"day": "2026-11-22"})

    assert result.state == "success", result.states
    branch = "etl-2026-11-22"
    main = repo.branch("main")
    merged = main.head()
    assert result.value("create") == branch
    assert result.value("upload")["path"] == "day=2026-11-22/a.csv"
    assert result.value("upload")["size"] == len("day,2026-11-22")
    assert main.read("day=2026-11-22/a.csv") == b"day,2026-11-22"
    assert main.stat("day=2026-11-22/a.csv").metadata == {"day": "2026-11-22"}
    assert result.value("merge") == merged.id
    assert result.value("tag") == merged.id
    assert repo.ref("v2026-11-22").commit_id == merged.id
    assert branch not in {b.name for b in repo.branches()}

    commit = repo.commit(result.value("commit"))
    assert commit.message == "Load 2026-11-22"
    assert commit.committer == "airflow"
    assert commit.metadata["source"] == "api-2026-11-22"
    assert {k: v for k, v in commit.metadata.items() if k != "airflow.logical_date"} == {
        "source": "api-2026-11-22",
        "airflow.dag_id": "bw_lifecycle",
        "airflow.run_id": result.run_id,
        "airflow.task_id": "commit",
        "airflow.map_index": "-1",
        "airflow.try_number": "1",
    }
    assert commit.metadata["airflow.logical_date"].startswith("20")
    assert merged.message == "Merge 2026-11-22"
    assert merged.parents == (result.value("merge_other"), commit.id)
    assert merged.metadata["airflow.task_id"] == "merge"

    assert result.value("commit", LINK_KEY) == link(repo, branch, commit.id)
    assert result.value("merge", LINK_KEY) == link(repo, "main", merged.id)
    assert result.rendered["upload"]["branch"] == branch
    assert result.rendered["upload"]["path"] == "day=2026-11-22/a.csv"
    assert result.rendered["commit"]["message"] == "Load 2026-11-22"


def test_operators_inside_a_task_group(
    run_dag: RunDag, lake_conn: LakeConnection, repo: Repository
) -> None:
    names = {"repository": repo.name}
    with DAG("bw_task_group", schedule=None) as dag, TaskGroup("load"):
        (
            BranchwaterCreateBranchOperator(task_id="create", branch="grouped", **names)
            >> BranchwaterUploadOperator(
                task_id="upload", branch="grouped", path="g.csv", data="g", **names
            )
            >> BranchwaterCommitOperator(task_id="commit", branch="grouped", message="g", **names)
            >> BranchwaterMergeOperator(task_id="merge", source_ref="grouped", **names)
        )

    result = run_dag(dag)

    assert result.state == "success", result.states
    head = repo.branch("main").commit_id
    assert result.value("load.merge") == head
    assert result.value("load.merge", LINK_KEY) == link(repo, "main", head)
    assert repo.branch("main").read("g.csv") == b"g"


def test_failures_say_what_is_wrong_and_final_ones_are_not_retried(
    run_dag: RunDag,
    lake_conn: LakeConnection,
    repo: Repository,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    set_connection(monkeypatch, "bw_no_url", "branchwater")
    for name in ("left", "right"):
        branch = repo.create_branch(name)
        branch.upload("same.csv", name.encode())
        branch.commit(name)
    repo.merge("left", into="main")
    for name in ("dirty", "fresh"):
        branch = repo.create_branch(name)
        branch.upload(f"{name}.csv", name.encode())
        branch.commit(name)
    repo.branch("dirty").upload("uncommitted.csv", b"u")
    retried = {"retries": 2, "retry_delay": timedelta(seconds=0)}
    with DAG("bw_failures", schedule=None) as dag:
        BranchwaterCreateBranchOperator(
            task_id="no_connection", repository=repo.name, branch="x", branchwater_conn_id="gone"
        )
        BranchwaterCreateBranchOperator(
            task_id="no_kv_url", repository=repo.name, branch="x", branchwater_conn_id="bw_no_url"
        )
        BranchwaterCommitOperator(
            task_id="no_repository", repository="nope", branch="main", message="m", **retried
        )
        BranchwaterMergeOperator(
            task_id="no_ref", repository=repo.name, source_ref="never-made", **retried
        )
        BranchwaterCreateBranchOperator(
            task_id="elsewhere", repository=repo.name, branch="right", **retried
        )
        BranchwaterMergeOperator(
            task_id="conflict", repository=repo.name, source_ref="right", **retried
        )
        BranchwaterUploadOperator(
            task_id="flag_as_text",
            repository=repo.name,
            branch="main",
            path="flagged.csv",
            data="x",
            if_absent="False",
            **retried,
        )
        BranchwaterCommitOperator(
            task_id="nothing_staged",
            repository=repo.name,
            branch="main",
            message="m",
            on_no_changes="fail",
            **retried,
        )
        BranchwaterRevertOperator(
            task_id="revert_dirty", repository=repo.name, branch="dirty", commit="dirty", **retried
        )
        BranchwaterMergeOperator(
            task_id="merge_dirty",
            repository=repo.name,
            source_ref="fresh",
            destination_branch="dirty",
            **retried,
        )

    result = run_dag(dag)

    output = capfd.readouterr().out
    assert result.state == "failed"
    assert set(result.states.values()) == {"failed"}
    assert "The conn_id `gone` isn't defined" in output
    assert "connection 'bw_no_url' has no KV URL: put it in the password field" in output
    assert "repository 'nope' not found" in output
    assert "MergeConflict: merging 'right' into 'main' conflicts on 1 path(s): same.csv" in output
    assert "NoChanges: nothing to commit on branch 'main'" in output
    assert f"AlreadyExists: branch 'right' of '{repo.name}' exists at" in output
    assert "NotFound: ref 'never-made' not found" in output
    assert "InvalidArgument: if_absent must be True or False, not 'False'" in output
    dirty = f"DirtyBranch: branch 'dirty' of '{repo.name}' has uncommitted changes: commit or"
    assert f"{dirty} reset it before a revert onto it (or allow_dirty)" in output
    assert f"{dirty} reset it before merging into it" in output
    final = (
        "elsewhere",
        "conflict",
        "nothing_staged",
        "no_repository",
        "no_ref",
        "flag_as_text",
        "revert_dirty",
        "merge_dirty",
    )
    for task in final:
        assert result.tries[task] == 1, task


@pytest.mark.parametrize(
    ("operator", "flag", "arguments"),
    [
        (BranchwaterDeleteBranchOperator, "missing_ok", {"branch": "b"}),
        (BranchwaterCompactOperator, "missing_ok", {"branch": "b"}),
        (BranchwaterCompactionSensor, "missing_ok", {"branch": "b"}),
        (BranchwaterMergeOperator, "preview_then_publish", {"source_ref": "etl"}),
        (BranchwaterMergeOperator, "fast_forward", {"source_ref": "etl"}),
    ],
)
def test_a_flag_the_operator_acts_on_given_as_text_fails_where_the_task_is_declared(
    operator: type[Any], flag: str, arguments: dict[str, str]
) -> None:
    """`missing_ok="False"` would count as true and skip a task meant to fail; flags the
    operator hands to the engine fail the task instead (`flag_as_text` above)."""
    refused = f"task 't': {flag} must be True or False, not 'False'"
    with pytest.raises(InvalidArgument, match=refused):
        operator(task_id="t", repository="sales", **arguments, **{flag: "False"})


def test_a_commit_task_whose_writes_a_concurrent_commit_recorded_succeeds_with_it(
    run_dag: RunDag, repo: Repository
) -> None:
    """Commits racing on one branch land as a group: the task finds another writer's commit
    under way, waits, and that commit records the task's writes. Even `on_no_changes="fail"`
    succeeds then, returning that commit: there was something to record, and it is."""
    main = repo.branch("main")
    main.upload("orders.csv", b"id\n1\n")
    with DAG("bw_commit_recorded", schedule=None) as dag:
        BranchwaterCommitOperator(
            task_id="commit",
            repository=repo.name,
            branch="main",
            message="load orders",
            on_no_changes="fail",
        )
    with ThreadPoolExecutor(1) as pool, paused_at("commit.after_seal") as held:
        other = pool.submit(main.commit, "another writer")
        held.wait()

        def land_the_other() -> None:
            """Released, the other commit lands before the task looks again: a slow build
            must not outlast the task's `commit_wait`, after which it would seal beside."""
            held.release()
            other.result(PAUSE_TIMEOUT)

        with failpoints.armed("commit.awaiting", land_the_other):
            result = run_dag(dag)
        landed = other.result(PAUSE_TIMEOUT)
    assert result.state == "success", result.states
    assert result.value("commit") == landed.id == main.head().id
    assert [c.message for c in repo.log("main", limit=2)] == ["another writer", "base"]
    assert committed(repo, landed.id) == ["base.csv", "orders.csv"]


def test_a_commit_task_whose_writes_a_reset_dropped_fails_without_retries(
    run_dag: RunDag, repo: Repository, capfd: pytest.CaptureFixture[str]
) -> None:
    """A reset while the commit is under way drops its writes: `on_no_changes="skip"` must
    not take that for content already there, and a retry cannot bring them back."""
    main = repo.branch("main")
    main.upload("orders.csv", b"id\n1\n")
    with DAG("bw_commit_dropped", schedule=None) as dag:
        BranchwaterCommitOperator(
            task_id="commit", repository=repo.name, branch="main", message="load", **NO_RETRY_DELAY
        )
    with failpoints.armed("commit.after_seal", main.reset):
        result = run_dag(dag)
    assert result.state == "failed", result.states
    assert result.tries["commit"] == 1
    assert "ChangesDropped" in capfd.readouterr().out
    assert main.head().message == "base"


class LosesWorkerAfterwards:
    """Makes the first try of an operator fail after its work is done, as a worker lost
    between the engine call and Airflow recording the result."""

    def execute_on(self, repo: Repository, context: Context) -> Any:
        result = super().execute_on(repo, context)  # type: ignore[misc]
        if context["ti"].try_number == 1:
            raise RuntimeError("worker lost after the work was done")
        return result


class FlakyCreate(LosesWorkerAfterwards, BranchwaterCreateBranchOperator):
    pass


class FlakyCommit(LosesWorkerAfterwards, BranchwaterCommitOperator):
    pass


class FlakyMerge(LosesWorkerAfterwards, BranchwaterMergeOperator):
    pass


class FlakyDelete(LosesWorkerAfterwards, BranchwaterDeleteBranchOperator):
    pass


class FlakyTag(LosesWorkerAfterwards, BranchwaterTagOperator):
    pass


class FlakyUpload(LosesWorkerAfterwards, BranchwaterUploadOperator):
    pass


def test_retries_after_a_try_did_the_work_succeed_with_its_result(
    run_dag: RunDag, lake_conn: LakeConnection, repo: Repository
) -> None:
    main = repo.branch("main")
    names = {"repository": repo.name, **NO_RETRY_DELAY}
    with DAG("bw_retry_safe", schedule=None) as dag:
        create = FlakyCreate(task_id="create", branch="retried", **names)
        upload = BranchwaterUploadOperator(
            task_id="upload", branch="retried", path="r.csv", data="r", **names
        )
        commit = FlakyCommit(task_id="commit", branch="retried", message="r", **names)
        move_main = BranchwaterUploadOperator(
            task_id="move_main", branch="main", path="m.csv", data="m", **names
        )
        commit_main = BranchwaterCommitOperator(
            task_id="commit_main", branch="main", message="m", **names
        )
        merge = FlakyMerge(task_id="merge", source_ref="retried", **names)
        delete = FlakyDelete(task_id="delete", branch="retried", **names)
        tag = FlakyTag(task_id="tag", tag="loaded", ref="main", **names)
        create >> upload >> commit >> move_main >> commit_main >> merge >> delete >> tag

    result = run_dag(dag)

    assert result.state == "success", result.states
    flaky = ("create", "commit", "merge", "delete", "tag")
    assert {task: result.tries[task] for task in flaky} == dict.fromkeys(flaky, 2)
    merged = main.head()
    assert result.value("tag") == merged.id == repo.ref("loaded").commit_id
    assert result.value("merge") == merged.id
    assert result.value("merge", ATTEMPTS_KEY) == 0
    assert merged.metadata["airflow.try_number"] == "1"
    assert result.value("commit") == merged.parents[1]
    assert repo.commit(result.value("commit")).metadata["airflow.try_number"] == "1"
    assert [c.message for c in repo.log("main", limit=4)] == [
        merged.message,
        "m",
        "r",
        "base",
    ]
    assert main.read("r.csv") == b"r"


class TagsThenMainMoves(BranchwaterTagOperator):
    """Its first try tags `main`, then loses its worker while another run merges into it."""

    def execute_on(self, repo: Repository, context: Context) -> Any:
        tagged = super().execute_on(repo, context)
        if context["ti"].try_number == 1:
            main = repo.branch("main")
            main.upload("other.csv", b"other")
            main.commit("another run's merge")
            raise RuntimeError("worker lost after the tag landed")
        return tagged


def test_a_tag_retried_after_its_branch_moved_on_succeeds_at_the_commit_it_tagged(
    run_dag: RunDag, lake_conn: LakeConnection, repo: Repository
) -> None:
    """`ref="main"` names another commit by the retry: the first try's is kept, so the tag
    it finds is its own, not another tag to fail on for good."""
    tagged = repo.branch("main").commit_id
    with DAG("bw_tag_moved", schedule=None) as dag:
        TagsThenMainMoves(
            task_id="tag", repository=repo.name, tag="release-1", ref="main", **NO_RETRY_DELAY
        )

    result = run_dag(dag)

    assert result.states == {"tag": "success"}
    assert result.tries["tag"] == 2
    assert result.value("tag") == tagged == repo.ref("release-1").commit_id
    assert repo.branch("main").commit_id != tagged


def daily_load(repository: str, *, valid: bool) -> DAG:
    """A daily load on one branch name for every run; `validate`, between the load and the
    commit, fails unless the day is `valid`."""
    from airflow.sdk import task

    names = {"repository": repository}
    with DAG("bw_shared_branch", schedule="@daily", start_date=DAY1, catchup=False) as dag:

        @task
        def validate() -> None:
            if not valid:
                raise RuntimeError("the day's load does not validate")

        (
            BranchwaterCreateBranchOperator(task_id="branch", branch="etl", **names, retries=1)
            >> BranchwaterUploadOperator(
                task_id="load", branch="etl", path="orders/{{ ds }}.csv", data="{{ ds }}", **names
            )
            >> validate()
            >> BranchwaterCommitOperator(
                task_id="commit", branch="etl", message="{{ ds }}", **names
            )
            >> BranchwaterMergeOperator(task_id="merge", source_ref="etl", **names)
        )
    return dag


def test_a_branch_another_run_left_uncommitted_changes_on_fails_the_create_at_once(
    run_dag: RunDag, lake_conn: LakeConnection, repo: Repository, capfd: pytest.CaptureFixture[str]
) -> None:
    """Day 1 staged its load and failed before its commit. Day 2, reusing the branch name,
    would commit and merge day 1's unvalidated file as its own: its create task fails at
    once. Day 1 rerun (cleared) carries on with the branch its create task made."""
    assert run_dag(daily_load(repo.name, valid=False), logical_date=DAY1).state == "failed"
    main = repo.branch("main")
    main.upload("hotfix.csv", b"hotfix")
    main.commit("hotfix: the branch is behind main now")

    day2 = run_dag(daily_load(repo.name, valid=True), logical_date=DAY2)

    assert day2.states["branch"] == "failed"
    assert day2.tries["branch"] == 1
    output = capfd.readouterr().out
    assert f"DirtyBranch: branch 'etl' of '{repo.name}' exists on 'main' (" in output
    assert "with uncommitted changes this DAG run did not make" in output
    assert "delete or reset it, or name the branch per run (with {{ run_id }})" in output
    assert "orders/2026-11-20.csv" not in {e.path for e in main.list()}

    rerun = run_dag(daily_load(repo.name, valid=True), logical_date=DAY1)

    assert rerun.state == "success", rerun.states
    assert main.read("orders/2026-11-20.csv") == b"2026-11-20"
    assert "orders/2026-11-21.csv" not in {e.path for e in main.list()}


def test_a_mapped_task_given_an_impossible_argument_fails_at_once_naming_it(
    run_dag: RunDag, lake_conn: LakeConnection, repo: Repository, capfd: pytest.CaptureFixture[str]
) -> None:
    """Airflow builds a mapped task only when it runs, unmapping it: what its `__init__`
    refuses then fails it without the retries, which would build it as wrongly again."""
    names = {"repository": repo.name, "retries": 2, "retry_delay": timedelta(0)}
    with DAG("bw_mapped_arguments", schedule=None) as dag:
        BranchwaterDeleteBranchOperator.partial(
            task_id="cleanup", missing_ok="False", **names
        ).expand(branch=["a", "b"])
        BranchwaterMergeOperator.partial(task_id="merge", lookup_depth=0, **names).expand(
            source_ref=["a"]
        )

    result = run_dag(dag)

    assert result.states == {"cleanup[0]": "failed", "cleanup[1]": "failed", "merge[0]": "failed"}
    assert set(result.tries.values()) == {1}
    output = capfd.readouterr().out
    refused = "InvalidOperatorArgument: task 'cleanup': missing_ok must be True or False"
    assert f"{refused}, not 'False'" in output
    assert "task 'merge': lookup_depth must be a positive number of commits, not 0" in output


def test_mapping_fields_take_a_mapping_or_its_json_text_and_refuse_python_text_at_once(
    run_dag: RunDag, lake_conn: LakeConnection, repo: Repository, capfd: pytest.CaptureFixture[str]
) -> None:
    """Without native rendering, `{{ params.meta }}` renders a dict as Python's text: it is
    refused at once, naming the task, the field and the way out, where a commit failed with a
    TypeError for its retries and a compaction read the text's characters as thresholds."""
    etl = repo.create_branch("etl")
    etl.upload("a.csv", b"a")
    etl.commit("a")
    etl.delete("a.csv")
    params = {"meta": {"source": "crm"}, "policy": {"max_tombstones": 1}}
    names = {"repository": repo.name, "retries": 2, "retry_delay": timedelta(0)}
    as_json, as_text = "{{ params.%s | tojson }}", "{{ params.%s }}"
    with DAG("bw_mapping_fields", schedule=None, params=params) as dag:
        upload = BranchwaterUploadOperator(
            task_id="upload",
            branch="main",
            path="u.csv",
            data="u",
            metadata=as_json % "meta",
            **names,
        )
        commit = BranchwaterCommitOperator(
            task_id="commit", branch="main", message="m", metadata=as_json % "meta", **names
        )
        BranchwaterCommitOperator(
            task_id="commit_text",
            branch="main",
            message="m",
            metadata=as_text % "meta",
            allow_empty=True,
            **names,
        )
        due = BranchwaterCompactionSensor(
            task_id="due", branch="etl", policy=as_json % "policy", **names
        )
        compact = BranchwaterCompactOperator(
            task_id="compact", branch="etl", if_needed=True, policy=as_json % "policy", **names
        )
        BranchwaterCompactOperator(
            task_id="compact_text", branch="etl", policy=as_text % "policy", **names
        )
        upload >> commit
        due >> compact

    result = run_dag(dag)

    assert result.states == {
        "upload": "success",
        "commit": "success",
        "commit_text": "failed",
        "due": "success",
        "compact": "success",
        "compact_text": "failed",
    }
    assert result.tries["commit_text"] == result.tries["compact_text"] == 1
    assert repo.commit(result.value("commit")).metadata["source"] == "crm"
    assert repo.branch("main").stat("u.csv").metadata == {"source": "crm"}
    assert result.value("compact")["outcome"] == "compacted"
    output = capfd.readouterr().out
    for name, argument in [("commit_text", "metadata"), ("compact_text", "policy")]:
        assert (
            f"InvalidArgument: task {name!r}: {argument} must be a mapping or the JSON text"
            in output
        )
    assert "not the text \"{'source': 'crm'}\"" in output
    assert "render_template_as_native_obj=True" in output
    assert "unknown compaction threshold" not in output


def test_an_exclusive_upload_retried_after_it_created_succeeds_and_another_task_fails_at_once(
    run_dag: RunDag, lake_conn: LakeConnection, repo: Repository
) -> None:
    """The retry finds the marker its first try created (it carries the task instance's
    identity) and returns it; another task creating the same path is refused, not retried."""
    names = {"repository": repo.name, "branch": "main", "path": "_LOCK", **NO_RETRY_DELAY}
    with DAG("bw_exclusive", schedule=None) as dag:
        first = FlakyUpload(task_id="first", data="first", if_absent=True, **names)
        second = BranchwaterUploadOperator(task_id="second", data="second", if_absent=True, **names)
        first >> second

    result = run_dag(dag)

    assert result.states == {"first": "success", "second": "failed"}
    assert result.tries == {"first": 2, "second": 1}
    marker = repo.branch("main").stat("_LOCK")
    assert result.value("first")["address"] == marker.address
    assert repo.branch("main").read("_LOCK") == b"first"
    assert marker.metadata["airflow.task_id"] == "first"
    assert marker.metadata["airflow.run_id"] == result.run_id

    rerun = run_dag(dag)
    assert rerun.run_id != result.run_id
    assert rerun.states["first"] == "failed"
    assert rerun.tries["first"] == 1


def diverge(repo: Repository) -> None:
    """`feature` and `main`, each one commit past where `feature` was branched."""
    feature = repo.create_branch("feature")
    feature.upload("f.csv", b"f")
    feature.commit("f")
    main = repo.branch("main")
    main.upload("m.csv", b"m")
    main.commit("m")


class LosesTheFirstRace(BranchwaterMergeOperator):
    """A merge whose first try lost every race to commits landing on its destination."""

    race: MergeRaceLost

    def merge(self, repo: Repository, into: str, hint: str | None, context: Context) -> MergeResult:
        if context["ti"].try_number == 1:
            self.lose(repo)
        return super().merge(repo, into, hint, context)

    def lose(self, repo: Repository) -> NoReturn:
        raise self.race


def test_a_merge_retry_resumes_from_the_hint_of_the_try_that_lost(
    run_dag: RunDag,
    lake_conn: LakeConnection,
    repo: Repository,
    capfd: pytest.CaptureFixture[str],
) -> None:
    diverge(repo)
    LosesTheFirstRace.race = lost_merge(repo, "feature", "main")
    main = repo.branch("main")
    main.upload("late.csv", b"late")
    late = main.commit("late, after the lost race")
    with DAG("bw_merge_hint", schedule=None) as dag:
        LosesTheFirstRace(
            task_id="merge", repository=repo.name, source_ref="feature", **NO_RETRY_DELAY
        )

    result = run_dag(dag)

    assert result.state == "success", result.states
    assert result.tries["merge"] == 2
    assert "Resuming the merge of the last try from its hint" in capfd.readouterr().out
    assert result.value("merge", ATTEMPTS_KEY) == 1
    merged = main.head()
    assert merged.parents == (late.id, repo.branch("feature").commit_id)
    assert {e.path for e in main.list()} == {"base.csv", "f.csv", "m.csv", "late.csv"}


def test_a_merge_that_keeps_losing_fails_with_its_hint_in_xcom(
    run_dag: RunDag, lake_conn: LakeConnection, repo: Repository
) -> None:
    diverge(repo)
    LosesTheFirstRace.race = lost_merge(repo, "feature", "main")
    with DAG("bw_merge_lost", schedule=None) as dag:
        LosesTheFirstRace(task_id="merge", repository=repo.name, source_ref="feature")

    result = run_dag(dag)

    assert result.states == {"merge": "failed"}
    assert result.value("merge", HINT_KEY) == LosesTheFirstRace.race.hint


class LosesWhileTheSourceMoves(LosesTheFirstRace):
    """Its first try loses every race, and meanwhile the source gets a new commit."""

    def lose(self, repo: Repository) -> NoReturn:
        source = repo.branch(self.source_ref)
        source.upload("f2.csv", b"f2")
        source.commit("f2")
        raise self.race


def test_a_hint_is_not_used_once_the_source_moved(
    run_dag: RunDag,
    lake_conn: LakeConnection,
    repo: Repository,
    capfd: pytest.CaptureFixture[str],
) -> None:
    diverge(repo)
    LosesWhileTheSourceMoves.race = lost_merge(repo, "feature", "main")
    with DAG("bw_merge_moved", schedule=None) as dag:
        LosesWhileTheSourceMoves(
            task_id="merge", repository=repo.name, source_ref="feature", **NO_RETRY_DELAY
        )

    result = run_dag(dag)

    assert result.state == "success", result.states
    assert "merging afresh" in capfd.readouterr().out
    assert repo.branch("main").read("f2.csv") == b"f2"


def test_lineage_needs_the_openlineage_provider() -> None:
    try:
        import airflow.providers.openlineage  # noqa: F401
    except ImportError:
        pass
    else:
        pytest.skip("the OpenLineage provider is installed here")
    merge = BranchwaterMergeOperator(task_id="m", repository="sales", source_ref="etl")
    merge.lineage = Lineage(
        inputs=(LineageDataset("sales", "etl"),), outputs=(LineageDataset("sales", "main"),)
    )
    assert merge.lineage.outputs[0].namespace == "branchwater://sales"
    assert merge.get_openlineage_facets_on_complete(None) is None


def test_compaction_returns_what_it_did_and_a_clean_branch_is_a_no_op(
    run_dag: RunDag, lake_conn: LakeConnection, repo: Repository, capfd: pytest.CaptureFixture[str]
) -> None:
    etl = repo.create_branch("etl")
    etl.upload("a.csv", b"a")
    etl.commit("a")
    etl.delete("a.csv")
    etl.upload("b.csv", b"b")
    repo.create_branch("clean")
    names = {"repository": repo.name}
    with DAG("bw_compact", schedule=None, params={"branch": "etl", "unset": None}) as dag:
        BranchwaterCompactOperator(task_id="compact", branch="{{ params.branch }}", **names)
        BranchwaterCompactOperator(task_id="nothing_staged", branch="clean", **names)
        BranchwaterCompactOperator(
            task_id="not_due", branch="clean", if_needed=True, policy={"max_tombstones": 5}, **names
        )
        BranchwaterCompactOperator(task_id="gone", branch="gone", **names)
        BranchwaterCompactOperator(task_id="gone_ok", branch="gone", missing_ok=True, **names)
        BranchwaterCompactOperator(
            task_id="bad_policy", branch="etl", policy={"max_tombs": 5}, **names
        )
        BranchwaterCompactOperator(
            task_id="unset_threshold",
            branch="clean",
            if_needed=True,
            policy={"max_tombstones": "{{ params.unset }}", "guard_seconds": ""},
            **names,
        )

    result = run_dag(dag)

    assert result.states == {
        "compact": "success",
        "nothing_staged": "success",
        "not_due": "success",
        "gone": "failed",
        "gone_ok": "skipped",
        "bad_policy": "failed",
        "unset_threshold": "success",
    }
    done = result.value("compact")
    assert (done["outcome"], done["compacted"], done["branch"]) == ("compacted", True, "etl")
    assert (done["entries_applied"], done["tombstones_removed"]) == (1, 1)
    assert result.rendered["compact"]["branch"] == "etl"
    assert etl.compaction_status().compacted
    assert {c.path for c in etl.uncommitted()} == {"a.csv", "b.csv"}
    assert [e.path for e in etl.list()] == ["b.csv", "base.csv"]
    assert result.value("nothing_staged")["outcome"] == "nothing-staged"
    assert result.value("nothing_staged")["compacted"] is False
    assert result.value("not_due")["outcome"] == "not-due"
    assert result.rendered["unset_threshold"]["policy"]["max_tombstones"] == "None"
    assert result.value("unset_threshold")["outcome"] == "not-due"
    output = capfd.readouterr().out
    assert f"branch 'gone' not found in repository '{repo.name}'" in output
    assert "unknown compaction threshold(s) max_tombs: use max_tombstones" in output


@dataclass
class WorkerTaskInstance:
    """What a worker's task instance tells an operator about itself."""

    task_id: str
    map_index: int
    dag_id: str = "bw_parallel"
    run_id: str = "parallel"
    try_number: int = 1
    xcoms: dict[str, Any] = field(default_factory=dict)

    def xcom_push(self, key: str, value: Any) -> None:
        self.xcoms[key] = value


class TaskStateStore(dict[str, Any]):
    def set(self, key: str, value: Any) -> None:
        self[key] = value

    def delete(self, key: str) -> None:
        self.pop(key, None)


@pytest.mark.parametrize(
    "kv_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_mapped_merges_running_at_once_all_land(
    lake_conn: LakeConnection, repo: Repository
) -> None:
    """Four merge tasks of one mapped task, each in its own worker thread with its own hook,
    race for `main`; the engine's retries land every one."""
    partitions = range(4)
    for i in partitions:
        branch = repo.create_branch(f"part-{i}")
        branch.upload(f"part={i}/data.csv", str(i).encode())
        branch.commit(f"part {i}")
    start = threading.Barrier(len(partitions))
    merged: dict[int, str] = {}

    def merge(i: int) -> None:
        operator = BranchwaterMergeOperator(
            task_id="merge", repository=repo.name, source_ref=f"part-{i}"
        )
        context = {
            "ti": WorkerTaskInstance("merge", i),
            "task_state_store": TaskStateStore(),
            "logical_date": None,
        }
        start.wait()
        merged[i] = operator.execute(context)  # type: ignore[arg-type]

    workers = [threading.Thread(target=merge, args=(i,)) for i in partitions]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()

    main = repo.branch("main")
    assert sorted(merged) == list(partitions)
    assert sorted(e.path for e in main.list(prefix="part=")) == [
        f"part={i}/data.csv" for i in partitions
    ]
    history = {c.id for c in repo.log("main")}
    assert set(merged.values()) <= history


def test_upload_data_of_another_type_than_text_or_bytes_fails_at_once_naming_it(
    run_dag: RunDag, lake_conn: LakeConnection, repo: Repository, capfd: pytest.CaptureFixture[str]
) -> None:
    """`bytes(data)` wrote three NUL bytes for a count a native-object template rendered, two
    bytes for a list, an empty object for 0, and a dict's TypeError burned every retry."""
    from airflow.sdk import task

    names = {"repository": repo.name, "branch": "main", "retries": 2, "retry_delay": timedelta(0)}
    refused = {"count": "{{ ti.xcom_pull(task_ids='rows') }}", "ints": [1, 2], "zero": 0}
    with DAG("bw_upload_types", schedule=None, render_template_as_native_obj=True) as dag:

        @task
        def rows() -> int:
            return 3

        counted = rows()
        for name, data in {**refused, "mapping": {"a": 1}}.items():
            upload = BranchwaterUploadOperator(task_id=name, path=f"{name}.bin", data=data, **names)
            counted >> upload
        BranchwaterUploadOperator(
            task_id="bytearray", path="ba.bin", data=bytearray(b"\x00ab"), **names
        )
        BranchwaterUploadOperator(
            task_id="memoryview", path="mv.bin", data=memoryview(b"mv"), **names
        )

    result = run_dag(dag)

    output = capfd.readouterr().out
    failed = {*refused, "mapping"}
    assert {t: s for t, s in result.states.items() if s == "failed"} == dict.fromkeys(
        failed, "failed"
    )
    for name, type_name in [("count", "int"), ("ints", "list"), ("zero", "int")]:
        assert result.tries[name] == 1, name
        assert (
            f"InvalidArgument: task {name!r}: data must be text (str) or bytes (bytes, "
            f"bytearray, memoryview), not {type_name}"
        ) in output
    assert result.tries["mapping"] == 1
    assert "task 'mapping': data must be text (str) or bytes" in output
    main = repo.branch("main")
    assert {e.path for e in main.list()} == {"base.csv", "ba.bin", "mv.bin"}
    assert main.read("ba.bin") == b"\x00ab"
    assert main.read("mv.bin") == b"mv"
