"""Fixtures of the `branchwater://` filesystem tests: a lake on SQLite + local files and on
PostgreSQL + SeaweedFS (a table of its own, a prefix of its own in the module's bucket), the
filesystem fsspec builds for it from `storage_options`, and the protocol registered as the
`fsspec.specs` entry point does once the package is installed."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fsspec
import pytest

from branchwater.engine import BranchwaterFileSystem, Lake, Repository
from branchwater.engine.filesystem import PROTOCOL
from tests.fixtures.s3 import S3Server
from tests.helpers.servers import unique_name


@pytest.fixture(autouse=True, scope="session")
def registered_protocol() -> None:
    """An editable install made before the entry point existed does not know it yet."""
    if PROTOCOL not in fsspec.available_protocols():
        fsspec.register_implementation(PROTOCOL, BranchwaterFileSystem)


@dataclass
class FsLake:
    """A repository `sales`, the test's own lake on it, and the filesystem readers use."""

    lake: Lake
    repo: Repository
    fs: BranchwaterFileSystem
    options: dict[str, Any]
    """The `storage_options` that reach the same lake (pandas, `fsspec.filesystem`)."""

    def url(self, ref: str, path: str = "") -> str:
        return f"{PROTOCOL}://sales/{ref}/{path}"


@pytest.fixture(
    params=[
        "sqlite-local",
        pytest.param("postgres-s3", marks=[pytest.mark.postgres, pytest.mark.s3]),
    ]
)
def fs_lake(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[FsLake]:
    if request.param == "sqlite-local":
        options: dict[str, Any] = {"kv_url": f"sqlite:///{tmp_path}/lake.db"}
        namespace = f"file://{tmp_path}/sales"
    else:
        server: S3Server = request.getfixturevalue("s3_server")
        bucket = request.getfixturevalue("s3_module_bucket")
        postgres_url = request.getfixturevalue("postgres_url")
        options = {
            "kv_url": f"{postgres_url}?table={unique_name('fs_')}",
            "s3_options": server.options,
        }
        namespace = f"s3://{bucket}/{unique_name('lake-')}/sales"
    lake = Lake.connect(options["kv_url"], s3_options=options.get("s3_options"))
    try:
        repo = lake.create_repository("sales", namespace)
        fs = fsspec.filesystem(PROTOCOL, **options)
        assert isinstance(fs, BranchwaterFileSystem)
        yield FsLake(lake, repo, fs, options)
    finally:
        BranchwaterFileSystem.clear_instance_cache()
        if namespace.startswith("s3://"):
            store = lake.graveler.objects(namespace)
            store.delete([info.key for info in store.list_objects()])
        lake.close()


def staged(fs_lake: FsLake, branch: str = "main") -> dict[str, str]:
    """The branch's uncommitted changes: path -> change type."""
    return {c.path: c.type for c in fs_lake.repo.branch(branch).uncommitted()}
