"""`make demo`'s main job end to end, smaller: concurrent ETL runs merging into `main`, the
compaction check, a clean GC run, more work and an optimized GC run, each a real DAG run
(the concurrent ones each in a process and Airflow home of its own, the others one after
another in one), on the embedded default (SQLite, local files, local Spark).

It is also the test of the GC DAGs' happy path (clean then optimized, each with its sweep):
tests/dags/test_gc.py keeps the failed gate, and tests/stack a dry run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from branchwater.demo.dag_run import RunResult
from branchwater.demo.main_job import REPOSITORY, DemoConfig, DemoLake, gc_task, run
from branchwater.engine import Lake
from tests.helpers.airflow import GC_TASKS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.spark,
    pytest.mark.airflow,
    pytest.mark.timeout(1200),
    pytest.mark.usefixtures("spark_submit_conf"),
]

REPORT_LINK = "_link_BranchwaterGCReportLink"


def check_gc_run(result: RunResult, namespace: str, mode: str) -> dict[str, object]:
    """The run collected the lake's one repository, its tasks all succeeded; the sweep
    deleted what the mark found, and the report is linked."""
    states = {task: result.states[gc_task(task)] for task in GC_TASKS}
    assert states == dict.fromkeys(GC_TASKS, "success")
    assert gc_task("prepare", 1) not in result.states
    run_id = result.value(gc_task("prepare"))["run_id"]
    assert result.rendered[gc_task("mark")]["prepare_run"] == run_id
    assert result.rendered[gc_task("sweep")]["skip_sweep"] == "False"
    swept = result.value(gc_task("sweep"))
    assert (swept["run_id"], swept["status"], swept["mode"]) == (run_id, "swept", mode)
    assert swept["deleted"] == swept["candidates"] > 0
    assert result.value(gc_task("gate"))["gate_success"] is True
    report = result.value(gc_task("report"))["report"]
    assert report.startswith(namespace) and report.endswith(f"/{run_id}/report.html")
    assert result.value(gc_task("report"), REPORT_LINK) == report
    assert "<svg" in Path(report.removeprefix("file://")).read_text()
    return dict(swept)


def test_the_main_job_runs_every_dag_and_says_what_it_did(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "demo"
    root.mkdir()
    (root / "left-over").write_text("a previous demo's file")
    config = DemoConfig(
        root=root,
        etl_runs=2,
        partitions_per_run=1,
        rows=20,
        garbage_objects=12,
        later_garbage_objects=4,
        # Exactly the compaction check's threshold (due at >= it): a tenth of the demo's,
        # since staging each delete costs the test's own process milliseconds.
        tombstones=100,
        compaction_threshold=100,
    )

    summary = run(config)

    out = capsys.readouterr().out
    assert not (root / "left-over").exists(), "a demo starts from a clean folder"
    assert "[6/6]" in out and "[7/" not in out
    assert "merges: 3 from 3 ETL DAG runs" in out, out
    assert "'quality' passed on the commit merged; 3 of 3 merges carried it" in out, out
    assert f"compaction: {config.tombstones} tombstones folded away" in out, out
    assert re.search(r"GC clean run \S+: gate passed", out), out
    assert re.search(r"GC optimized run \S+: gate passed", out), out

    namespace = (DemoLake(root.resolve()).namespace_root / REPOSITORY).as_uri()
    clean = check_gc_run(summary["gc_clean"], namespace, "clean")
    optimized = check_gc_run(summary["gc_optimized"], namespace, "optimized")
    # Exactly each scratch branch's objects (its last overwrite included): the optimized run
    # collects what is new since the clean run and nothing else.
    assert clean["deleted"] == config.garbage_objects + 1
    assert optimized["deleted"] == config.later_garbage_objects + 1

    with Lake.connect(DemoLake(root).kv_url) as lake:
        repo = lake.repository(REPOSITORY)
        assert [(r.pattern, r.required_checks) for r in repo.protections()] == [
            ("main", ("quality",))
        ]
        main = repo.branch("main")
        loaded = {entry.path.split("/")[1] for entry in main.list(prefix="sales/")}
        assert loaded == {"partition=r0-p0", "partition=r1-p0", "partition=r2-p0"}
