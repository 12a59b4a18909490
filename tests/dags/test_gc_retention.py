"""The GC DAGs' retention param: each repository's rules decide by default, one part may be
chosen, the mark passes the choice to the job and its XCom names the rules it used."""

from __future__ import annotations

import pytest

from branchwater.engine.gc.runs.files import RunSummary, Volume
from tests.dags.test_gc import gc_dag

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
