"""The machine-wide range cache: verified ranges shared across processes on local disk.

The committed store is exercised through a spying object store, so "served from the cache"
means the object store was not read, not just that the result was right.
"""

from __future__ import annotations

import os
import pwd
import random
import time
from pathlib import Path

import pyarrow as pa
import pytest

from branchwater.engine import Lake
from branchwater.engine.errors import InvalidArgument
from branchwater.engine.graveler.committed import (
    CACHE_DIR_ENV,
    CommittedStore,
    RangeCache,
    default_cache_dir,
)
from branchwater.engine.graveler.committed.format import (
    RANGE_SCHEMA,
    build_range,
    range_id,
    range_key,
)
from tests.helpers.committed import POLICIES, SpyStore, entry, random_entries
from tests.helpers.servers import forked_pool

POLICY = POLICIES["hash"]


def a_range(first: int, count: int = 20) -> tuple[str, pa.Table]:
    table = build_range([entry(f"p/{i:06d}", i) for i in range(first, first + count)])
    return range_id(table), table


@pytest.fixture
def objects(tmp_path: Path) -> SpyStore:
    return SpyStore(f"file://{tmp_path}/namespace")


@pytest.fixture
def cache(tmp_path: Path) -> RangeCache:
    return RangeCache(tmp_path / "cache")


def test_put_then_get_gives_the_same_rows_and_schema(cache: RangeCache) -> None:
    rid, table = a_range(0)
    assert cache.get(rid) is None
    cache.put(rid, table)

    cached = cache.get(rid)
    assert cached is not None
    assert cached.equals(table)
    assert cached.schema.equals(RANGE_SCHEMA, check_metadata=True)
    assert [p.name for p in cache.directory.iterdir()] == [rid]


def test_a_fresh_process_store_reads_ranges_another_wrote_without_storage(
    objects: SpyStore, cache: RangeCache
) -> None:
    entries = random_entries(random.Random(3), 300)
    metarange_id = CommittedStore(objects, POLICY, disk_cache=cache).write_metarange(entries)
    assert len(list(cache.directory.iterdir())) == len(
        CommittedStore(objects, POLICY).ranges(metarange_id)
    )

    objects.reset()
    assert list(CommittedStore(objects, POLICY, disk_cache=cache).iterate(metarange_id)) == entries
    assert objects.range_reads() == 0


def test_ranges_read_from_storage_are_cached_once_verified(
    objects: SpyStore, cache: RangeCache
) -> None:
    entries = random_entries(random.Random(4), 300)
    metarange_id = CommittedStore(objects, POLICY).write_metarange(entries)
    assert not cache.directory.exists()

    list(CommittedStore(objects, POLICY, disk_cache=cache).iterate(metarange_id))
    reads = objects.range_reads()
    assert reads > 0
    assert len(list(cache.directory.iterdir())) == reads
    list(CommittedStore(objects, POLICY, disk_cache=cache).iterate(metarange_id))
    assert objects.range_reads() == reads


@pytest.mark.parametrize("damage", ["truncated", "garbage", "other-range"])
def test_a_damaged_or_misnamed_cache_file_is_dropped_and_storage_read(
    objects: SpyStore, cache: RangeCache, damage: str
) -> None:
    entries = random_entries(random.Random(5), 100)
    writer_store = CommittedStore(objects, POLICY, disk_cache=cache)
    metarange_id = writer_store.write_metarange(entries)
    infos = writer_store.ranges(metarange_id)
    victim = cache.directory / infos[0].range_id
    if damage == "truncated":
        victim.write_bytes(victim.read_bytes()[:100])
    elif damage == "garbage":
        victim.write_bytes(b"ARROW1" + os.urandom(500))
    else:
        victim.write_bytes((cache.directory / infos[1].range_id).read_bytes())

    objects.reset()
    assert list(CommittedStore(objects, POLICY, disk_cache=cache).iterate(metarange_id)) == entries
    assert objects.gets.count(range_key(infos[0].range_id)) == 1
    assert objects.range_reads() == 1
    repaired = cache.get(infos[0].range_id)
    assert repaired is not None and range_id(repaired) == infos[0].range_id


def test_trim_keeps_the_most_recently_used_within_the_bound(tmp_path: Path) -> None:
    filler = RangeCache(tmp_path / "cache")
    ids = []
    for i in range(12):
        rid, table = a_range(i * 100)
        filler.put(rid, table)
        os.utime(filler.directory / rid, (time.time() - 100 + i,) * 2)
        ids.append(rid)
    size = max(p.stat().st_size for p in filler.directory.iterdir())
    assert filler.get(ids[2]) is not None

    RangeCache(filler.directory, max_bytes=5 * size).trim()

    kept = {p.name for p in filler.directory.iterdir()}
    assert sum(p.stat().st_size for p in filler.directory.iterdir()) <= 5 * size
    assert len(kept) >= 4
    assert ids[2] in kept and ids[-1] in kept
    assert ids[3] not in kept and ids[0] not in kept


def test_puts_trim_on_their_own_and_stale_temporary_files_go(tmp_path: Path) -> None:
    probe = RangeCache(tmp_path / "probe")
    rid, table = a_range(0)
    probe.put(rid, table)
    size = (probe.directory / rid).stat().st_size

    cache = RangeCache(tmp_path / "cache", max_bytes=3 * size)
    cache.directory.mkdir()
    stale = cache.directory / ".tmp-dead-writer"
    stale.write_bytes(b"x")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    for i in range(20):
        cache.put(*a_range(i * 100))

    files = list(cache.directory.iterdir())
    assert not stale.exists()
    assert sum(p.stat().st_size for p in files) <= 3 * size + size
    assert len(files) < 20


def test_an_unwritable_cache_directory_only_turns_the_cache_off(
    objects: SpyStore, tmp_path: Path
) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_bytes(b"")
    cache = RangeCache(blocker / "cache")
    entries = random_entries(random.Random(6), 100)
    store = CommittedStore(objects, POLICY, disk_cache=cache)

    metarange_id = store.write_metarange(entries)
    assert list(CommittedStore(objects, POLICY, disk_cache=cache).iterate(metarange_id)) == entries


@pytest.mark.parametrize("max_bytes", [0, -1, True, "1GB"])
def test_bad_bounds_are_refused(tmp_path: Path, max_bytes: object) -> None:
    with pytest.raises(InvalidArgument, match="max_bytes"):
        RangeCache(tmp_path, max_bytes)  # type: ignore[arg-type]


def test_default_directory_follows_the_environment(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "mine"))
    assert default_cache_dir() == tmp_path / "mine"
    monkeypatch.setenv(CACHE_DIR_ENV, "")
    assert default_cache_dir() is None
    monkeypatch.delenv(CACHE_DIR_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "branchwater" / "ranges"


def test_no_home_directory_turns_the_default_cache_off(monkeypatch, tmp_path: Path) -> None:
    """Neither `$HOME` nor a passwd entry, as for an arbitrary uid in a container."""
    monkeypatch.delenv(CACHE_DIR_ENV, raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("HOME", raising=False)

    def no_entry(uid: int) -> pwd.struct_passwd:
        raise KeyError(f"getpwuid(): uid not found: {uid}")

    monkeypatch.setattr(pwd, "getpwuid", no_entry)
    assert default_cache_dir() is None
    with Lake.connect(f"sqlite:///{tmp_path / 'lake.db'}") as lake:
        assert lake.graveler.range_cache is None


def test_lake_connect_uses_the_cache_unless_turned_off(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'lake.db'}"
    with Lake.connect(url, range_cache_dir=tmp_path / "c") as lake:
        assert lake.graveler.range_cache == RangeCache(tmp_path / "c")
        repo = lake.create_repository("repo", storage_namespace=f"file://{tmp_path}/r")
        repo.branch("main").upload("a", b"1")
        repo.branch("main").commit("a")
    assert len(list((tmp_path / "c").iterdir())) == 1
    with Lake.connect(url, range_cache_dir=tmp_path / "c", range_cache_bytes=0) as lake:
        assert lake.graveler.range_cache is None


def _race(directory: str, first: int, barrier) -> tuple[int, list[str]]:
    """Put, read and remove a shared range many times while the others do the same, as
    writers and trims on a busy machine would; then, once no one removes it any more, put and
    read it and an own range. Returns how many reads of the shared range gave anything but
    it, and the ids read back."""
    cache = RangeCache(Path(directory))
    shared_id, shared = a_range(0, 2_000)
    own_id, own = a_range(first, 2_000)
    wrong = 0
    barrier.wait(60)
    for _ in range(40):
        cache.put(shared_id, shared)
        got = cache.get(shared_id)
        wrong += got is not None and not got.equals(shared)
        (cache.directory / shared_id).unlink(missing_ok=True)
    barrier.wait(60)
    cache.put(shared_id, shared)
    cache.put(own_id, own)
    return wrong, [range_id(table) for table in (cache.get(shared_id), cache.get(own_id))]


def test_processes_writing_and_dropping_the_same_range_never_read_a_partial_file(
    tmp_path: Path,
) -> None:
    workers = 4
    firsts = [10_000 * (i + 1) for i in range(workers)]
    with forked_pool(workers) as (manager, pool):
        barrier = manager.Barrier(workers)
        jobs = [pool.apply_async(_race, (str(tmp_path), f, barrier)) for f in firsts]
        results = [job.get(120) for job in jobs]

    shared_id, _ = a_range(0, 2_000)
    own_ids = [a_range(f, 2_000)[0] for f in firsts]
    assert [wrong for wrong, _ in results] == [0] * workers
    assert [ids for _, ids in results] == [[shared_id, own] for own in own_ids]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([shared_id, *own_ids])


def test_the_cache_directory_is_made_private(cache: RangeCache) -> None:
    cache.put(*a_range(0))
    assert cache.directory.stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777])
def test_in_a_directory_others_can_write_a_forged_file_is_hashed_and_dropped(
    tmp_path: Path, mode: int
) -> None:
    """A file under the right id holding another range is what someone who can write to the
    directory could plant: outside a private directory every hit is hashed."""
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    genuine_id, genuine = a_range(0)
    _, forged = a_range(500)
    RangeCache(shared).put(genuine_id, forged)

    assert RangeCache(shared).get(genuine_id) is None
    assert not (shared / genuine_id).exists()
    RangeCache(shared).put(genuine_id, genuine)
    served = RangeCache(shared).get(genuine_id)
    assert served is not None and range_id(served) == genuine_id


def test_a_private_directory_is_trusted_by_the_id_in_the_file(cache: RangeCache) -> None:
    """Only this user can write there, and this user could change the process itself."""
    genuine_id, _ = a_range(0)
    _, forged = a_range(500)
    cache.put(genuine_id, forged)
    served = cache.get(genuine_id)
    assert served is not None and served.equals(forged)
