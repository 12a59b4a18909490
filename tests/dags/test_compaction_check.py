"""`branchwater_compaction_check`, run for real by `dag.test()`: every branch of the
configured repositories is checked, exactly the due ones are compacted."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from branchwater.demo.airflow_home import DAGS_FOLDER
from branchwater.engine import Repository
from tests.plugin.conftest import LakeConnection, RunDag

if TYPE_CHECKING:
    from airflow.sdk import DAG

pytestmark = [pytest.mark.airflow, pytest.mark.slow]


def compaction_check() -> DAG:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=DAGS_FOLDER / "branchwater_compaction_check.py")
    assert bag.import_errors == {}
    dag: DAG = bag.dags["branchwater_compaction_check"]
    return dag


def with_tombstones(repo: Repository, branch: str, count: int) -> None:
    """A branch whose staging area holds `count` tombstones of committed objects."""
    created = repo.create_branch(branch)
    for i in range(count):
        created.upload(f"{branch}/{i}.csv", b"x")
    created.commit(f"{count} objects")
    for i in range(count):
        created.delete(f"{branch}/{i}.csv")


@pytest.mark.parametrize(
    "kv_url", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
def test_exactly_the_due_branches_are_compacted(run_dag: RunDag, lake_conn: LakeConnection) -> None:
    repos = [lake_conn.create_repository("cc-") for _ in range(2)]
    with_tombstones(repos[0], "many", 5)
    with_tombstones(repos[0], "few", 2)
    with_tombstones(repos[1], "also-many", 6)
    ignored = lake_conn.create_repository("cc-ignored-")
    with_tombstones(ignored, "many", 5)

    result = run_dag(
        compaction_check(),
        {"repositories": [r.name for r in repos], "max_tombstones": 4, "max_sealed_tokens": 8},
    )

    assert result.state == "success", result.states
    listed = result.value("branches")
    assert sorted((b["repository"], b["branch"]) for b in listed) == sorted(
        [(repos[0].name, b) for b in ("few", "main", "many")]
        + [(repos[1].name, b) for b in ("also-many", "main")]
    )
    compacted = {
        (repo.name, status.branch)
        for repo in [*repos, ignored]
        for status in repo.compaction_status()
        if status.compacted
    }
    assert compacted == {(repos[0].name, "many"), (repos[1].name, "also-many")}
    for i, branch in enumerate(listed):
        due = (branch["repository"], branch["branch"]) in compacted
        assert result.states[f"compaction.due[{i}]"] == ("success" if due else "skipped")
        assert result.states[f"compaction.compact[{i}]"] == ("success" if due else "skipped")
        if due:
            assert result.value(f"compaction.due[{i}]")["reasons"] == [
                f"{5 if branch['branch'] == 'many' else 6} staged tombstones >= 4"
            ]
            done = result.value(f"compaction.compact[{i}]")
            assert (done["outcome"], done["compacted"]) == ("compacted", True)
            # Numbers, which Airflow does not mask as it would a string under a token's key.
            policy = {"max_tombstones": 4, "max_sealed_tokens": 8, "scan_budget": 100_000}
            assert result.rendered[f"compaction.compact[{i}]"]["policy"] == policy
            assert result.rendered[f"compaction.due[{i}]"]["policy"] == policy
    assert [e.path for e in repos[0].branch("many").list(prefix="many/")] == []
    assert len(list(repos[0].branch("many").uncommitted())) == 5


@pytest.mark.parametrize(
    ("thresholds", "due"),
    [({"max_tombstones": 200_000}, False), ({"max_tombstones": 4.0}, True)],
    ids=["above the default scan budget", "an integer given as 4.0"],
)
def test_thresholds_a_dag_run_can_be_given_check_every_branch(
    run_dag: RunDag, lake_conn: LakeConnection, thresholds: dict[str, float], due: bool
) -> None:
    """Both failed every branch's check: the sensor could not count past its default scan
    budget, and `2.0` (REST or CLI conf) was no number to the policy."""
    repo = lake_conn.create_repository("cc-")
    with_tombstones(repo, "many", 5)

    result = run_dag(compaction_check(), {"repositories": [repo.name], **thresholds})

    assert result.state == "success", result.states
    statuses = {status.branch: status.compacted for status in repo.compaction_status()}
    assert statuses["many"] is due
