"""`Branch.import_objects` on local files and on the S3 server: objects under a prefix outside
the namespace become entries pointing at them, in one commit; reads go to them; re-running
converges; hostile sources and keys are refused with nothing committed; a process killed
mid-import and run again ends where one uninterrupted import ends."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from botocore.exceptions import ClientError

from branchwater.engine import CorruptedData, InvalidArgument, Lake, NotFound, failpoints
from branchwater.engine.api import Ref, Repository
from branchwater.engine.errors import InvalidImportSource
from branchwater.engine.graveler import imports
from branchwater.engine.objects import ObjectStore
from branchwater.engine.objects.local import LocalObjectStore
from tests.fixtures.s3 import S3Server
from tests.helpers.failpoints import held_at
from tests.helpers.servers import forked_run, unique_name

OBJECTS = {
    "a.csv": b"x,y\n1,2\n",
    "dir/b.parquet": b"PAR1" * 100,
    "dir/sub/c.txt": b"deep",
    "weird name %20 #frag ?q=1 \u00e9\u6f22.bin": b"weird",
}


@dataclass
class ImportLake:
    lake: Lake
    repo: Repository
    source: ObjectStore
    """The store of the source prefix, to put objects there as another tool would."""
    source_uri: str
    kv_url: str
    s3_options: dict[str, str]


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def lake_with_source(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ImportLake]:
    """A lake on SQLite with repository `sales`, and a source prefix outside its namespace
    holding `OBJECTS`: a local folder, or a prefix of the module's S3 bucket (the namespace
    another one)."""
    kv_url = f"sqlite:///{tmp_path}/lake.db"
    options: dict[str, str] = {}
    if request.param == "local":
        namespace, source_uri = f"file://{tmp_path}/ns", f"file://{tmp_path}/existing/"
    else:
        server: S3Server = request.getfixturevalue("s3_server")
        bucket = request.getfixturevalue("s3_module_bucket")
        options = server.options
        namespace = f"s3://{bucket}/{unique_name('ns-')}"
        source_uri = f"s3://{bucket}/{unique_name('existing-')}/"
    with Lake.connect(kv_url, s3_options=options, range_cache_dir="") as lake:
        repo = lake.create_repository("sales", namespace)
        source = lake.graveler.objects(source_uri.rstrip("/"))
        for key, data in OBJECTS.items():
            source.put(key, data)
        yield ImportLake(lake, repo, source, source_uri, kv_url, options)


def test_objects_become_entries_pointing_at_them_in_one_commit(
    lake_with_source: ImportLake,
) -> None:
    t = lake_with_source
    main = t.repo.branch("main")
    before = main.head()
    seen: list[int] = []

    result = main.import_objects(t.source_uri, prefix="raw/", progress=seen.append)

    assert (result.count, result.bytes) == (len(OBJECTS), sum(map(len, OBJECTS.values())))
    assert result.commit is not None and result.commit.parents == (before.id,)
    assert main.head().id == result.commit.id and seen == [len(OBJECTS)]
    assert result.commit.metadata[imports.SOURCE_KEY] == t.source_uri
    assert result.commit.metadata[imports.PREFIX_KEY] == "raw/"
    entries = {e.path: e for e in main.list()}
    assert set(entries) == {f"raw/{key}" for key in OBJECTS}
    for key, data in OBJECTS.items():
        entry = entries[f"raw/{key}"]
        assert entry.address == t.source_uri + key
        assert entry.size == len(data) and entry.checksum.startswith("etag:")
        assert t.repo.ref(result.commit.id).read(f"raw/{key}") == data
        with t.repo.ref("main").open(f"raw/{key}") as f:
            f.seek(1)
            assert f.read() == data[1:]
    namespace = t.lake.graveler.objects(t.repo.storage_namespace)
    assert list(namespace.list_objects("data/")) == []
    assert list(main.uncommitted()) == []


def test_running_it_again_converges_and_a_rewritten_object_is_one_change(
    lake_with_source: ImportLake,
) -> None:
    t = lake_with_source
    main = t.repo.branch("main")
    first = main.import_objects(t.source_uri, prefix="raw")
    assert first.commit is not None

    again = main.import_objects(t.source_uri, prefix="raw/")
    assert again.commit is None and again.count == len(OBJECTS)
    assert main.head().id == first.commit.id

    t.source.put("a.csv", b"x,y\n3,4\n5,6\n")
    third = main.import_objects(t.source_uri, prefix="raw/")
    assert third.commit is not None
    changes = list(t.repo.diff(first.commit.id, third.commit.id))
    assert [(c.path, c.type) for c in changes] == [("raw/a.csv", "changed")]
    assert t.repo.ref("main").read("raw/a.csv") == b"x,y\n3,4\n5,6\n"


def test_an_object_rewritten_at_its_source_with_the_same_size_is_no_longer_read(
    lake_with_source: ImportLake,
) -> None:
    """An import never hashes the bytes, so a read checks the object's version (its ETag,
    or a local file's modification time) against the one imported: a rewrite keeping the
    size read the new bytes as the commit's content, even at the commit's id."""
    t = lake_with_source
    main = t.repo.branch("main")
    imported = main.import_objects(t.source_uri, prefix="raw/").commit
    assert imported is not None
    pinned = t.repo.ref(imported.id)
    assert pinned.read("raw/dir/sub/c.txt") == b"deep"

    t.source.put("dir/sub/c.txt", b"DEEP")
    if isinstance(t.source, LocalObjectStore):  # written within the microsecond it was?
        rewritten = t.source.root / "dir/sub/c.txt"
        later = rewritten.stat().st_mtime_ns + 10**9
        os.utime(rewritten, ns=(later, later))

    for read in (
        lambda: pinned.read("raw/dir/sub/c.txt"),
        lambda: pinned.open("raw/dir/sub/c.txt"),
    ):
        with pytest.raises(CorruptedData, match="rewritten at its source since it was imported"):
            read()
    assert pinned.read("raw/a.csv") == OBJECTS["a.csv"]
    main.import_objects(t.source_uri, prefix="raw/")
    assert t.repo.ref("main").read("raw/dir/sub/c.txt") == b"DEEP"


def aged(t: ImportLake, key: str) -> None:
    """A local source file dated an hour back, so a rewrite in a test's next milliseconds
    cannot keep its modification time (S3 objects need nothing: their ETag is content's)."""
    if isinstance(t.source, LocalObjectStore):
        before = (t.source.root / key).stat().st_mtime_ns - 3600 * 10**9
        os.utime(t.source.root / key, ns=(before, before))


def rewrite(t: ImportLake, key: str, data: bytes, *, in_place: bool = False) -> None:
    """`key` rewritten at the source as another tool would: a local file written through
    its path (truncating, as `cp` does, or in place), an S3 object put again."""
    if isinstance(t.source, LocalObjectStore):
        with open(t.source.root / key, "r+b" if in_place else "wb") as f:
            f.write(data)
    else:
        t.source.put(key, data)


REWRITTEN = r"rewritten at its source|replaced while it was being read"
"""A local file's version check, or a GET of S3 refused as another version (If-Match)."""


def imported_big(t: ImportLake, size: int) -> Ref:
    """`big.bin` of `size` bytes of A, aged and imported under `raw/`: the commit holding it."""
    t.source.put("big.bin", b"A" * size)
    aged(t, "big.bin")
    imported = t.repo.branch("main").import_objects(t.source_uri, prefix="raw/").commit
    assert imported is not None
    return t.repo.ref(imported.id)


@pytest.mark.parametrize("in_place", [True, False], ids=["same size in place", "truncated"])
def test_an_imported_object_rewritten_while_it_is_read_fails_the_read(
    lake_with_source: ImportLake, in_place: bool
) -> None:
    """A local file is checked again when a read reaches its end (a truncated one ends
    early, which is such a read), and every S3 GET is pinned to the imported ETag: a rewrite
    while a reader has the object open fails that read, never half old and half new bytes
    or a short object ending as if complete."""
    t = lake_with_source
    size = 1 << 20
    pinned = imported_big(t, size)

    with pinned.open("raw/big.bin") as f:
        assert f.read(size // 2) == b"A" * (size // 2)
        rewrite(t, "big.bin", b"B" * (size if in_place else size // 4), in_place=in_place)
        with pytest.raises(CorruptedData, match=REWRITTEN):
            f.read()


@pytest.mark.parametrize("lake_with_source", ["local"], indirect=True)
def test_a_local_file_renamed_over_while_open_reads_through_as_imported(
    lake_with_source: ImportLake,
) -> None:
    """A local file's version is checked on the open file (`fstat`), not its path: a reader
    holding the imported file reads its bytes through when another is renamed over it (as
    `rsync` and atomic writers replace files)."""
    t = lake_with_source
    size = 1 << 20

    with imported_big(t, size).open("raw/big.bin") as f:
        assert f.read(size // 2) == b"A" * (size // 2)
        t.source.put("big.bin", b"B" * size)
        assert f.read() == b"A" * (size - size // 2)


def test_a_copy_of_an_imported_object_rewritten_while_it_streams_stores_nothing(
    lake_with_source: ImportLake,
) -> None:
    """A copy across refs (fsspec's `cp_file`) streams the object through the same reader:
    the upload fails, and stages no object mixing two versions."""
    t = lake_with_source
    size = 4 << 20
    main = t.repo.branch("main")
    source = imported_big(t, size).open("raw/big.bin")
    read = source.read

    def read_then_rewrite(n: int = -1) -> bytes:
        data = read(n)
        rewrite(t, "big.bin", b"B" * size, in_place=True)
        return data

    source.read = read_then_rewrite  # type: ignore[method-assign]
    with source, pytest.raises(CorruptedData, match=REWRITTEN):
        main.upload("copy.bin", source)
    with pytest.raises(NotFound):
        main.stat("copy.bin")


def test_an_imported_object_rewritten_between_its_check_and_its_open_is_not_read(
    lake_with_source: ImportLake,
) -> None:
    """The version is checked before the open to learn what to hold reads to: S3 GETs must
    match the ETag found to be the imported one (not the one the open finds), and a local
    file is checked again once it is open, so even a first read short of its end is not
    of the rewritten file."""
    t = lake_with_source
    size = 1 << 20
    pinned = imported_big(t, size)

    def rewritten() -> None:
        rewrite(t, "big.bin", b"B" * size)

    with (
        failpoints.armed("source.after_check", rewritten),
        pytest.raises(CorruptedData, match=REWRITTEN),
        pinned.open("raw/big.bin") as f,
    ):
        f.read(1)


def test_uncommitted_changes_stay_staged_above_the_import(lake_with_source: ImportLake) -> None:
    t = lake_with_source
    main = t.repo.branch("main")
    main.upload("mine.txt", b"mine")
    main.upload("raw/a.csv", b"staged wins")

    result = main.import_objects(t.source_uri, prefix="raw/")

    assert result.commit is not None
    assert {c.path for c in main.uncommitted()} == {"mine.txt", "raw/a.csv"}
    assert main.read("raw/a.csv") == b"staged wins"
    assert t.repo.ref(result.commit.id).read("raw/a.csv") == OBJECTS["a.csv"]
    assert [e.path for e in t.repo.ref(result.commit.id).list("mine")] == []


def test_a_path_uploaded_and_deleted_before_the_import_shows_the_imported_object(
    lake_with_source: ImportLake,
) -> None:
    """The delete dropped the staged row, so nothing staged hides what the import lands."""
    t = lake_with_source
    main = t.repo.branch("main")
    main.upload("raw/a.csv", b"scratch")
    main.delete("raw/a.csv")

    main.import_objects(t.source_uri, prefix="raw/")

    assert main.read("raw/a.csv") == OBJECTS["a.csv"]
    assert list(main.uncommitted()) == []


def test_a_copy_of_an_imported_object_shares_its_address(lake_with_source: ImportLake) -> None:
    t = lake_with_source
    main = t.repo.branch("main")
    main.import_objects(t.source_uri, prefix="raw/")

    copied = main.copy("raw/a.csv", "copy.csv")

    assert copied.address == t.source_uri + "a.csv"
    assert main.read("copy.csv") == OBJECTS["a.csv"]


def test_a_local_link_into_a_namespace_is_refused_and_nothing_changes(
    lake: Lake, repo: Repository, tmp_path: Path
) -> None:
    """The entry's address would be the link: the namespace's GC, seeing no entry of its
    own, could delete the object it reads (here an uncommitted one, deleted next)."""
    main = repo.branch("main")
    kept = main.upload("kept.csv", b"precious")
    source = tmp_path / "landing" / "deep"
    source.mkdir(parents=True)
    (source / "plain.csv").write_bytes(b"plain")
    namespace = repo.storage_namespace.removeprefix("file://")
    (source / "link.csv").symlink_to(f"{namespace}/{kept.address}")
    other = lake.create_repository("other", f"file://{tmp_path}/other-ns")
    head = other.branch("main").head().id
    with pytest.raises(InvalidImportSource, match=r"deep/link.csv to file://.*inside a storage"):
        other.branch("main").import_objects(f"file://{tmp_path}/landing/")
    assert other.branch("main").head().id == head
    (source / "link.csv").unlink()
    (source / "link.csv").symlink_to(source / "plain.csv")
    assert other.branch("main").import_objects(f"file://{tmp_path}/landing/").count == 2


def test_sources_overlapping_a_namespace_are_refused_and_nothing_changes(
    lake_with_source: ImportLake, tmp_path: Path
) -> None:
    t = lake_with_source
    main = t.repo.branch("main")
    ns = t.repo.storage_namespace
    other = t.lake.create_repository("other", f"{t.source_uri}inner-ns")
    head = main.head().id
    t.lake.graveler.objects(ns).put("data/x/y", b"z")

    for source in (ns, f"{ns}/data/", ns.rsplit("/", 1)[0], t.source_uri):
        with pytest.raises(InvalidImportSource, match="overlaps the storage namespace"):
            main.import_objects(source)
    t.lake.delete_repository(other.name)
    hostile: list[object] = [
        "http://example.com/x/",
        "s3://",
        "file:relative/",
        f"file://{tmp_path}/%00/",
        "file:///tmp\x00/",
        42,
    ]
    for bad in hostile:
        with pytest.raises(InvalidImportSource):
            main.import_objects(bad)  # type: ignore[arg-type]
    assert main.head().id == head and list(main.uncommitted()) == []


def test_a_missing_or_empty_prefix_is_not_found(
    lake_with_source: ImportLake, tmp_path: Path
) -> None:
    t = lake_with_source
    main = t.repo.branch("main")
    head = main.head().id
    empty = t.source_uri + "nothing-here/"
    if empty.startswith("file://"):
        (tmp_path / "existing" / "nothing-here").mkdir()
    for source in (empty, t.source_uri + "absent/", f"file://{tmp_path}/absent/"):
        with pytest.raises(NotFound):
            main.import_objects(source)
    gone = t.repo.create_branch("gone")
    t.repo.delete_branch("gone")
    with pytest.raises(NotFound, match="gone"):
        gone.import_objects(t.source_uri)
    assert main.head().id == head


def test_invalid_prefixes_and_metadata_are_refused_before_listing(
    lake_with_source: ImportLake,
) -> None:
    main = lake_with_source.repo.branch("main")
    head = main.head().id
    for prefix in ("a\x00b", "\udcff", 7):
        with pytest.raises(InvalidArgument):
            main.import_objects(lake_with_source.source_uri, prefix=prefix)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="metadata"):
        main.import_objects(lake_with_source.source_uri, metadata={"k": 1})  # type: ignore[dict-item]
    assert main.head().id == head


@pytest.mark.s3
def test_hostile_s3_keys(s3_server: S3Server, s3_bucket: str, tmp_path: Path) -> None:
    """Keys with control characters and of 800 characters import and read back; SeaweedFS
    rewrites `a//b` as `a/b` and refuses `..` itself, and the folder marker is passed over
    and counted (keys AWS holds verbatim: test_import_odd_keys)."""
    with Lake.connect(f"sqlite:///{tmp_path}/lake.db", s3_options=s3_server.options) as lake:
        repo = lake.create_repository("sales", f"s3://{s3_bucket}/ns")
        bucket = lake.graveler.objects(f"s3://{s3_bucket}")
        client = s3_server.client()
        long_key = "src/" + "/".join(["k" * 200] * 4)
        keys = {long_key: b"long", "src/tab\tnew\nline": b"ctl", "src/ok": b"ok"}
        for key, data in keys.items():
            client.put_object(Bucket=s3_bucket, Key=key, Body=data)
        for key in ("src/../escape", "src/a//b", "src/folder/"):
            with contextlib.suppress(ClientError):  # SeaweedFS refuses some of them itself
                client.put_object(Bucket=s3_bucket, Key=key, Body=b"left out")

        result = repo.branch("main").import_objects(f"s3://{s3_bucket}/src/", prefix="in/")

        listed = {info.key for info in bucket.list_objects("src/")}
        assert result.count == len(listed) and set(keys) <= listed
        assert result.folder_markers == 1
        for key, data in keys.items():
            assert repo.ref("main").read("in/" + key.removeprefix("src/")) == data
        paths = [entry.path for entry in repo.ref("main").list()]
        assert not [p for p in paths if "/../" in p or "//" in p or p.endswith("/")]


def test_a_local_file_name_that_is_no_path_fails_the_import_with_nothing_committed(
    tmp_path: Path,
) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "good").write_bytes(b"good")
    os.close(os.open(bytes(source) + b"/bad-\xff", os.O_CREAT | os.O_WRONLY))
    with Lake.connect(f"sqlite:///{tmp_path}/lake.db", range_cache_dir="") as lake:
        repo = lake.create_repository("sales", f"file://{tmp_path}/ns")
        main = repo.branch("main")
        head = main.head().id
        with pytest.raises(InvalidArgument, match="cannot be imported"):
            main.import_objects(source.as_uri())
        assert main.head().id == head


def test_a_lost_race_lands_the_import_on_the_new_head(lake_with_source: ImportLake) -> None:
    t = lake_with_source
    main = t.repo.branch("main")
    importing = lambda: main.import_objects(t.source_uri, prefix="raw/")  # noqa: E731
    with held_at("import.after_record", importing) as held:
        main.upload("other.txt", b"other")
        other = main.commit("meanwhile")

    commit = held.result.commit
    assert commit is not None and commit.parents == (other.id,)
    assert main.head().id == commit.id
    assert {e.path for e in main.list()} == {"other.txt", *(f"raw/{k}" for k in OBJECTS)}


def test_a_lost_race_inside_the_prefix_lands_what_a_fresh_import_would(
    lake_with_source: ImportLake,
) -> None:
    """`main` holds a listed object's entry already when the import applies its listing, then
    changes it and another path under the prefix before the import lands: the import's
    retry lists again onto the new HEAD, so the listed value wins and nothing conflicts, as
    an import started after those commits would."""
    t = lake_with_source
    main = t.repo.branch("main")
    main.import_objects(t.source_uri, prefix="raw/")
    listed = main.stat("raw/a.csv")
    t.source.put("dir/new.csv", b"new")
    importing = lambda: main.import_objects(t.source_uri, prefix="raw/")  # noqa: E731
    with held_at("import.after_record", importing) as held:
        main.upload("raw/a.csv", b"changed meanwhile")
        main.upload("raw/dir/new.csv", b"written meanwhile")
        main.commit("meanwhile")

    assert held.raised is None and held.result.commit is not None
    assert main.head().id == held.result.commit.id
    assert main.stat("raw/a.csv").address == listed.address
    assert main.read("raw/dir/new.csv") == b"new"


def import_in_another_process(kv_url: str, s3_options: dict[str, str], source: str) -> str:
    """The import of `source` into main under raw/, one object a batch; the commit's id."""
    imports.BATCH = 1
    with Lake.connect(kv_url, s3_options=s3_options, range_cache_dir="") as lake:
        result = lake.repository("sales").branch("main").import_objects(source, prefix="raw/")
        return result.commit.id if result.commit else "none"


@pytest.mark.parametrize("point", ["import.after_batch", "import.after_record"])
def test_a_killed_import_run_again_ends_as_one_uninterrupted_import(
    lake_with_source: ImportLake, point: str
) -> None:
    t = lake_with_source
    main = t.repo.branch("main")
    base = main.head().id
    t.repo.create_branch("twin", source="main")
    expected = t.repo.branch("twin").import_objects(t.source_uri, prefix="raw/").commit
    assert expected is not None
    args = (import_in_another_process, t.kv_url, t.s3_options, t.source_uri)

    killed = forked_run(*args, env={failpoints.ENV: f"{point}=kill"})
    assert killed.code == -signal.SIGKILL, killed
    assert main.head().id == base

    rerun = forked_run(*args)
    assert rerun.code == 0, rerun

    head = main.head()
    assert rerun.returned == head.id and head.parents == (base,)
    assert head.metarange_id == expected.metarange_id
    assert list(main.uncommitted()) == []


def test_a_local_walk_lists_regular_files_in_key_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Folders are walked where their names sort with a `/` after them (`a-c` and `a.d/e`
    before `a/b`), at any depth, across batches; a link to a file is that file, a link to a
    folder, a dangling link and a FIFO are left out."""
    root = tmp_path / "src"
    files = ["a/b", "a-c", "a.d/e", "a/f/g", "a/f/h", "a0", "b", "z/y/x/w"]
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(name.encode())
    (root / "l").symlink_to(root / "b")
    (root / "ld").symlink_to(root / "a")
    (root / "dangling").symlink_to(root / "nowhere")
    os.mkfifo(root / "p")
    expected = sorted([*files, "l"])
    prefix = str(root).lstrip("/") + "/"

    tables = list(imports.list_local(str(root), prefix))

    rows = [row for table in tables for row in table.to_pylist()]
    assert [row["key"] for row in rows] == [prefix + name for name in expected]
    sizes = {row["key"].removeprefix(prefix): row["size"] for row in rows}
    assert sizes == {name: len(name.encode()) for name in files} | {"l": 1}
    monkeypatch.setattr(imports, "BATCH", 2)
    with Lake.connect(f"sqlite:///{tmp_path}/lake.db", range_cache_dir="") as lake:
        main = lake.create_repository("sales", f"file://{tmp_path}/ns").branch("main")
        result = main.import_objects(root.as_uri(), prefix="in")
        assert [e.path for e in main.list()] == [f"in/{name}" for name in expected]
        assert result.count == len(expected) and main.read("in/l") == b"b"


def test_read_ahead_keeps_order_raises_in_order_and_stops_drawing_once_closed() -> None:
    drawn: list[int] = []

    def items(count: int, error: bool) -> Iterator[int]:
        for item in range(count):
            drawn.append(item)
            yield item
        if error:
            raise RuntimeError("listing failed")

    got: list[int] = []
    with pytest.raises(RuntimeError, match="listing failed"):
        got.extend(imports.read_ahead(items(10, error=True), 3))
    assert got == list(range(10))

    drawn.clear()
    ahead = imports.read_ahead(items(100, error=False), 3)
    assert next(ahead) == 0
    ahead.close()
    assert 1 <= len(drawn) <= 5
    assert drawn == list(range(len(drawn)))


@pytest.mark.parametrize("mtime_floor", [0, -(2**40)])
def test_local_checksums_are_mtime_and_size_in_hex_as_percent_x_writes_them(
    mtime_floor: int,
) -> None:
    """Made in Arrow from each value's hex digits; an mtime before 1970 takes `%x` itself."""
    import pyarrow as pa

    from branchwater.engine.objects.s3 import LIST_SCHEMA

    mtimes = [0, 1, 15, 16, 2**62, 1_700_000_000_123_456, mtime_floor, 2**63 - 1]
    sizes = [0, 15, 16, 255, 2**40, 64, 1, 2**63 - 1]
    table = pa.table(
        {
            "key": [str(i) for i in range(len(sizes))],
            "size": sizes,
            "mtime": pa.array(mtimes, pa.int64()).cast(LIST_SCHEMA.field("mtime").type),
            "etag": pa.nulls(len(sizes), pa.string()),
        },
        schema=LIST_SCHEMA,
    )
    got = imports._checksums(table, etags=False).to_pylist()
    assert got == [f"etag:{m:x}-{s:x}" for m, s in zip(mtimes, sizes, strict=True)]


def test_rebatched_starts_small_and_doubles_up_to_the_batch() -> None:
    import pyarrow as pa

    tables = [pa.table({"n": list(range(i, i + 7))}) for i in range(0, 70, 7)]
    batches = list(imports.rebatched(tables, 16, first=3))
    assert [len(b) for b in batches] == [3, 6, 12, 16, 16, 16, 1]
    assert [n for b in batches for n in b["n"].to_pylist()] == list(range(70))
