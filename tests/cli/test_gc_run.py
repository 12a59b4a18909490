"""`gc run` (the Spark job through `spark-submit`) and `gc explain` from the command line; a
run that sweeps, and `gc explain` of what it deleted, on a standalone cluster in
tests/spark_jobs/test_gc_cluster.py."""

from __future__ import annotations

import json
import re
from datetime import timedelta
from typing import TYPE_CHECKING

import pytest

from branchwater.engine.gc.runs.config import JobConfig
from branchwater.spark_jobs.gc.job import GCJob
from tests.helpers.cli import Bw, CliLake, assert_user_error, local_file, make_repo, ok

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.usefixtures("spark_submit_conf")]


def test_gc_run_submits_the_job_and_shows_the_gate_that_refused_it(bw: Bw, lake: CliLake) -> None:
    """The run that passes its gate and sweeps, and `gc explain` of what it deleted, are
    tests/spark_jobs/test_gc_cluster.py's (the same `gc run`, on a standalone master)."""
    make_repo(bw, lake)
    ok(bw("upload", "sales", "main", "a.csv", local_file(lake, "a.csv", b"1")))
    ok(bw("commit", "sales", "main", "-m", "a"))
    ok(bw("upload", "sales", "main", "b.csv", local_file(lake, "b.csv", b"2")))
    ok(bw("rm", "sales", "main", "b.csv"))

    refused = bw("gc", "run", "sales", "--dry-run", "--min-age", "0s", "--max-share", "0")
    assert refused.code == 1
    assert "gate FAILED" in refused.out and "expect_table_row_count_to_be_between" in refused.out
    assert refused.err.startswith("branchwater: error: GC run") and "quality gate" in refused.err
    mark = re.search(r"GC run (\S+) \(clean\)", refused.out)
    assert mark is not None
    assert_user_error(bw("gc", "run", "sales", "--sweep", mark[1]), 1, "failed its quality gate")
    assert_user_error(bw("gc", "explain", "sales", "tables/a.csv"), 1, "not a data address")


def test_gc_run_sweeps_a_mark_with_nothing_to_delete_without_spark(
    bw: Bw, lake: CliLake, spark: SparkSession, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No `spark-submit` is within reach: the sweep runs in the CLI's own process."""
    make_repo(bw, lake)
    ok(bw("upload", "sales", "main", "a.csv", local_file(lake, "a.csv", b"1")))
    ok(bw("commit", "sales", "main", "-m", "a"))
    config = JobConfig(lake.kv, "sales", dry_run=True, min_age=timedelta(0))
    mark = GCJob(spark, config).run()
    monkeypatch.setenv("SPARK_HOME", str(lake.root / "no-spark-here"))
    monkeypatch.setenv("PATH", "/usr/bin:/bin")

    swept = json.loads(ok(bw("gc", "run", "sales", "--sweep", mark.run_id, "--json")).out)

    assert (swept["run_id"], swept["status"]) == (mark.run_id, "swept")
    assert swept["counts"]["deleted"] == {"objects": 0, "bytes": 0}
    again = ok(bw("gc", "run", "sales", "--sweep", mark.run_id)).out
    assert f"GC run {mark.run_id} (clean) of sales: swept" in again
