"""The Spark GC job and imported objects: runs (clean, then optimized) accept entries that
point outside the namespace, skip them, and never delete an imported object, on local files
and on the S3 server, also once the entries naming them are deleted and committed away."""

from __future__ import annotations

import time

import pytest

from tests.gc_model import assert_references_intact
from tests.helpers.gc import GCLake
from tests.helpers.servers import unique_name


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def gc_lake(request: pytest.FixtureRequest) -> GCLake:
    return request.getfixturevalue(f"{request.param}_gc")


def test_imported_objects_survive_every_run(
    gc_lake: GCLake, tmp_path_factory: pytest.TempPathFactory
) -> None:
    namespace = gc_lake.repo.storage_namespace
    if namespace.startswith("s3://"):
        source_uri = f"{namespace.rsplit('/', 1)[0]}/{unique_name('existing-')}/"
    else:
        source_uri = tmp_path_factory.mktemp("existing").as_uri() + "/"
    source = gc_lake.lake.graveler.objects(source_uri.rstrip("/"))
    files = {f"part-{i}.parquet": f"rows {i}".encode() for i in range(4)}
    for key, data in files.items():
        source.put(key, data)
    main = gc_lake.repo.branch("main")
    main.import_objects(source_uri, prefix="raw/")
    main.delete("raw/part-0.parquet")
    main.restore(["raw/part-0.parquet"], source="main")
    main.copy("raw/part-1.parquet", "copy.parquet")
    assert [c.path for c in main.uncommitted()] == ["copy.parquet"]
    dev = gc_lake.repo.create_branch("dev")
    dev.restore(["raw/"], source="main")
    garbage = set(gc_lake.put_garbage(2))
    time.sleep(0.01)

    first = gc_lake.run()
    assert first.gate_success and first.volume("deleted").objects == len(garbage)

    for key in files:
        main.delete(f"raw/{key}")
    main.delete("copy.parquet")
    main.commit("imported entries deleted")
    gc_lake.repo.delete_branch("dev")
    second = gc_lake.run(mode="optimized")
    third = gc_lake.run()

    assert second.gate_success and third.gate_success
    assert {info.key: source.get(info.key) for info in source.list_objects()} == files
    assert_references_intact(gc_lake.repo)
