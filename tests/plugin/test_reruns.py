"""The rerun matrix of the README's pattern (repository → branch → load → commit → merge →
cleanup), through `dag.test()`: a DAG run whose task failed after or before its work, rerun
under the same run id as clearing it does, and reruns after a real merge or another run's
merge, all end `success` with the commit and merge of one good run, and no branch left."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from airflow.sdk import DAG

from branchwater.plugin.operators import (
    BranchwaterCommitOperator,
    BranchwaterCreateBranchOperator,
    BranchwaterCreateRepositoryOperator,
    BranchwaterDeleteBranchOperator,
    BranchwaterMergeOperator,
    BranchwaterUploadOperator,
)
from branchwater.plugin.operators.commits import ATTEMPTS_KEY

if TYPE_CHECKING:
    from airflow.sdk import Context

    from branchwater.engine import Repository
    from tests.plugin.conftest import LakeConnection, RunDag

pytestmark = [pytest.mark.airflow, pytest.mark.slow]

REPOSITORY = "orders"
DAY1, DAY2 = (datetime(2026, 11, day, tzinfo=timezone.utc) for day in (20, 21))


class FailsAfterItsWork:
    """A worker lost between the engine call and Airflow recording the result."""

    def run(self, context: Context) -> Any:
        super().run(context)  # type: ignore[misc]
        raise RuntimeError(f"{context['ti'].task_id}: worker lost after the work was done")


class FailsBeforeItsWork:
    def execute_on(self, repo: Repository, context: Context) -> Any:
        raise RuntimeError(f"{context['ti'].task_id}: worker lost before the work")


class CreateRepositoryThenFail(FailsAfterItsWork, BranchwaterCreateRepositoryOperator):
    pass


class CreateBranchThenFail(FailsAfterItsWork, BranchwaterCreateBranchOperator):
    pass


class UploadThenFail(FailsAfterItsWork, BranchwaterUploadOperator):
    pass


class CommitThenFail(FailsAfterItsWork, BranchwaterCommitOperator):
    pass


class MergeThenFail(FailsAfterItsWork, BranchwaterMergeOperator):
    pass


class DeleteThenFail(FailsAfterItsWork, BranchwaterDeleteBranchOperator):
    pass


class FailBeforeMerging(FailsBeforeItsWork, BranchwaterMergeOperator):
    pass


class MainMovesFirst(BranchwaterMergeOperator):
    """`main` gets another commit between the branch's creation and its merge, so the merge
    is a real one, not one that could fast-forward."""

    def execute_on(self, repo: Repository, context: Context) -> Any:
        main = repo.branch("main")
        main.upload(f"elsewhere/{context['ds']}.csv", b"elsewhere")
        main.commit("elsewhere")
        return super().execute_on(repo, context)


FAILING_AFTER = {
    "repository": CreateRepositoryThenFail,
    "branch": CreateBranchThenFail,
    "load": UploadThenFail,
    "commit": CommitThenFail,
    "merge": MergeThenFail,
    "cleanup": DeleteThenFail,
}


def daily_orders(exports: Path, **classes: type) -> DAG:
    """The README's DAG, with the classes of some tasks replaced, and no retries: a failed
    try fails the run."""
    repo = {"repository": REPOSITORY}
    branch = "orders-{{ ds_nodash }}"

    def task(task_id: str, default: type, **kwargs: Any) -> Any:
        return classes.get(task_id, default)(task_id=task_id, **repo, **kwargs)

    with DAG("bw_daily_orders", schedule="@daily") as dag:
        (
            task("repository", BranchwaterCreateRepositoryOperator)
            >> task("branch", BranchwaterCreateBranchOperator, branch=branch)
            >> task(
                "load",
                BranchwaterUploadOperator,
                branch=branch,
                path="orders/{{ ds }}.csv",
                filename=f"{exports}/{{{{ ds }}}}.csv",
            )
            >> task(
                "commit", BranchwaterCommitOperator, branch=branch, message="Orders of {{ ds }}"
            )
            >> task("merge", BranchwaterMergeOperator, source_ref=branch)
            >> task("cleanup", BranchwaterDeleteBranchOperator, branch=branch)
        )
    return dag


@pytest.fixture
def exports(tmp_path: Path) -> Path:
    folder = tmp_path / "exports"
    folder.mkdir()
    for day in (DAY1, DAY2):
        (folder / f"{day.date().isoformat()}.csv").write_text(f"id\n{day.day}\n")
    return folder


def one_good_run(repo: Repository, run_id: str) -> None:
    """What `main` and the branches hold of run `run_id`: its commit and its merge, once,
    and no branch of its own left."""
    made = list(repo.log("main", where={"airflow.run_id": run_id}))
    assert [c.metadata["airflow.task_id"] for c in made] == ["merge", "commit"]
    assert made[0].parents[1] == made[1].id
    assert [b.name for b in repo.branches()] == ["main"]


def history(repo: Repository) -> list[str]:
    return [c.id for c in repo.log("main")]


def rerun_adds_nothing(run_dag: RunDag, exports: Path, repo: Repository, day: datetime) -> None:
    before = history(repo)
    rerun = run_dag(daily_orders(exports), logical_date=day)
    assert rerun.state == "success", rerun.states
    assert history(repo) == before
    assert rerun.value("merge", ATTEMPTS_KEY) == 0
    one_good_run(repo, rerun.run_id)


@pytest.mark.parametrize("failing", list(FAILING_AFTER))
def test_a_run_that_failed_after_a_tasks_work_reruns_to_one_good_run(
    run_dag: RunDag, lake_conn: LakeConnection, exports: Path, failing: str
) -> None:
    failed = run_dag(daily_orders(exports, **{failing: FAILING_AFTER[failing]}), logical_date=DAY1)
    assert failed.state == "failed"
    assert failed.states[failing] == "failed"

    rerun = run_dag(daily_orders(exports), logical_date=DAY1)

    assert rerun.state == "success", rerun.states
    assert rerun.run_id == failed.run_id
    repo = lake_conn.lake.repository(REPOSITORY)
    one_good_run(repo, rerun.run_id)
    assert repo.branch("main").read("orders/2026-11-20.csv") == b"id\n20\n"
    rerun_adds_nothing(run_dag, exports, repo, DAY1)


def test_reruns_after_a_real_merge_add_nothing(
    run_dag: RunDag, lake_conn: LakeConnection, exports: Path
) -> None:
    first = run_dag(daily_orders(exports, merge=MainMovesFirst), logical_date=DAY1)
    assert first.state == "success", first.states
    repo = lake_conn.lake.repository(REPOSITORY)
    merged = repo.commit(first.value("merge"))
    assert repo.commit(merged.parents[0]).message == "elsewhere"

    rerun_adds_nothing(run_dag, exports, repo, DAY1)
    second = run_dag(daily_orders(exports), logical_date=DAY2)
    assert second.state == "success", second.states
    rerun_adds_nothing(run_dag, exports, repo, DAY1)


def test_a_run_rerun_after_another_runs_merge_merges_once(
    run_dag: RunDag, lake_conn: LakeConnection, exports: Path
) -> None:
    """Day 1 stops before its merge, day 2 runs and merges, then day 1 is rerun: it keeps its
    branch and commit, merges onto day 2, and a rerun after that adds nothing."""
    failed = run_dag(daily_orders(exports, merge=FailBeforeMerging), logical_date=DAY1)
    assert failed.states["merge"] == "failed"
    second = run_dag(daily_orders(exports), logical_date=DAY2)
    assert second.state == "success", second.states

    rerun = run_dag(daily_orders(exports), logical_date=DAY1)

    assert rerun.state == "success", rerun.states
    repo = lake_conn.lake.repository(REPOSITORY)
    assert rerun.value("commit") == failed.value("commit")
    merged = repo.commit(rerun.value("merge"))
    assert merged.parents == (second.value("merge"), failed.value("commit"))
    one_good_run(repo, rerun.run_id)
    rerun_adds_nothing(run_dag, exports, repo, DAY1)
    rerun_adds_nothing(run_dag, exports, repo, DAY2)


def test_the_search_for_an_earlier_commit_is_bounded_and_on_no_changes_fail_says_so(
    run_dag: RunDag, lake_conn: LakeConnection, exports: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    """Looking one commit deep, a rerun of day 1 after day 2 does not reach its own commit,
    and `on_no_changes="fail"` fails it at once; looking as deep as by default, it does."""
    for day in (DAY1, DAY2):
        assert run_dag(daily_orders(exports), logical_date=day).state == "success"
    repo = lake_conn.lake.repository(REPOSITORY)
    before = history(repo)
    strict = {"lookup_depth": 1, "on_no_changes": "fail", "retries": 2}

    class StrictCommit(BranchwaterCommitOperator):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(**{**kwargs, **strict})

    failed = run_dag(daily_orders(exports, commit=StrictCommit), logical_date=DAY1)

    assert failed.states["commit"] == "failed"
    assert failed.tries["commit"] == 1
    assert "NoChanges: nothing to commit on branch 'orders-20261120'" in capfd.readouterr().out
    shallow = run_dag(daily_orders(exports), logical_date=DAY1)
    assert shallow.state == "success", shallow.states
    assert history(repo) == before
    assert [b.name for b in repo.branches()] == ["main"]


class FastForward(BranchwaterMergeOperator):
    """The README's merge with `fast_forward=True`: no merge commit, nothing recorded."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**{**kwargs, "fast_forward": True})


def test_a_fast_forward_merge_rerun_after_a_later_day_returns_its_own_days_commit(
    run_dag: RunDag, lake_conn: LakeConnection, exports: Path
) -> None:
    """Day 1's rerun re-creates its branch at day 2's commit, which `main` is at: the merge
    finds its source contained and returned `main`'s HEAD, day 2's commit."""
    first = run_dag(daily_orders(exports, merge=FastForward), logical_date=DAY1)
    assert first.state == "success", first.states
    assert first.value("merge") == first.value("commit")
    second = run_dag(daily_orders(exports, merge=FastForward), logical_date=DAY2)
    assert second.state == "success", second.states
    repo = lake_conn.lake.repository(REPOSITORY)
    before = history(repo)
    assert before[0] == second.value("merge") == second.value("commit")

    rerun = run_dag(daily_orders(exports, merge=FastForward), logical_date=DAY1)

    assert rerun.state == "success", rerun.states
    assert rerun.run_id == first.run_id
    assert rerun.value("commit") == first.value("commit")
    assert rerun.value("merge") == first.value("merge")
    assert history(repo) == before
    assert [b.name for b in repo.branches()] == ["main"]


class FastForwardThenMainMoves(FastForward):
    """Retried; its first try fast-forwards `main`, someone else commits on `main`, and the
    worker is lost before Airflow records the result."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**{**kwargs, "retries": 1, "retry_delay": timedelta(seconds=0)})

    def execute_on(self, repo: Repository, context: Context) -> Any:
        result = super().execute_on(repo, context)
        if context["ti"].try_number == 1:
            elsewhere(repo)
            raise RuntimeError("worker lost after the fast-forward")
        return result


class FastForwardLostBeforeItsRecord(FastForwardThenMainMoves):
    """As above, the worker lost right after the engine's fast-forward, before the task kept
    it in its state store: the retry finds it in the source's history."""

    def execute_on(self, repo: Repository, context: Context) -> Any:
        return BranchwaterMergeOperator.execute_on(self, repo, context)

    def merge(self, repo: Repository, into: str, hint: str | None, context: Context) -> Any:
        result = super().merge(repo, into, hint, context)
        if context["ti"].try_number == 1:
            elsewhere(repo)
            raise RuntimeError("worker lost right after the fast-forward")
        return result


def elsewhere(repo: Repository) -> str:
    main = repo.branch("main")
    main.upload("elsewhere.csv", b"elsewhere")
    return main.commit("someone else's commit").id


@pytest.mark.parametrize("merge", [FastForwardThenMainMoves, FastForwardLostBeforeItsRecord])
def test_a_fast_forward_merge_retried_after_main_moved_on_returns_its_own_commit(
    run_dag: RunDag, lake_conn: LakeConnection, exports: Path, merge: type
) -> None:
    result = run_dag(daily_orders(exports, merge=merge), logical_date=DAY1)

    assert result.state == "success", result.states
    assert result.tries["merge"] == 2
    repo = lake_conn.lake.repository(REPOSITORY)
    head = repo.branch("main").head()
    assert head.message == "someone else's commit"
    assert result.value("merge") == result.value("commit") == head.parents[0]
