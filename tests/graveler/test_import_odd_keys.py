"""Keys S3 holds that no store key can be, in an import: folder markers (keys ending in `/`,
empty or not, as lakeFS's import skips them) are passed over and counted in the result;
keys with empty or dot parts (`a//b`) refuse the import, naming them, with nothing
committed or staged.

SeaweedFS (the real S3 server of the suite) holds folder markers but rewrites `a//b` as
`a/b` and refuses `..`, so the keys AWS holds verbatim are put on moto's S3 server, which
keeps them as AWS does. An import lists SeaweedFS with obstore (boto3 taking over from where
obstore stopped once it meets a key obstore cannot address, a control character) and a
server that keeps keys verbatim with boto3, whose raw keys tell a non-empty `a/` from an
object `a`; the store's own listing on such a server stays obstore's, which still leaves
empty markers out. Local files have no such names: an empty folder is no object and no
marker."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest

from branchwater.engine import Lake
from branchwater.engine.errors import InvalidImportSource
from branchwater.engine.objects.s3 import S3ObjectStore
from tests.fixtures.s3 import S3Server
from tests.helpers.servers import free_port

pytestmark = pytest.mark.s3

MARKERS = ["src/empty-folder/", "src/full/", "src/full/sub/"]
OBJECTS = {"src/a.csv": b"a", "src/full/b.csv": b"bb", "src/full/sub/c.csv": b"ccc"}
NON_EMPTY_MARKERS = {"src/full/": b"console bytes", "src/lone/": b"no object beside it"}


@pytest.fixture(scope="module")
def verbatim_s3() -> Iterator[dict[str, str]]:
    """moto's S3 server on a loopback port: `s3_options` for it. It keeps every key
    verbatim, as AWS does."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield {
        "endpoint_url": f"http://127.0.0.1:{port}",
        "aws_access_key_id": "testing",
        "aws_secret_access_key": "testing",
        "region_name": "us-east-1",
    }
    server.stop()


def _put(options: dict[str, str], bucket: str, keys: dict[str, bytes]) -> None:
    client = boto3.session.Session().client("s3", **options)
    try:
        for key, data in keys.items():
            client.put_object(Bucket=bucket, Key=key, Body=data)
    finally:
        client.close()


def _bucket(options: dict[str, str], name: str) -> str:
    client = boto3.session.Session().client("s3", **options)
    client.create_bucket(Bucket=name)
    client.close()
    return name


@pytest.mark.parametrize("path", ["obstore", "boto3"])
def test_folder_markers_on_seaweedfs_are_passed_over_and_counted(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path, path: str
) -> None:
    keys = dict(OBJECTS) | dict.fromkeys(MARKERS, b"")
    if path == "boto3":  # obstore fails its listing here; boto3 lists every key after it
        keys["src/0\tcontrol"] = b"ctl"
    _put(s3_server.options, s3_bucket, keys)
    with Lake.connect(f"sqlite:///{tmp_path}/lake.db", s3_options=s3_server.options) as lake:
        repo = lake.create_repository("sales", f"file://{tmp_path}/ns")
        main = repo.branch("main")
        seen: list[int] = []

        result = main.import_objects(f"s3://{s3_bucket}/src/", prefix="in/", progress=seen.append)

        objects = {k: v for k, v in keys.items() if not k.endswith("/")}
        assert (result.count, result.folder_markers) == (len(objects), len(MARKERS))
        assert seen == [len(objects)]
        assert {e.path for e in main.list()} == {"in/" + k[len("src/") :] for k in objects}
        for key, data in objects.items():
            assert repo.ref("main").read("in/" + key[len("src/") :]) == data


@pytest.mark.parametrize(
    "odd",
    [
        ["src/a//b"],
        ["src/x/../y", "src/x/./z"],
        ["src//lead", "src/t//u"],
    ],
)
def test_keys_no_store_key_can_be_refuse_the_import_naming_them(
    verbatim_s3: dict[str, str], tmp_path: Path, odd: list[str]
) -> None:
    bucket = _bucket(verbatim_s3, f"odd-{abs(hash(tuple(odd))) % 10**9}")
    keys = dict(OBJECTS) | dict.fromkeys(MARKERS, b"") | dict.fromkeys(odd, b"data")
    _put(verbatim_s3, bucket, keys)
    with Lake.connect(f"sqlite:///{tmp_path}/lake.db", s3_options=verbatim_s3) as lake:
        repo = lake.create_repository("sales", f"file://{tmp_path}/ns")
        main = repo.branch("main")
        main.upload("staged.txt", b"staged")
        head = main.head().id

        with pytest.raises(InvalidImportSource) as refused:
            main.import_objects(f"s3://{bucket}/src/", prefix="in/")

        message = str(refused.value)
        assert f"{len(odd)} object(s)" in message and "nothing was committed" in message
        assert all(repr(f"s3://{bucket}/{key}") in message for key in odd)
        assert main.head().id == head
        assert [c.path for c in main.uncommitted()] == ["staged.txt"]


def test_folder_markers_on_a_verbatim_server_are_counted(
    verbatim_s3: dict[str, str], tmp_path: Path
) -> None:
    """Markers empty or not, beside their folder's objects or alone, and an object beside its
    own marker: each marker passed over and counted, every object imported."""
    bucket = _bucket(verbatim_s3, "markers-verbatim")
    markers = dict.fromkeys(MARKERS, b"") | NON_EMPTY_MARKERS | {"src/zz/m/": b""}
    objects = dict(OBJECTS) | {"src/full": b"a file beside its marker", "src/zz/\x01ctl": b"c"}
    _put(verbatim_s3, bucket, objects | markers)
    with Lake.connect(f"sqlite:///{tmp_path}/lake.db", s3_options=verbatim_s3) as lake:
        repo = lake.create_repository("sales", f"file://{tmp_path}/ns")
        main = repo.branch("main")

        result = main.import_objects(f"s3://{bucket}/src/", prefix="in/")

        assert (result.count, result.folder_markers) == (len(objects), len(markers))
        assert {e.path for e in main.list()} == {"in/" + k.removeprefix("src/") for k in objects}
        for key, data in objects.items():
            assert repo.ref("main").read("in/" + key[len("src/") :]) == data


def test_the_stores_listing_on_a_verbatim_server_leaves_empty_markers_out(
    verbatim_s3: dict[str, str],
) -> None:
    """obstore lists a marker `d/` as `d`: an empty `d` that does not exist, or a repeat of
    the object `d` listed just before it; neither is listed as an object."""
    bucket = _bucket(verbatim_s3, "markers-store")
    _put(verbatim_s3, bucket, dict(OBJECTS) | dict.fromkeys(MARKERS, b"") | {"src/full": b"f"})
    store = S3ObjectStore(f"s3://{bucket}", **verbatim_s3)

    listed = {info.key: info.size for info in store.list_objects("src/")}

    assert listed == {k: len(v) for k, v in (dict(OBJECTS) | {"src/full": b"f"}).items()}


def test_non_empty_markers_on_seaweedfs_import_as_a_local_copy_of_the_tree_does(
    s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    """SeaweedFS keeps a non-empty `a/` as a folder (listed empty): obstore's listing passes
    it over and counts it, and the entries are those a local folder of the same files gets."""
    _put(s3_server.options, s3_bucket, dict(OBJECTS) | NON_EMPTY_MARKERS)
    local = tmp_path / "copy"
    for key, data in OBJECTS.items():
        (local / key).parent.mkdir(parents=True, exist_ok=True)
        (local / key).write_bytes(data)
    (local / "src" / "lone").mkdir()
    with Lake.connect(f"sqlite:///{tmp_path}/lake.db", s3_options=s3_server.options) as lake:
        repo = lake.create_repository("sales", f"file://{tmp_path}/ns")
        s3_branch, local_branch = repo.create_branch("s3"), repo.create_branch("local")

        from_s3 = s3_branch.import_objects(f"s3://{s3_bucket}/src/", prefix="in/")
        from_local = local_branch.import_objects(f"file://{local}/src/", prefix="in/")

        assert (from_s3.count, from_s3.folder_markers) == (len(OBJECTS), len(NON_EMPTY_MARKERS))
        assert (from_local.count, from_local.folder_markers) == (len(OBJECTS), 0)
        paths = {e.path for e in s3_branch.list()}
        assert paths == {e.path for e in local_branch.list()}
        assert paths == {"in/" + k.removeprefix("src/") for k in OBJECTS}


def test_local_folders_are_no_objects_and_no_markers(tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "empty").mkdir(parents=True)
    (source / "full" / "sub").mkdir(parents=True)
    (source / "full" / "sub" / "c.csv").write_bytes(b"ccc")
    (source / "a.csv").write_bytes(b"")
    with Lake.connect(f"sqlite:///{tmp_path}/lake.db", range_cache_dir="") as lake:
        repo = lake.create_repository("sales", f"file://{tmp_path}/ns")
        main = repo.branch("main")

        result = main.import_objects(f"file://{source}/", prefix="in/")

        assert (result.count, result.folder_markers) == (2, 0)
        assert {e.path for e in main.list()} == {"in/a.csv", "in/full/sub/c.csv"}
