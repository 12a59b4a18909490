"""The Spark GC job and imported objects: runs (clean, then optimized) accept entries that
point outside the namespace, skip them, and never delete an imported object, on local files
and on the S3 server, also once the entries naming them are deleted and committed away, and
once retention expires the commits that held them."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.gc_model import assert_references_intact
from tests.helpers.gc import FakeClock, GCLake
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


def test_retention_leaves_imported_objects_only_expired_commits_hold(
    local_gc: GCLake, tmp_path: Path
) -> None:
    """Commits dated months ago hold an import and, beside it, a data object; later commits
    drop both. Retention deletes the data object and leaves the imported files, whose URIs
    lie outside the namespace."""
    (tmp_path / "existing").mkdir()
    files = {f"part-{i}.parquet": f"rows {i}".encode() for i in range(3)}
    for key, data in files.items():
        (tmp_path / "existing" / key).write_bytes(data)
    repo = local_gc.repo
    clock = FakeClock(datetime.now(UTC) - timedelta(days=300))
    repo.lake.graveler.refs.clock = clock
    main = repo.branch("main")
    main.import_objects((tmp_path / "existing").as_uri(), prefix="raw/")
    clock.advance(timedelta(days=1))
    own = main.upload("own.txt", b"only expired commits hold this").address
    main.commit("own")
    clock.advance(timedelta(days=1))
    for key in files:
        main.delete(f"raw/{key}")
    main.delete("own.txt")
    main.commit("both dropped")
    repo.set_gc_rules({"default_retention_days": 30})

    summary = local_gc.run(only="committed", late_writes=timedelta(microseconds=1))

    assert summary.gate_success
    assert own not in local_gc.data_objects()
    assert {p.name: p.read_bytes() for p in (tmp_path / "existing").iterdir()} == files
