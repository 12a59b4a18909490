"""Revert, cherry-pick, reset, record-check and preview-then-publish merges (issue 39, item 7)
run by Airflow through `dag.test()` on a real lake: templated fields, XCom values, and tries
that lose their worker after the engine call, which must not do the work twice."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

import pytest
from airflow.sdk import DAG

from branchwater.engine import InvalidArgument, Repository, failpoints
from branchwater.engine.graveler.merge import PREVIEW_KEY
from branchwater.engine.graveler.picks import CHERRY_PICK_KEY, REVERT_KEY
from branchwater.plugin.operators import (
    BranchwaterCherryPickOperator,
    BranchwaterMergeOperator,
    BranchwaterRecordCheckOperator,
    BranchwaterResetOperator,
    BranchwaterRevertOperator,
)

if TYPE_CHECKING:
    from airflow.sdk import Context

    from tests.plugin.conftest import LakeConnection, RunDag

pytestmark = [pytest.mark.airflow, pytest.mark.slow]

RETRY = {"retries": 1, "retry_delay": timedelta(seconds=0)}
DAY = datetime(2026, 11, 20, tzinfo=timezone.utc)


class LosesWorkerAfterwards:
    """The first try fails after its work is done, as a worker lost between the engine call
    and Airflow recording the result."""

    def execute_on(self, repo: Repository, context: Context) -> Any:
        result = super().execute_on(repo, context)  # type: ignore[misc]
        if context["ti"].try_number == 1:
            raise RuntimeError("worker lost after the work was done")
        return result


class FlakyRevert(BranchwaterRevertOperator):
    """Loses its worker after the revert, and meanwhile `bad.csv` is written again on the
    branch: reverting a second time would conflict, so the retry must find its revert."""

    def execute_on(self, repo: Repository, context: Context) -> Any:
        result = super().execute_on(repo, context)
        if context["ti"].try_number == 1:
            commit(repo, self.branch, "bad.csv again", **{"bad.csv": b"rewritten"})
            raise RuntimeError("worker lost after the work was done")
        return result


class FlakyCherryPick(LosesWorkerAfterwards, BranchwaterCherryPickOperator):
    pass


class FlakyReset(LosesWorkerAfterwards, BranchwaterResetOperator):
    pass


class FlakyRecordCheck(LosesWorkerAfterwards, BranchwaterRecordCheckOperator):
    pass


class FlakyMerge(LosesWorkerAfterwards, BranchwaterMergeOperator):
    pass


def commit(repo: Repository, branch: str, message: str, **files: bytes) -> str:
    handle = repo.branch(branch)
    for path, data in files.items():
        handle.upload(path, data)
    return handle.commit(message).id


def test_a_revert_and_a_cherry_pick_retried_after_their_work_commit_once(
    run_dag: RunDag, lake_conn: LakeConnection, repo: Repository
) -> None:
    bad = commit(repo, "main", "bad load", **{"bad.csv": b"bad"})
    repo.create_branch("fix", source=repo.ref("main~1").commit_id)
    fix = commit(repo, "fix", "the fix", **{"fix.csv": b"fix"})
    commit(repo, "main", "later", **{"later.csv": b"later"})

    def undo(revert_class: type, pick_class: type) -> DAG:
        with DAG("bw_undo", schedule=None, params={"bad": bad}) as dag:
            revert = revert_class(
                task_id="revert",
                repository=repo.name,
                branch="main",
                commit="{{ params.bad }}",
                metadata={"ticket": "T-{{ params.bad[:4] }}"},
                **RETRY,
            )
            pick = pick_class(
                task_id="pick", repository=repo.name, branch="main", commit="fix", **RETRY
            )
            revert >> pick
        return dag

    dag = undo(FlakyRevert, FlakyCherryPick)
    result = run_dag(dag, logical_date=DAY)

    assert result.state == "success", result.states
    assert result.tries == {"revert": 2, "pick": 2}
    picked = repo.commit(result.value("pick"))
    reverted = repo.commit(result.value("revert"))
    assert repo.commit(picked.parents[0]).parents == (reverted.id,)
    assert reverted.metadata[REVERT_KEY] == bad
    assert reverted.metadata["ticket"] == f"T-{bad[:4]}"
    assert reverted.metadata["airflow.try_number"] == "1"
    assert picked.metadata[CHERRY_PICK_KEY] == fix
    main = repo.branch("main")
    assert main.commit_id == picked.id
    assert {e.path for e in main.list()} == {"base.csv", "later.csv", "fix.csv", "bad.csv"}
    assert main.read("bad.csv") == b"rewritten"
    assert result.rendered["revert"]["commit"] == bad

    history = [c.id for c in repo.log("main")]
    rerun = run_dag(
        undo(BranchwaterRevertOperator, BranchwaterCherryPickOperator), logical_date=DAY
    )
    assert rerun.state == "success", rerun.states
    assert (rerun.run_id, rerun.value("revert")) == (result.run_id, reverted.id)
    assert [c.id for c in repo.log("main")] == history


def test_a_rerun_given_other_commits_to_revert_and_pick_does_so(
    run_dag: RunDag, lake_conn: LakeConnection, repo: Repository
) -> None:
    """Run 1 reverts bad1 and picks fix1; its rerun, given bad2 and fix2, found run 1's
    commits ("made this revert already") and left bad2 on main without fix2."""
    repo.create_branch("fix")
    fixes = [commit(repo, "fix", name, **{f"{name}.csv": name.encode()}) for name in ("f1", "f2")]
    bads = [commit(repo, "main", name, **{f"{name}.csv": name.encode()}) for name in ("b1", "b2")]
    with DAG("bw_undo_other", schedule=None, params={"bad": bads[0], "fix": fixes[0]}) as dag:
        BranchwaterRevertOperator(
            task_id="revert", repository=repo.name, branch="main", commit="{{ params.bad }}"
        ) >> BranchwaterCherryPickOperator(
            task_id="pick", repository=repo.name, branch="main", commit="{{ params.fix }}"
        )
    main = repo.branch("main")

    first = run_dag(dag, logical_date=DAY)
    assert first.state == "success", first.states
    assert {e.path for e in main.list()} == {"base.csv", "b2.csv", "f1.csv"}

    other = {"bad": bads[1], "fix": fixes[1]}
    rerun = run_dag(dag, other, logical_date=DAY)

    assert rerun.state == "success", rerun.states
    assert rerun.run_id == first.run_id
    reverted, picked = repo.commit(rerun.value("revert")), repo.commit(rerun.value("pick"))
    assert reverted.metadata[REVERT_KEY] == bads[1]
    assert picked.metadata[CHERRY_PICK_KEY] == fixes[1]
    assert {e.path for e in main.list()} == {"base.csv", "f1.csv", "f2.csv"}
    history = [c.id for c in repo.log("main")]
    assert history[:2] == [picked.id, reverted.id]
    again = run_dag(dag, other, logical_date=DAY)
    assert again.state == "success", again.states
    assert (again.value("revert"), again.value("pick")) == (reverted.id, picked.id)
    assert [c.id for c in repo.log("main")] == history


class FlakyRevertOfHead(LosesWorkerAfterwards, BranchwaterRevertOperator):
    pass


def test_a_revert_of_a_moving_ref_retried_after_its_work_does_not_revert_its_revert(
    run_dag: RunDag, lake_conn: LakeConnection, repo: Repository
) -> None:
    """`commit="main"` names the revert itself once it ran: the retry looks for the revert
    of the commit its first try resolved, kept in the task's state store."""
    bad = commit(repo, "main", "bad", **{"bad.csv": b"bad"})
    with DAG("bw_revert_head", schedule=None) as dag:
        FlakyRevertOfHead(
            task_id="revert", repository=repo.name, branch="main", commit="main", **RETRY
        )

    result = run_dag(dag)

    assert result.state == "success", result.states
    assert result.tries["revert"] == 2
    reverted = repo.branch("main").head()
    assert result.value("revert") == reverted.id
    assert reverted.metadata[REVERT_KEY] == bad
    assert reverted.parents == (bad,)


def test_a_reset_retried_after_its_work_stays_at_the_commit_it_first_resolved(
    run_dag: RunDag, lake_conn: LakeConnection, repo: Repository
) -> None:
    first = repo.branch("main").commit_id
    commit(repo, "main", "second", **{"b.csv": b"b"})
    commit(repo, "main", "third", **{"c.csv": b"c"})
    repo.branch("main").upload("wip.csv", b"staged")
    with DAG("bw_reset", schedule=None) as dag:
        FlakyReset(task_id="reset", repository=repo.name, branch="main", to="main~2", **RETRY)

    result = run_dag(dag)

    assert result.state == "success", result.states
    assert result.tries["reset"] == 2
    assert result.value("reset") == first == repo.branch("main").commit_id
    assert list(repo.branch("main").uncommitted()) == []


def test_a_reset_to_a_ref_from_xcom_is_checked_when_it_runs(
    run_dag: RunDag,
    lake_conn: LakeConnection,
    repo: Repository,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """`to` from an upstream task (a `@task`'s result, `.output`) is known only when the
    reset runs: the DAG parses, the ref resolves, and one naming no ref fails at once."""
    from airflow.sdk import task

    with pytest.raises(InvalidArgument, match="task 'reset': to must name a ref, not ''"):
        BranchwaterResetOperator(task_id="reset", repository=repo.name, branch="dev", to="")
    first = repo.branch("main").commit_id
    commit(repo, "main", "second", **{"b.csv": b"b"})
    repo.create_branch("dev")
    repo.create_branch("other")
    with DAG("bw_reset_xcom", schedule=None) as dag:

        @task
        def chosen(ref: str) -> str:
            return ref

        BranchwaterResetOperator(
            task_id="reset", repository=repo.name, branch="dev", to=chosen("main~1"), **RETRY
        )
        BranchwaterResetOperator(
            task_id="reset_to_nothing",
            repository=repo.name,
            branch="other",
            to=chosen.override(task_id="nothing")(""),
            **RETRY,
        )

    result = run_dag(dag)

    assert result.states["reset"] == "success"
    assert result.value("reset") == first == repo.branch("dev").commit_id
    assert result.states["reset_to_nothing"] == "failed"
    assert result.tries["reset_to_nothing"] == 1
    assert "InvalidArgument: to must name a ref, not ''" in capfd.readouterr().out
    assert repo.branch("other").commit_id != first


def test_a_check_recorded_again_by_a_retry_is_the_same_and_a_different_one_fails_at_once(
    run_dag: RunDag,
    lake_conn: LakeConnection,
    repo: Repository,
    capfd: pytest.CaptureFixture[str],
) -> None:
    head = repo.branch("main").commit_id
    with DAG("bw_check", schedule=None) as dag:
        FlakyRecordCheck(
            task_id="quality",
            repository=repo.name,
            commit="main",
            name="quality",
            passed="{{ 'true' }}",
            details='{"rows": 12, "report": "s3://reports/1.html"}',
            **RETRY,
        )
    result = run_dag(dag)
    assert result.state == "success", result.states
    assert result.tries["quality"] == 2
    recorded = result.value("quality")
    assert recorded["passed"] is True and recorded["commit_id"] == head
    (check,) = repo.checks(head)
    assert check.details == {"rows": 12, "report": "s3://reports/1.html"}
    assert check.recorded_by == f"airflow:bw_check/{result.run_id}/quality"

    with DAG("bw_check_again", schedule=None) as other:
        BranchwaterRecordCheckOperator(
            task_id="quality",
            repository=repo.name,
            commit=head,
            name="quality",
            passed=False,
            **RETRY,
        )
    refused = run_dag(other)
    assert refused.states == {"quality": "failed"}
    assert refused.tries["quality"] == 1
    assert "checks cannot be rewritten" in capfd.readouterr().out
    assert repo.checks(head) == [check]


def test_check_details_nested_deeper_than_the_parser_goes_fail_the_task_and_record_nothing(
    run_dag: RunDag,
    lake_conn: LakeConnection,
    repo: Repository,
    capfd: pytest.CaptureFixture[str],
) -> None:
    with DAG("bw_check_deep", schedule=None) as dag:
        BranchwaterRecordCheckOperator(
            task_id="quality",
            repository=repo.name,
            commit="main",
            name="quality",
            passed=True,
            details="[" * 100_000 + "]" * 100_000,
            **RETRY,
        )
    refused = run_dag(dag)
    assert refused.states == {"quality": "failed"}
    assert refused.tries["quality"] == 1
    refused = "task 'quality': details must be a mapping or the JSON text of an object, not the"
    assert f"{refused} text '[[[" in capfd.readouterr().out
    assert repo.checks(repo.branch("main").commit_id) == []


def test_a_preview_then_publish_merge_previews_again_when_main_moves_and_commits_once(
    run_dag: RunDag, lake_conn: LakeConnection, repo: Repository
) -> None:
    repo.create_branch("etl")
    commit(repo, "etl", "etl load", **{"etl.csv": b"etl"})
    moved: list[str] = []

    def commit_on_main_once() -> None:
        if not moved:
            moved.append(commit(repo, "main", "meanwhile", **{"m.csv": b"m"}))

    with DAG("bw_wap", schedule=None) as dag:
        FlakyMerge(
            task_id="merge",
            repository=repo.name,
            source_ref="etl",
            preview_then_publish=True,
            **RETRY,
        )
    with failpoints.armed("publish.before_set", commit_on_main_once):
        result = run_dag(dag)

    assert result.state == "success", result.states
    assert result.tries["merge"] == 2
    merged = repo.branch("main").head()
    assert result.value("merge") == merged.id
    assert merged.parents == (moved[0], repo.branch("etl").commit_id)
    assert merged.metadata[PREVIEW_KEY] == "main"
    assert merged.metadata["airflow.try_number"] == "1"
    assert {e.path for e in repo.branch("main").list()} == {"base.csv", "etl.csv", "m.csv"}


def test_preview_then_publish_takes_no_fast_forward() -> None:
    with pytest.raises(InvalidArgument, match=r"task 'merge': .* takes no fast_forward"):
        BranchwaterMergeOperator(
            task_id="merge",
            repository="r",
            source_ref="etl",
            preview_then_publish=True,
            fast_forward=True,
        )


def test_a_protected_main_takes_a_preview_then_publish_merge_only_once_its_check_passed(
    run_dag: RunDag,
    lake_conn: LakeConnection,
    repo: Repository,
    capfd: pytest.CaptureFixture[str],
) -> None:
    repo.create_branch("etl")
    commit(repo, "etl", "etl load", **{"etl.csv": b"etl"})
    repo.protect("main", no_direct_writes=True, required_checks=["quality"], no_reset=True)
    before = repo.branch("main").commit_id
    names = {"repository": repo.name, **RETRY}

    with DAG("bw_unchecked", schedule=None) as unchecked:
        BranchwaterMergeOperator(
            task_id="merge", source_ref="etl", preview_then_publish=True, **names
        )
        BranchwaterResetOperator(task_id="reset", branch="main", to="main~1", **names)
    refused = run_dag(unchecked)
    assert refused.states == {"merge": "failed", "reset": "failed"}
    assert refused.tries == {"merge": 1, "reset": 1}
    output = capfd.readouterr().out
    assert "ChecksMissing" in output and "missing quality" in output
    assert "BranchProtected" in output
    assert repo.branch("main").commit_id == before

    with DAG("bw_checked", schedule=None) as checked:
        BranchwaterRecordCheckOperator(
            task_id="quality", commit="etl", name="quality", passed=True, **names
        ) >> BranchwaterMergeOperator(
            task_id="merge", source_ref="etl", preview_then_publish=True, **names
        )
    result = run_dag(checked)
    assert result.state == "success", result.states
    merged = repo.branch("main").head()
    assert result.value("merge") == merged.id
    assert merged.parents == (before, repo.branch("etl").commit_id)
