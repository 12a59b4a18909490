"""The benchmarks' back ends (`tests/benchmarks/backends.py`): each stages KV rows with the
last of a key's rows winning, scans them back in key order through the driver alone, and
PUTs, lists and reads objects under its object root, on SQLite and local files and on
PostgreSQL and SeaweedFS alike; the selected one comes from `BENCH_BACKEND`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pyarrow as pa
import pytest

from branchwater.engine.kv import open_store
from tests.benchmarks import backends, results
from tests.benchmarks.backends import EMBEDDED, STACK, Backend, open_backend, postgres_database
from tests.fixtures.s3 import S3Server


@pytest.fixture
def embedded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Backend]:
    monkeypatch.setenv(results.BACKEND_ENV, EMBEDDED)
    with open_backend(tmp_path) as backend:
        yield backend


@pytest.fixture
def stack(tmp_path: Path, s3_server: S3Server, s3_bucket: str) -> Iterator[Backend]:
    with postgres_database() as url:
        yield Backend(STACK, tmp_path, url, s3_server, s3_bucket)


def check_round_trips(backend: Backend) -> None:
    open_store(backend.kv_url).close()  # the lake creates the table; here the store does
    backend.stage_rows([(b"t", b"b", b"1"), (b"t", b"a", b"2"), (b"u", b"a", b"3")])
    backend.stage_rows([(b"t", b"b", b"old"), (b"t", b"b", b"new")])
    backend.checkpoint()
    assert backend.scan_rows(b"t") == [(b"a", b"2"), (b"b", b"new")]
    backend.put_empty(["ns/data/s1/x", "ns/data/s2/y"])
    backend.write_parquet("ns/floor.parquet", pa.table({"v": [1, 2]}))
    assert backend.keys("ns/data") == ["ns/data/s1/x", "ns/data/s2/y"]
    assert backend.read_parquet("ns/floor.parquet").column("v").to_pylist() == [1, 2]
    assert backend.objects("ns").get("data/s1/x") == b""


def test_the_embedded_back_end_stages_scans_and_stores_on_local_files(embedded: Backend) -> None:
    assert embedded.namespace("ns") == f"file://{embedded.root}/ns"
    assert embedded.s3_options == {}
    check_round_trips(embedded)


@pytest.mark.postgres
@pytest.mark.s3
def test_the_stack_back_end_stages_scans_and_stores_on_postgres_and_s3(stack: Backend) -> None:
    assert stack.namespace("ns") == f"s3://{stack.bucket}/ns"
    assert stack.kv_url.startswith("postgresql://")
    check_round_trips(stack)


def test_an_unknown_back_end_stops_the_module(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(results.BACKEND_ENV, "dynamo")
    with pytest.raises(SystemExit, match="unknown back end 'dynamo'"):
        backends.selected()
