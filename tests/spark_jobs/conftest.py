"""Fixtures of the Spark GC tests: a lake on SQLite (the job opens it again from its own
connection, as a Spark driver does), its repository on local files or on the S3 server, and
a runner for the job on the session's one Spark session."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from branchwater.engine import Lake, Repository
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


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def reader_lake(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ReaderLake]:
    """A lake on SQLite whose repository lives on local files or on the S3 server, with the
    S3 options executors need to read it."""
    options: dict[str, str] = {}
    namespace = (tmp_path / "ns").as_uri()
    if request.param == "s3":
        server: S3Server = request.getfixturevalue("s3_server")
        options = server.options
        namespace = f"s3://{request.getfixturevalue('s3_bucket')}/{unique_name('ns-')}"
    with Lake.connect(f"sqlite:///{tmp_path}/lake.db", s3_options=options) as lake:
        yield ReaderLake(lake, lake.create_repository("sales", namespace), options)


@dataclass(frozen=True)
class ReaderLake:
    lake: Lake
    repo: Repository
    s3_options: dict[str, str]
