"""The GC job's access to a namespace: what it reads of objects, and S3 from the environment
alone, as executors on a cluster get it."""

from __future__ import annotations

from pathlib import Path

import pytest

from branchwater.engine.gc.runs.storage import Namespace
from tests.fixtures.s3 import S3Server

ENVIRONMENT = {
    "AWS_ACCESS_KEY_ID": "aws_access_key_id",
    "AWS_SECRET_ACCESS_KEY": "aws_secret_access_key",
    "AWS_DEFAULT_REGION": "region_name",
    "AWS_ENDPOINT_URL": "endpoint_url",
}


@pytest.mark.s3
def test_without_options_the_endpoint_comes_from_aws_endpoint_url(
    s3_server: S3Server, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3_server.client().put_object(Bucket=s3_bucket, Key="data/x", Body=b"12345")
    monkeypatch.delenv("AWS_ENDPOINT_URL_S3", raising=False)
    for variable, option in ENVIRONMENT.items():
        monkeypatch.setenv(variable, s3_server.options[option])
    ns = Namespace.of(f"s3://{s3_bucket}")
    assert ns.stat(["data/x"])[0] == [5]
    assert ns.list_dir("data").names == ["x"]


def test_stat_gives_a_local_file_its_size_and_no_size_to_a_folder_or_a_missing_key(
    tmp_path: Path,
) -> None:
    (tmp_path / "data" / "s" / "folder").mkdir(parents=True)
    (tmp_path / "data" / "s" / "file").write_bytes(b"12345")
    ns = Namespace.of(tmp_path.as_uri())

    sizes, mtimes = ns.stat(["data/s/file", "data/s/folder", "data/s/missing"])

    assert sizes == [5, None, None]
    assert mtimes[0] == (tmp_path / "data" / "s" / "file").stat().st_mtime_ns
    assert mtimes[1:] == [None, None]
