"""The `store` fixture: every `ObjectStore` driver, empty, for the conformance suites here."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from branchwater.engine.objects import ObjectStore, open_object_store
from branchwater.engine.objects.s3 import S3ObjectStore
from tests.fixtures.s3 import S3Server


@pytest.fixture(
    params=[
        "local",
        pytest.param("s3", marks=pytest.mark.s3),
        pytest.param("s3-prefix", marks=pytest.mark.s3),
    ]
)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    """Each driver, empty; the S3 variants only start SeaweedFS when selected."""
    if request.param == "local":
        opened: ObjectStore = open_object_store(f"file://{tmp_path / 'root'}")
    else:
        server: S3Server = request.getfixturevalue("s3_server")
        bucket = request.getfixturevalue("s3_bucket")
        prefix = "/lake/ns-1" if request.param == "s3-prefix" else ""
        opened = open_object_store(f"s3://{bucket}{prefix}", **server.options)
    yield opened
    opened.close()


@pytest.fixture
def s3_store(s3_server: S3Server, s3_bucket: str) -> Iterator[S3ObjectStore]:
    """The S3 driver alone, on a fresh bucket, for S3-only guarantees."""
    opened = S3ObjectStore(f"s3://{s3_bucket}", **s3_server.options)
    yield opened
    opened.close()
