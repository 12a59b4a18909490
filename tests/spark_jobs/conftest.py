"""Fixtures of the Spark GC tests: a lake on SQLite (the job opens it again from its own
connection, as a Spark driver does), its repository on local files or on the S3 server, and
a runner for the job on the session's one Spark session."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from branchwater.engine import Lake
from tests.fixtures.s3 import S3Server
from tests.helpers.gc import GCLake
from tests.helpers.servers import unique_name

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@pytest.fixture
def local_gc(tmp_path: Path, spark: SparkSession) -> Iterator[GCLake]:
    kv_url = f"sqlite:///{tmp_path}/lake.db"
    with Lake.connect(kv_url) as lake:
        repo = lake.create_repository("sales", storage_namespace=f"file://{tmp_path}/ns")
        yield GCLake(spark, lake, repo, kv_url, {})


@pytest.fixture
def s3_gc(
    tmp_path: Path, spark: SparkSession, s3_server: S3Server, s3_bucket: str
) -> Iterator[GCLake]:
    kv_url = f"sqlite:///{tmp_path}/lake.db"
    with Lake.connect(kv_url, s3_options=s3_server.options) as lake:
        namespace = f"s3://{s3_bucket}/{unique_name('ns-')}"
        repo = lake.create_repository("sales", storage_namespace=namespace)
        yield GCLake(spark, lake, repo, kv_url, s3_server.options)
