"""`branchwater_compaction_check`, run for real by `dag.test()`: every branch of the
configured repositories is checked, exactly the due ones are compacted, at most
`[core] max_map_length` a run."""

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
    compacted = {
        (repo.name, status.branch)
        for repo in [*repos, ignored]
        for status in repo.compaction_status()
        if status.compacted
    }
    assert compacted == {(repos[0].name, "many"), (repos[1].name, "also-many")}
    # Most staged tombstones first; branches not due cost no task instance.
    assert result.value("due") == [
        {"repository": repos[1].name, "branch": "also-many"},
        {"repository": repos[0].name, "branch": "many"},
    ]
    assert sorted(result.states) == ["compact[0]", "compact[1]", "due"]
    for i in range(2):
        done = result.value(f"compact[{i}]")
        assert (done["outcome"], done["compacted"]) == ("compacted", True)
        # Numbers, which Airflow does not mask as it would a string under a token's key.
        policy = {"max_tombstones": 4, "max_sealed_tokens": 8, "scan_budget": 100_000}
        assert result.rendered[f"compact[{i}]"]["policy"] == policy
    assert [e.path for e in repos[0].branch("many").list(prefix="many/")] == []
    assert len(list(repos[0].branch("many").uncommitted())) == 5


def test_a_run_maps_at_most_max_map_length_branches_and_the_next_takes_the_rest(
    run_dag: RunDag, lake_conn: LakeConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Mapping every branch failed the whole run past `[core] max_map_length`."""
    monkeypatch.setenv("AIRFLOW__CORE__MAX_MAP_LENGTH", "2")
    repo = lake_conn.create_repository("cc-")
    for branch, count in (("three", 3), ("five", 5), ("four", 4)):
        with_tombstones(repo, branch, count)
    params = {"repositories": [repo.name], "max_tombstones": 2}

    first = run_dag(compaction_check(), params)
    second = run_dag(compaction_check(), params)

    assert first.state == second.state == "success", (first.states, second.states)
    assert [b["branch"] for b in first.value("due")] == ["five", "four"]
    assert [b["branch"] for b in second.value("due")] == ["three"]
    statuses = {status.branch: status.compacted for status in repo.compaction_status()}
    assert statuses == {"main": False, "three": True, "four": True, "five": True}


def test_a_run_with_nothing_due_maps_no_compactor(
    run_dag: RunDag, lake_conn: LakeConnection
) -> None:
    repo = lake_conn.create_repository("cc-")
    with_tombstones(repo, "few", 1)

    result = run_dag(compaction_check(), {"repositories": [repo.name], "max_tombstones": 4})

    assert result.state == "success", result.states
    assert result.value("due") == []
    assert result.states["compact"] == "skipped"


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
