"""The Spark writer: one Parquet file per partition, written by the executors at addresses
the branch handed out, then linked; on a local namespace and on S3."""

from __future__ import annotations

import hashlib
import io
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.parquet as pq
import pytest

from branchwater.engine import ConfigurationError, Lake
from branchwater.spark_jobs.writer import write_parquet
from tests.fixtures.s3 import S3Server
from tests.helpers.hostile import stored

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def rows_of(data: bytes) -> list[dict[str, object]]:
    return pq.read_table(io.BytesIO(data)).to_pylist()


def write_and_read_back(spark: SparkSession, lake: Lake, namespace: str, **options: object) -> None:
    repo = lake.create_repository("written", namespace)
    branch = repo.create_branch("load")
    frame = spark.createDataFrame(
        [(i, f"row-{i}") for i in range(10)], schema="id int, name string"
    ).repartitionByRange(3, "id")
    empty = spark.createDataFrame([], schema="id int").repartition(2)

    entries = write_parquet(frame, branch, "tables/rows/", metadata={"job": "test"}, **options)

    assert write_parquet(empty, branch, "tables/empty") == []
    assert [e.path for e in entries] == [f"tables/rows/part-{i:05d}.parquet" for i in range(3)]
    assert [e.path for e in branch.list(prefix="tables/")] == [e.path for e in entries]
    rows = [row for entry in entries for row in rows_of(branch.read(entry.path))]
    assert sorted(r["id"] for r in rows) == list(range(10))
    for entry in entries:
        assert entry.metadata == {"job": "test"}
        assert entry.address.startswith("data/")
        assert branch.stat(entry.path).size == entry.size
        assert entry.checksum == hashlib.sha256(branch.read(entry.path)).hexdigest()
    commit = branch.commit("load rows")
    assert len(list(repo.ref(commit.id).list(prefix="tables/rows/"))) == 3


def test_a_frame_lands_on_the_branch_one_file_per_partition(
    spark: SparkSession, tmp_path: Path
) -> None:
    with Lake.connect(f"sqlite:///{tmp_path / 'lake.db'}") as lake:
        write_and_read_back(spark, lake, (tmp_path / "ns").as_uri())


@pytest.mark.s3
def test_executors_write_to_an_s3_namespace(
    spark: SparkSession, s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    options = s3_server.options
    with Lake.connect(f"sqlite:///{tmp_path / 'lake.db'}", s3_options=options) as lake:
        write_and_read_back(spark, lake, f"s3://{s3_bucket}/lakes/written", s3_options=options)


def test_s3_options_the_executors_could_not_use_are_refused_before_any_address(
    spark: SparkSession, tmp_path: Path
) -> None:
    """An executor would meet them only when writing, as a task failure far from the call."""
    kv_url = f"sqlite:///{tmp_path / 'lake.db'}"
    with Lake.connect(kv_url) as lake:
        branch = lake.create_repository("written", (tmp_path / "ns").as_uri()).branch("main")
        frame = spark.createDataFrame([(1,)], schema="id int")
        lake.wait_for_cleanup()
        before = stored(kv_url, tmp_path / "ns")
        with pytest.raises(ConfigurationError, match="unknown S3 option 'region'"):
            write_parquet(frame, branch, "t/", s3_options={"region": "eu-west-1"})
        assert stored(kv_url, tmp_path / "ns") == before
