"""The GC DAGs' retention params: each repository's rules decide, a run may pin the rules it
expects (`branchwater_gc_retention`) and one part may be chosen (`only`); the mark refuses a
repository whose rules are not the pinned ones before the job starts, passes the part to the
job, and its rendered field, XCom and report show the rules it used. One retention run end to
end through `dag.test()` (a mark and a sweep, each a `spark-submit`), beside a repository it
refuses."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from html import escape
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from branchwater.demo.main_job import gc_task
from branchwater.engine import CommitExpired, InvalidGCRules, NotFound
from branchwater.engine.gc.addresses import AddressAllocator
from branchwater.engine.gc.runs.files import RunSummary, Volume
from branchwater.plugin.hooks import BranchwaterHook
from tests.dags.test_gc import assert_tasks, gc_dag
from tests.helpers.gc import FakeClock, data_objects, put_garbage
from tests.plugin.conftest import LakeConnection, RunDag

GC_DAGS = ("branchwater_gc_clean", "branchwater_gc_optimized")
RULES = {"default_retention_days": 30, "branches": [{"branch_id": "main", "retention_days": 30}]}


@pytest.mark.parametrize("dag_id", GC_DAGS)
def test_the_retention_params_reach_the_mark(dag_id: str) -> None:
    from airflow.sdk.definitions.param import ParamValidationError

    dag = gc_dag(dag_id)
    pin = dag.params.get_param("branchwater_gc_retention")
    assert pin.resolve() is None
    assert pin.resolve(RULES) == RULES
    with pytest.raises(ParamValidationError):
        pin.resolve("rules")
    only = dag.params.get_param("only")
    assert only.resolve() == ""
    assert only.resolve("committed") == "committed"
    with pytest.raises(ParamValidationError):
        only.resolve("everything")
    mark = dag.get_task("collect.mark")
    assert {"only", "retention_rules"} <= set(mark.template_fields)
    assert mark.only == "{{ params.only }}"
    assert mark.retention_rules == "{{ params.branchwater_gc_retention | tojson }}"


@pytest.mark.parametrize(
    ("chosen", "only"),
    [("", None), ("None", None), ("uncommitted", "uncommitted"), ("committed", "committed")],
)
def test_the_mark_passes_one_part_to_the_job(chosen: str, only: str | None) -> None:
    from branchwater.plugin.operators import BranchwaterGCMarkOperator

    mark = BranchwaterGCMarkOperator(
        task_id="mark", repository="sales", prepare_run="r1", only=chosen
    )
    arguments = mark.job_arguments()
    assert (arguments[arguments.index("--only") + 1] if "--only" in arguments else None) == only


def test_a_pin_is_the_repositorys_rules_or_a_typed_refusal_naming_both(
    lake_conn: LakeConnection,
) -> None:
    """As the param renders (`tojson`): null pins nothing, the repository's rules pass, other
    rules or rules on a repository without any are `RetentionRulesMismatch` naming both, and
    a document not of the rules' shape is `InvalidGCRules`."""
    from branchwater.plugin.operators.gc import RetentionRulesMismatch, check_pinned, pinned_rules

    repo = lake_conn.create_repository("gc-")
    assert pinned_rules("null") is None and pinned_rules(None) is None
    check_pinned(repo.name, None, repo.gc_rules())
    with pytest.raises(RetentionRulesMismatch, match=r"rules are none \(every commit"):
        check_pinned(repo.name, pinned_rules(json.dumps(RULES)), repo.gc_rules())
    stored = repo.set_gc_rules(RULES)
    check_pinned(repo.name, pinned_rules(json.dumps(RULES)), repo.gc_rules())
    assert pinned_rules(RULES) == stored
    other = {**RULES, "default_retention_days": 7}
    with pytest.raises(RetentionRulesMismatch) as refused:
        check_pinned(repo.name, pinned_rules(other), repo.gc_rules())
    text = str(refused.value)
    assert '"default_retention_days": 7' in text and '"default_retention_days": 30' in text
    assert repo.name in text and "Nothing was marked or deleted" in text
    with pytest.raises(InvalidGCRules, match="unknown key"):
        pinned_rules('{"default_retention_days": 1, "retention": 2}')


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
    run_dag: RunDag, lake_conn: LakeConnection, capfd: pytest.CaptureFixture[str]
) -> None:
    """A repository with rules whose main rewrote a file months ago, and uncommitted
    garbage: the clean DAG, triggered with those rules pinned, collects both parts and shows
    the rules it used. A second repository of the run, whose rules are not the pinned ones,
    fails its mark at once, before the job starts: nothing of it is marked or deleted."""
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
    rules = repo.set_gc_rules(RULES)
    other = lake_conn.create_repository("gc-")
    other_main = other.branch("main")
    other_main.upload("t/a.csv", b"v1")
    other_old = other_main.commit("v1").id
    other_main.upload("t/a.csv", b"v2")
    other_main.commit("v2")
    other.set_gc_rules({**RULES, "default_retention_days": 0})
    other_objects = set(data_objects(lake, other))

    conf = {
        "repositories": [repo.name, other.name],
        "min_age": "0s",
        "max_share": 1.0,
        "branchwater_gc_retention": RULES,
    }
    result = run_dag(gc_dag("branchwater_gc_clean"), conf)

    assert result.state == "failed"
    assert_tasks(result, 0)
    assert set(data_objects(lake, repo)) == active
    assert {expired_only, *garbage}.isdisjoint(data_objects(lake, repo))
    assert [repo.branch("main").read(p) for p in ("t/a.csv", "t/b.csv")] == [b"v2", b"v2"]
    with pytest.raises(CommitExpired, match=old):
        repo.ref(old)
    assert result.rendered[gc_task("mark", 0)]["retention_rules"] == rules.to_json()
    mark = result.value(gc_task("mark", 0))
    assert mark["retention"]["rules"] == rules.to_json()
    assert mark["retention"]["parts"] == ["uncommitted", "committed"]
    report = result.value(gc_task("report", 0))
    assert (report["deleted"], report["expired"]) == (3, 1)
    page = Path(urlsplit(report["report"]).path).read_text()
    assert "<h1>Uncommitted and committed GC (retention) of" in page
    assert "<th>parts</th><td>uncommitted, committed</td>" in page
    assert escape(json.dumps(rules.to_json(), sort_keys=True)) in page
    assert "Reclaimed bytes per month of commit date" in page

    refused = dict(mark="failed", gate="upstream_failed", sweep="upstream_failed")
    assert_tasks(result, 1, **refused, report="upstream_failed")
    assert result.tries[gc_task("mark", 1)] == 1
    output = "".join(capfd.readouterr())
    assert f"RetentionRulesMismatch: GC of {other.name!r} refused" in output
    assert '"default_retention_days": 0' in output and "Nothing was marked" in output
    assert set(data_objects(lake, other)) == other_objects
    assert other.ref(other_old).read("t/a.csv") == b"v1"
    run_id = result.value(gc_task("prepare", 1))["run_id"]
    with pytest.raises(NotFound):
        BranchwaterHook().gc_run(other.name, run_id)
