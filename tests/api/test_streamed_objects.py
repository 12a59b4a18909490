"""`Branch.upload` of bytes, paths and file objects, and `Ref.open`, on local files and S3:
the staged size and checksum are the content's, reads give it back, unchanged content writes
nothing, and a damaged object fails the read that would complete it. The slow test streams
a 512 MiB file (2 GiB in the long run) in a child process, through the API (`upload_file`,
`open`) and the CLI, in bounded memory."""

from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from branchwater.engine import CorruptedData, InvalidArgument, Lake
from branchwater.engine.api import Ref, Repository
from branchwater.engine.objects import s3 as s3_module
from tests.fixtures.s3 import S3Server
from tests.helpers.long_run import LONG_TESTS

DATA = os.urandom(2 * s3_module.PART_SIZE + 999)
"""Content that streams in three parts on S3."""


class Stream(io.RawIOBase):
    """A binary stream that cannot seek, as a pipe or a socket."""

    def __init__(self, data: bytes) -> None:
        self._f = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        return self._f.readinto(buffer)


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.s3)])
def store_repo(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Repository]:
    """Repository `sales` on local files or on a fresh S3 bucket."""
    if request.param == "local":
        with Lake.connect("memory://") as lake:
            yield lake.create_repository("sales", f"file://{tmp_path}/sales")
        return
    server: S3Server = request.getfixturevalue("s3_server")
    bucket = request.getfixturevalue("s3_bucket")
    with Lake.connect("memory://", s3_options=server.options) as lake:
        yield lake.create_repository("sales", f"s3://{bucket}/sales")
        store = lake.graveler.objects(f"s3://{bucket}/sales")
        store.delete(info.key for info in store.list_objects())


def sources(tmp_path: Path) -> dict[str, Callable[[], Any]]:
    file = tmp_path / "source.bin"
    file.write_bytes(DATA)
    return {
        "bytes": lambda: DATA,
        "str-path": lambda: str(file),
        "path": lambda: file,
        "file": lambda: open(file, "rb"),
        "stream": lambda: io.BufferedReader(Stream(DATA)),
    }


KINDS = ["bytes", "str-path", "path", "file", "stream"]


def upload_from(repo: Repository, path: str, source: Any) -> Any:
    try:
        return repo.branch("main").upload(path, source)
    finally:
        if hasattr(source, "close"):
            source.close()


def data_objects(repo: Repository) -> list[str]:
    store = repo.lake.graveler.objects(repo.storage_namespace)
    return [info.key for info in store.list_objects("data/")]


@pytest.mark.parametrize("kind", KINDS)
def test_upload_stages_the_size_and_checksum_and_reads_back_equal(
    store_repo: Repository, tmp_path: Path, kind: str
) -> None:
    entry = upload_from(store_repo, "big.bin", sources(tmp_path)[kind]())
    assert entry.size == len(DATA)
    assert entry.checksum == hashlib.sha256(DATA).hexdigest()
    main = store_repo.branch("main")
    assert main.stat("big.bin") == entry
    assert main.read("big.bin") == DATA
    with main.open("big.bin") as f:
        assert f.read() == DATA
    assert data_objects(store_repo) == [entry.address]


@pytest.mark.parametrize("kind", KINDS)
def test_upload_of_content_the_branch_shows_writes_nothing(
    store_repo: Repository, tmp_path: Path, kind: str
) -> None:
    first = store_repo.branch("main").upload("big.bin", DATA)
    again = upload_from(store_repo, "big.bin", sources(tmp_path)[kind]())
    assert again == first
    assert data_objects(store_repo) == [first.address]
    assert [c.entry for c in store_repo.branch("main").uncommitted()] == [first]


def test_upload_after_the_file_position_reads_from_there(repo: Repository) -> None:
    f = io.BytesIO(b"header|body")
    f.seek(7)
    entry = repo.branch("main").upload("body", f)
    assert repo.branch("main").read("body") == b"body"
    assert entry.checksum == hashlib.sha256(b"body").hexdigest()


@pytest.mark.parametrize(
    ("source", "match"),
    [
        (lambda p: 42, "not int"),
        (lambda p: io.StringIO("text"), "binary mode"),
        (lambda p: open(p, encoding="utf-8"), "binary mode"),  # noqa: SIM115
        (lambda p: p.parent / "missing.bin", "missing.bin"),
    ],
    ids=["int", "text-io", "text-file", "missing-file"],
)
def test_a_bad_source_is_refused_before_anything_is_written(
    repo: Repository, tmp_path: Path, source: Callable[[Path], Any], match: str
) -> None:
    file = tmp_path / "text.txt"
    file.write_text("text")
    with pytest.raises(InvalidArgument, match=match):
        upload_from(repo, "refused", source(file))
    assert data_objects(repo) == []
    assert list(repo.branch("main").uncommitted()) == []


@pytest.mark.parametrize("kind", ["str-path", "path"])
def test_upload_file_streams_a_local_file_as_upload_does(
    store_repo: Repository, tmp_path: Path, kind: str
) -> None:
    local = sources(tmp_path)[kind]()
    entry = store_repo.branch("main").upload_file("big.bin", local, {"k": "v"})
    assert (entry.size, entry.checksum) == (len(DATA), hashlib.sha256(DATA).hexdigest())
    assert entry.metadata == {"k": "v"}
    assert store_repo.branch("main").read("big.bin") == DATA
    assert store_repo.branch("main").upload_file("big.bin", local, {"k": "v"}) == entry
    assert data_objects(store_repo) == [entry.address]


@pytest.mark.parametrize(
    ("source", "match"),
    [
        (lambda p: b"content, not a name", "not bytes"),
        (lambda p: open(p, "rb"), "not BufferedReader"),  # noqa: SIM115
        (lambda p: p.parent / "missing.bin", "missing.bin"),
        (lambda p: p.parent, "text-dir|Is a directory"),
    ],
    ids=["bytes", "file-object", "missing-file", "directory"],
)
def test_upload_file_takes_only_a_readable_local_path(
    repo: Repository, tmp_path: Path, source: Callable[[Path], Any], match: str
) -> None:
    file = tmp_path / "text-dir" / "text.txt"
    file.parent.mkdir()
    file.write_text("text")
    given = source(file)
    try:
        with pytest.raises(InvalidArgument, match=match):
            repo.branch("main").upload_file("refused", given)
    finally:
        if hasattr(given, "close"):
            given.close()
    assert data_objects(repo) == []
    assert list(repo.branch("main").uncommitted()) == []


def test_upload_keeps_validating_path_and_metadata_first(repo: Repository) -> None:
    stream = io.BufferedReader(Stream(b"x"))
    with pytest.raises(InvalidArgument):
        repo.branch("main").upload("", stream)
    with pytest.raises(InvalidArgument):
        repo.branch("main").upload("a", stream, metadata={"k": 1})  # type: ignore[dict-item]
    assert stream.read() == b"x"
    assert data_objects(repo) == []


def stored_file(repo: Repository, address: str) -> Path:
    return Path(repo.storage_namespace.removeprefix("file://")) / address


def reader(repo: Repository, committed: bool) -> Ref:
    return repo.ref(repo.branch("main").commit("add").id) if committed else repo.branch("main")


@pytest.mark.parametrize("committed", [False, True])
def test_open_refuses_a_truncated_object_at_once(repo: Repository, committed: bool) -> None:
    entry = repo.branch("main").upload("obj", b"0123456789")
    ref = reader(repo, committed)
    stored_file(repo, entry.address).write_bytes(b"01234")
    with pytest.raises(CorruptedData, match="5 bytes") as caught:
        ref.open("obj")
    assert "'obj'" in str(caught.value) and entry.address in str(caught.value)
    with ref.open("obj", verify=False) as f:
        assert f.read() == b"01234"


@pytest.mark.parametrize("committed", [False, True])
def test_open_finds_a_rewritten_object_at_the_end_of_the_read(
    repo: Repository, committed: bool
) -> None:
    data = os.urandom(100_000)
    entry = repo.branch("main").upload("obj", data)
    ref = reader(repo, committed)
    stored_file(repo, entry.address).write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
    with ref.open("obj") as f:
        assert f.read(50_000) == data[:50_000]
        f.seek(10)
        assert f.read(10) == data[10:20]
        with pytest.raises(CorruptedData, match="sha256") as caught:
            f.read()
    assert "'obj'" in str(caught.value) and entry.address in str(caught.value)


def test_open_verifies_good_content_read_in_any_order(repo: Repository) -> None:
    data = os.urandom(300_000)
    repo.branch("main").upload("obj", data)
    with repo.branch("main").open("obj") as f:
        f.seek(200_000)
        assert f.read(100) == data[200_000:200_100]
        f.seek(0)
        assert f.read(250_000) == data[:250_000]
        assert f.read() == data[250_000:]
    with repo.branch("main").open("obj") as f:
        assert b"".join(iter(lambda: f.read(4096), b"")) == data


CHILD = r"""
import hashlib, json, re, sys
from branchwater.engine import Lake
from branchwater.engine.cli import main

def peak_mb():
    status = open("/proc/self/status").read()
    return int(re.search(r"VmHWM:\s*(\d+) kB", status).group(1)) / 1024


kv, namespace, source = sys.argv[1:]
with Lake.connect(kv) as lake:
    repo = lake.create_repository("big", storage_namespace=namespace)
    repo.branch("main").upload("small.bin", b"opens the store's client")
    before = peak_mb()
    entry = repo.branch("main").upload_file("api.bin", source)
    digest = hashlib.sha256()
    with repo.branch("main").open("api.bin") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
codes = [
    main(["--kv", kv, "upload", "big", "main", "cli.bin", source]),
    main(["--kv", kv, "cat", "big", "main", "cli.bin"]),
]
print(json.dumps({
    "size": entry.size, "checksum": entry.checksum, "read": digest.hexdigest(),
    "codes": codes, "before_mb": before,
    "max_rss_mb": peak_mb(),
}), file=sys.stderr)
"""
BIG = (2048 if LONG_TESTS else 512) << 20
"""Sixty-four times a part (the long run: 2 GiB, 256 parts). Four times as much streams no
differently, only longer: the bound below proves the object is never held."""
MAX_RSS_MB = 300
"""The child's peak RSS (VmHWM: ru_maxrss keeps the parent's peak across a vfork and exec),
its imports (pyarrow, boto3) taking ~180 MB of it before a byte streams."""
MAX_GROWTH_MB = 96
"""What streaming may add to the child's memory, whatever the file's size: under a fifth of
the object, so holding it, or any growing share of it, fails (measured: ~10 MB on local
files, ~50 MB on S3, whose upload holds at most five 8 MiB parts)."""


def make_big_file(path: Path, size: int) -> str:
    """`size` bytes that do not repeat within a part; returns their SHA-256."""
    block = os.urandom(1 << 20)
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        for i in range(size >> 20):
            chunk = i.to_bytes(8, "big") + block[8:]
            f.write(chunk)
            digest.update(chunk)
    return digest.hexdigest()


@pytest.fixture(scope="module")
def big_file(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, str]]:
    """The big source and its SHA-256, written once for the local and the S3 variant (each
    child only reads it): writing and hashing it costs seconds of the test. Removed after
    the module, so it does not wait in the temporary folder for the session's end."""
    source = tmp_path_factory.mktemp("big") / "big.bin"
    try:
        yield source, make_big_file(source, BIG)
    finally:
        source.unlink(missing_ok=True)


@pytest.mark.slow
# One worker runs both variants, so they share `big_file` (and it is on disk once).
@pytest.mark.xdist_group("big-stream")
@pytest.mark.parametrize("where", ["local", pytest.param("s3", marks=pytest.mark.s3)])
def test_streaming_a_big_file_keeps_memory_bounded(
    request: pytest.FixtureRequest, tmp_path: Path, big_file: tuple[Path, str], where: str
) -> None:
    env = dict(os.environ)
    namespace = f"file://{tmp_path}/ns"
    if where == "s3":
        server: S3Server = request.getfixturevalue("s3_server")
        namespace = f"s3://{request.getfixturevalue('s3_bucket')}/big"
        env |= {
            "AWS_ENDPOINT_URL": server.endpoint_url,
            "AWS_ACCESS_KEY_ID": server.access_key,
            "AWS_SECRET_ACCESS_KEY": server.secret_key,
            "AWS_DEFAULT_REGION": "us-east-1",
        }
    source, checksum = big_file
    try:
        child = subprocess.run(
            [sys.executable, "-c", CHILD, f"sqlite:///{tmp_path}/kv.db", namespace, str(source)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            timeout=1800,
            check=False,
        )
        assert child.returncode == 0, child.stderr[-3000:]
        report = json.loads(child.stderr.strip().splitlines()[-1])
        peak, before = report["max_rss_mb"], report["before_mb"]
        print(f"{where}: {BIG >> 20} MB streamed; child RSS {before:.0f} MB, peak {peak:.0f} MB")
        assert report["codes"] == [0, 0]
        assert (report["size"], report["checksum"], report["read"]) == (BIG, checksum, checksum)
        assert peak - before < MAX_GROWTH_MB
        assert peak < MAX_RSS_MB
    finally:
        if where == "s3":
            cleanup = request.getfixturevalue("s3_server").client()
            bucket = namespace.split("/")[2]
            for page in cleanup.get_paginator("list_objects_v2").paginate(Bucket=bucket):
                for obj in page.get("Contents", []):
                    cleanup.delete_object(Bucket=bucket, Key=obj["Key"])
            cleanup.close()
