"""Namespaces whose names hold characters that mean something to Spark: the job reads its
own files (the prepare output, the candidates) as exactly those files."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

from branchwater.engine import Lake
from branchwater.engine.gc.runs import statuses
from tests.helpers.gc import GCLake
from tests.spark_jobs.test_gc_runs import history

pytestmark = [pytest.mark.spark, pytest.mark.slow]


@pytest.mark.parametrize("folder", ["lake[prod]", "lake{1}", "back\\slash"])
def test_a_namespace_named_like_a_glob_pattern_is_collected(
    tmp_path: Path, spark: SparkSession, folder: str
) -> None:
    """Spark's reader globs its paths: `lake[prod]` named no file there, and the run failed
    as `Unavailable` at every try, so such a repository was never collected."""
    kv_url = f"sqlite:///{tmp_path}/lake.db"
    with Lake.connect(kv_url) as lake:
        repo = lake.create_repository("sales", storage_namespace=f"file://{tmp_path}/{folder}")
        gc = GCLake(spark, lake, repo, kv_url, {})
        keep, garbage = history(gc)

        summary = gc.run()

        assert summary.status == statuses.SWEPT and summary.gate_success
        assert set(gc.data_objects()) == keep
        assert summary.volume("deleted").objects == len(garbage)
