"""The production-like combination end to end: PostgreSQL (or DynamoDB) KV and an S3 namespace."""

from __future__ import annotations

import pytest

from branchwater.engine import Lake, NotFound
from tests.fixtures.s3 import S3Server
from tests.helpers.servers import unique_name


def walk_through(lake: Lake, namespace: str) -> None:
    repo = lake.create_repository(unique_name("repo-"), storage_namespace=namespace)
    main = repo.branch("main")
    main.upload("tables/a.parquet", b"a" * 1000)
    main.upload("tables/b.parquet", b"b")
    main.commit("load")
    etl = repo.create_branch("etl", source="main")
    etl.upload("tables/c.parquet", b"c")
    etl.delete("tables/b.parquet")
    etl.commit("etl")
    main.upload("other/x", b"x")
    main.commit("other")
    result = repo.merge("etl", into="main")
    assert result.attempts == 1
    assert [e.path for e in main.list()] == ["other/x", "tables/a.parquet", "tables/c.parquet"]
    assert main.read("tables/a.parquet") == b"a" * 1000
    assert main.stat("tables/a.parquet").size == 1000
    with pytest.raises(NotFound):
        main.read("tables/b.parquet")
    assert [c.message for c in repo.log("main", first_parent=True)][:2] == [
        result.commit.message,
        "other",
    ]


@pytest.mark.postgres
@pytest.mark.s3
def test_postgres_kv_with_s3_namespace(
    postgres_url: str, s3_server: S3Server, s3_bucket: str
) -> None:
    kv_url = f"{postgres_url}?table={unique_name('stack_')}"
    with Lake.connect(kv_url, s3_options=s3_server.options) as lake:
        walk_through(lake, f"s3://{s3_bucket}/lake")


@pytest.mark.s3
def test_dynamodb_kv_with_s3_namespace(
    dynamodb_endpoint: str, s3_server: S3Server, s3_bucket: str
) -> None:
    kv_url = f"dynamodb://{unique_name('stack-')}?endpoint_url={dynamodb_endpoint}&region=us-east-1"
    with Lake.connect(kv_url, s3_options=s3_server.options) as lake:
        walk_through(lake, f"s3://{s3_bucket}/lake")
