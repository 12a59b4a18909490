"""The GC DAGs' retention param: each repository's rules decide by default, one part may be
chosen, the mark passes the choice to the job and its XCom names the rules it used; and one
retention run end to end through `dag.test()` (a mark and a sweep, each a `spark-submit`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from branchwater.demo.main_job import gc_task
from branchwater.engine import CommitExpired
from branchwater.engine.gc.addresses import AddressAllocator
from branchwater.engine.gc.runs.files import RunSummary, Volume
from tests.dags.test_gc import assert_tasks, gc_dag
from tests.helpers.gc import FakeClock, data_objects, put_garbage
from tests.plugin.conftest import LakeConnection, RunDag

GC_DAGS = ("branchwater_gc_clean", "branchwater_gc_optimized")


@pytest.mark.parametrize("dag_id", GC_DAGS)
def test_the_retention_param_reaches_the_mark(dag_id: str) -> None:
    from airflow.sdk.definitions.param import ParamValidationError

    dag = gc_dag(dag_id)
    param = dag.params.get_param("branchwater_gc_retention")
    assert param.resolve("rules") == "rules"
    assert param.resolve("committed") == "committed"
    with pytest.raises(ParamValidationError):
        param.resolve("everything")
    mark = dag.get_task("collect.mark")
    assert "retention" in mark.template_fields
    assert mark.retention == "{{ params.branchwater_gc_retention }}"


@pytest.mark.parametrize(
    ("retention", "only"),
    [("rules", None), ("uncommitted", "uncommitted"), ("committed", "committed")],
)
def test_the_mark_passes_one_part_to_the_job(retention: str, only: str | None) -> None:
    from branchwater.plugin.operators import BranchwaterGCMarkOperator

    mark = BranchwaterGCMarkOperator(
        task_id="mark", repository="sales", prepare_run="r1", retention=retention
    )
    arguments = mark.job_arguments()
    assert (arguments[arguments.index("--only") + 1] if "--only" in arguments else None) == only


def test_the_mark_record_names_the_rules_it_used() -> None:
    from branchwater.plugin.operators.gc import summary_record

    rules = {"default_retention_days": 30, "branches": []}
    summary = RunSummary(
        "18f2a9c3b7d1-a1b2c3",
        "sales",
        "u",
        "file:///ns",
        "clean",
        "clean",
        False,
        "",
        "",
        "",
        0.0,
        0.0,
        counts={"expired": Volume(3, 300)},
        retention={
            "parts": ["uncommitted", "committed"],
            "rules": rules,
            "expired_commits": 2,
            "by_month": {"2026-01": {"objects": 3, "bytes": 300}},
        },
    )
    record = summary_record(summary)
    assert (record["expired"], record["expired_bytes"]) == (3, 300)
    assert record["retention"] == {
        "parts": ["uncommitted", "committed"],
        "rules": rules,
        "expired_commits": 2,
    }


@pytest.mark.airflow
@pytest.mark.spark
@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.usefixtures("spark_submit_conf")
def test_a_retention_run_collects_both_parts_end_to_end(
    run_dag: RunDag, lake_conn: LakeConnection
) -> None:
    """A repository with rules whose main rewrote a file months ago, and uncommitted
    garbage: the clean DAG, its retention param left at `rules`, collects both."""
    lake = lake_conn.lake
    months_ago = datetime.now(UTC) - timedelta(days=300)
    lake.addresses = lake.gc.addresses = AddressAllocator(clock=months_ago.timestamp)
    clock = FakeClock(months_ago)
    lake.graveler.refs.clock = clock
    repo = lake_conn.create_repository("gc-")
    main = repo.branch("main")
    expired_only = main.upload("t/a.csv", b"v1").address
    old = main.commit("v1").id
    clock.advance(timedelta(days=1))
    active = {main.upload(path, b"v2").address for path in ("t/a.csv", "t/b.csv")}
    main.commit("v2")
    garbage = set(put_garbage(lake, repo, 2))
    rules = repo.set_gc_rules({"default_retention_days": 30})

    conf = {"repositories": [repo.name], "min_age": "0s", "max_share": 1.0}
    result = run_dag(gc_dag("branchwater_gc_clean"), conf)

    assert result.state == "success"
    assert_tasks(result, 0)
    assert set(data_objects(lake, repo)) == active
    assert {expired_only, *garbage}.isdisjoint(data_objects(lake, repo))
    assert [repo.branch("main").read(p) for p in ("t/a.csv", "t/b.csv")] == [b"v2", b"v2"]
    with pytest.raises(CommitExpired, match=old):
        repo.ref(old)
    assert result.rendered[gc_task("mark", 0)]["retention"] == "rules"
    mark = result.value(gc_task("mark", 0))
    assert mark["retention"]["rules"] == rules.to_json()
    assert mark["retention"]["parts"] == ["uncommitted", "committed"]
    report = result.value(gc_task("report", 0))
    assert (report["deleted"], report["expired"]) == (3, 1)
    page = Path(urlsplit(report["report"]).path).read_text()
    assert "<th>parts</th><td>uncommitted, committed</td>" in page
    assert "Reclaimed bytes per month of commit date" in page
