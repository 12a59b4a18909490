"""One conformance suite for every `ObjectStore` driver, plus driver-specific guarantees.

Local runs on `tmp_path`; S3 runs on the SeaweedFS server, in a fresh bucket, both at the
bucket root and below a key prefix (prefix handling is where S3 drivers usually go wrong).
"""

from __future__ import annotations

import os
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from obstore.exceptions import GenericError

from branchwater.engine.errors import ConfigurationError, InvalidArgument, NotFound, Unavailable
from branchwater.engine.objects import ObjectStore, open_object_store
from branchwater.engine.objects import s3 as s3_module
from branchwater.engine.objects.local import LocalObjectStore
from branchwater.engine.objects.s3 import S3ObjectStore
from branchwater.engine.objects.store import MAX_READ_AHEAD
from tests.fixtures.s3 import S3Server
from tests.helpers.servers import free_port, unique_name

INVALID_KEYS = ["", "/abs", "a/../b", "a//b", "a/", "./a"]
ORDERED_KEYS = ["a-c", "a.d", "a/b", "a/b-x", "a0", "b/x"]
"""Ascending key order; a driver that sorts path parts instead of keys puts `a/…` first."""

CLOCK_SLACK = timedelta(seconds=2)
"""S3 HEAD reports whole seconds, and put's time comes from a different header."""


def keys_of(store: ObjectStore, prefix: str = "") -> list[str]:
    return [info.key for info in store.list_objects(prefix)]


def test_put_get_round_trip(store: ObjectStore) -> None:
    info = store.put("tables/a.parquet", b"\x00payload\xff")
    assert (info.key, info.size) == ("tables/a.parquet", 9)
    assert store.get("tables/a.parquet") == b"\x00payload\xff"
    assert store.exists("tables/a.parquet")


def test_empty_object(store: ObjectStore) -> None:
    store.put("empty", b"")
    assert store.get("empty") == b""
    assert store.stat("empty").size == 0


def test_overwrite_replaces_whole_object(store: ObjectStore) -> None:
    store.put("k", b"first version, longer")
    store.put("k", b"second")
    assert store.get("k") == b"second"
    assert store.stat("k").size == 6
    assert keys_of(store) == ["k"]


def test_put_if_absent_writes_only_a_new_key(store: ObjectStore) -> None:
    assert store.put_if_absent("ranges/r1", lambda: b"first") is True
    assert store.put_if_absent("ranges/r1", lambda: b"other bytes") is False
    assert store.get("ranges/r1") == b"first"
    assert keys_of(store) == ["ranges/r1"]


def test_of_two_writers_racing_for_a_new_key_put_if_absent_lets_one_write(
    store: ObjectStore,
) -> None:
    """Both are held until each has found the key free and made its bytes: one writes, the
    other is told it did not, and the object holds the winner's bytes."""
    both_made = threading.Barrier(2, timeout=30)
    wrote: dict[bytes, bool] = {}

    def race(body: bytes) -> None:
        def encode() -> bytes:
            both_made.wait()
            return body

        wrote[body] = store.put_if_absent("marker", encode)

    racers = [threading.Thread(target=race, args=(body,)) for body in (b"alpha", b"beta")]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(60)
    assert sorted(wrote.values()) == [False, True], wrote
    assert store.get("marker") == next(body for body, won in wrote.items() if won)
    assert [info.key for info in store.list_objects()] == ["marker"]


def test_local_put_if_absent_makes_no_bytes_for_a_taken_key(tmp_path: Path) -> None:
    """A range already stored is not encoded again just to be turned away."""
    store = LocalObjectStore(f"file://{tmp_path}")
    store.put("ranges/r1", b"first")
    encoded: list[bytes] = []

    def encode() -> bytes:
        encoded.append(b"again")
        return b"again"

    assert store.put_if_absent("ranges/r1", encode) is False
    assert encoded == [] and store.get("ranges/r1") == b"first"


def test_local_writes_land_in_a_folder_on_another_file_system(tmp_path: Path) -> None:
    """A slice (or the ranges folder) may be a mount or a link to another disk: a write's
    temporary file sits beside its object, so the rename into place never crosses devices."""
    elsewhere = Path("/dev/shm") / unique_name("bw-slice-")
    elsewhere.mkdir()
    try:
        store = LocalObjectStore(f"file://{tmp_path / 'root'}")
        (store.root / "data").mkdir(parents=True)
        (store.root / "data" / "s1").symlink_to(elsewhere)
        if os.stat(elsewhere).st_dev == os.stat(store.root).st_dev:
            pytest.skip("/dev/shm is on the same file system as the test's folder here")
        store.put("data/s1/object", b"written")
        assert store.put_if_absent("data/s1/new", lambda: b"new")
        assert (store.get("data/s1/object"), store.get("data/s1/new")) == (b"written", b"new")
    finally:
        for path in elsewhere.iterdir():
            path.unlink()
        elsewhere.rmdir()


def test_put_if_absent_refuses_invalid_keys(store: ObjectStore) -> None:
    with pytest.raises(InvalidArgument):
        store.put_if_absent("a//b", lambda: b"x")
    assert keys_of(store) == []


def test_stat_reports_size_and_mtime(store: ObjectStore) -> None:
    before = datetime.now(UTC)
    put_info = store.put("dir/obj", b"x" * 1234)
    stat_info = store.stat("dir/obj")
    (listed,) = store.list_objects("dir/")
    assert stat_info.size == listed.size == 1234
    for moment in (put_info.mtime, stat_info.mtime, listed.mtime):
        assert moment.tzinfo is not None
        assert before - CLOCK_SLACK <= moment <= datetime.now(UTC) + CLOCK_SLACK
    assert abs(put_info.mtime - stat_info.mtime) <= CLOCK_SLACK
    assert abs(listed.mtime - stat_info.mtime) <= CLOCK_SLACK


@pytest.mark.parametrize("key", ["missing", "dir/missing", "dir"])
def test_missing_object_is_not_found(store: ObjectStore, key: str) -> None:
    store.put("dir/present", b"1")
    with pytest.raises(NotFound, match=key) as get_error:
        store.get(key)
    assert store.url in str(get_error.value)
    with pytest.raises(NotFound, match=key):
        store.stat(key)
    assert not store.exists(key)


def test_bulk_delete_ignores_missing_keys(store: ObjectStore) -> None:
    for key in ("a", "b/1", "b/2", "c"):
        store.put(key, key.encode())
    store.delete(["a", "b/1", "never-was", "b/never-was", "b/2"])
    assert keys_of(store) == ["c"]
    store.delete([])
    store.delete(iter(["c", "c"]))
    assert keys_of(store) == []


def test_list_is_in_ascending_key_order(store: ObjectStore) -> None:
    for key in reversed(ORDERED_KEYS):
        store.put(key, key.encode())
    assert keys_of(store) == ORDERED_KEYS
    assert [i.size for i in store.list_objects()] == [len(k) for k in ORDERED_KEYS]


@pytest.mark.parametrize(
    ("prefix", "expected"),
    [
        ("a", ["a-c", "a.d", "a/b", "a/b-x", "a0"]),
        ("a/", ["a/b", "a/b-x"]),
        ("a/b", ["a/b", "a/b-x"]),
        ("a/b-", ["a/b-x"]),
        ("a-", ["a-c"]),
        ("b/x", ["b/x"]),
        ("zz", []),
        ("a/zz/", []),
    ],
)
def test_list_by_prefix(store: ObjectStore, prefix: str, expected: list[str]) -> None:
    for key in ORDERED_KEYS:
        store.put(key, b"v")
    assert keys_of(store, prefix) == expected


def test_list_of_empty_store_is_empty(store: ObjectStore) -> None:
    assert keys_of(store) == []
    assert keys_of(store, "nothing/here/") == []


@pytest.mark.parametrize("key", INVALID_KEYS)
def test_invalid_keys_are_rejected(store: ObjectStore, key: str) -> None:
    with pytest.raises(InvalidArgument):
        store.put(key, b"v")
    with pytest.raises(InvalidArgument):
        store.get(key)
    with pytest.raises(InvalidArgument):
        store.stat(key)
    with pytest.raises(InvalidArgument):
        store.delete(["fine", key])
    assert keys_of(store) == []


def test_uri_names_the_object_for_other_tools(store: ObjectStore) -> None:
    assert store.uri("a/b") == f"{store.url}/a/b"


# --- local filesystem only ---------------------------------------------------------------


def test_local_put_is_atomic_for_concurrent_readers(tmp_path: Path) -> None:
    """A reader and a lister racing a writer only ever see whole versions and real keys."""
    store = LocalObjectStore(f"file://{tmp_path}")
    size = 8 * 1024 * 1024
    versions = (b"a" * size, b"b" * (size + 12345))
    store.put("big", versions[0])
    done = threading.Event()
    seen: dict[str, list[object]] = {"reads": [], "bad_reads": [], "bad_lists": []}

    def read() -> None:
        while not done.is_set():
            data = store.get("big")
            seen["reads"].append(len(data))
            if data not in versions:
                seen["bad_reads"].append(len(data))

    def list_keys() -> None:
        while not done.is_set():
            keys = [info.key for info in store.list_objects()]
            if keys != ["big"]:
                seen["bad_lists"].append(keys)

    threads = [threading.Thread(target=read), threading.Thread(target=list_keys)]
    for thread in threads:
        thread.start()
    try:
        for i in range(40):
            store.put("big", versions[i % 2])
    finally:
        done.set()
        for thread in threads:
            thread.join(timeout=30)
    assert seen["reads"], "the reader never ran"
    assert seen["bad_reads"] == []
    assert seen["bad_lists"] == []
    assert [p.name for p in tmp_path.iterdir()] == ["big"]


def test_local_url_must_be_absolute_file_url() -> None:
    with pytest.raises(ConfigurationError):
        LocalObjectStore("file://host/path")


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"endpoint_url": "localhost:9000"}, "is not a URL such as http://localhost:9000"),
        ({"endpoint_url": "http://127.0.0.1:abc"}, "give its scheme, host and port"),
        ({"endpoint_url": "ftp://s3.example.com"}, "give its scheme, host and port"),
        ({"aws_access_key_id": "AK"}, "aws_secret_access_key is missing"),
        ({"aws_secret_access_key": "sk"}, "aws_access_key_id is missing"),
    ],
)
def test_s3_options_the_client_cannot_use_are_refused_where_the_store_opens(
    options: dict[str, str], says: str
) -> None:
    """The client panicked (a `BaseException` past every handler, a CLI traceback) on an
    endpoint without its scheme, and raised a bare `TypeError` for half a key pair."""
    with pytest.raises(ConfigurationError, match=says):
        open_object_store("s3://bucket/prefix", **options)


# --- S3 only ------------------------------------------------------------------------------


@pytest.mark.s3
def test_s3_keys_live_below_the_url_prefix(s3_server: S3Server, s3_bucket: str) -> None:
    raw = s3_server.client()
    raw.put_object(Bucket=s3_bucket, Key="lake/ns-10/other", Body=b"sibling prefix")
    raw.put_object(Bucket=s3_bucket, Key="lake/ns-1/folder/", Body=b"")
    store = S3ObjectStore(f"s3://{s3_bucket}/lake/ns-1/", **s3_server.options)
    store.put("t/a", b"data")
    assert raw.get_object(Bucket=s3_bucket, Key="lake/ns-1/t/a")["Body"].read() == b"data"
    assert keys_of(store) == ["t/a"]
    assert store.url == f"s3://{s3_bucket}/lake/ns-1"
    assert store.uri("t/a") == f"s3://{s3_bucket}/lake/ns-1/t/a"


@pytest.mark.s3
def test_s3_delete_works_in_batches(
    s3_server: S3Server, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(s3_module, "DELETE_BATCH", 3)
    store = S3ObjectStore(f"s3://{s3_bucket}", **s3_server.options)
    keys = [f"k{i:02d}" for i in range(8)]
    for key in keys:
        store.put(key, b"v")
    store.delete(key for key in [*keys[:7], "gone-1", "gone-2"])
    assert keys_of(store) == ["k07"]


@pytest.mark.s3
def test_s3_missing_bucket_is_not_found_naming_the_url(s3_server: S3Server) -> None:
    url = f"s3://{unique_name('bw-missing-')}/some/prefix"
    store = S3ObjectStore(url, **s3_server.options)
    calls = [
        lambda: store.get("k"),
        lambda: store.stat("k"),
        lambda: store.exists("k"),
        lambda: store.put("k", b"v"),
        lambda: store.delete(["k"]),
        lambda: list(store.list_objects()),
    ]
    for call in calls:
        with pytest.raises(NotFound, match="does not exist") as error:
            call()
        assert url in str(error.value)


@pytest.mark.s3
def test_s3_unreachable_endpoint_is_unavailable() -> None:
    url = "s3://some-bucket/prefix"
    store = S3ObjectStore(
        url,
        endpoint_url=f"http://127.0.0.1:{free_port()}",
        aws_access_key_id="AKIDEXAMPLE",
        aws_secret_access_key="not-a-secret",
    )
    started = time.monotonic()
    for call in (
        lambda: store.get("k"),
        lambda: store.put("k", b"v"),
        lambda: list(store.list_objects()),
    ):
        with pytest.raises(Unavailable, match=url):
            call()
    assert time.monotonic() - started < 15


@pytest.mark.s3
def test_s3_without_credentials_is_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, s3_server: S3Server
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    store = S3ObjectStore(
        "s3://some-bucket", endpoint_url=s3_server.endpoint_url, region_name=s3_server.region
    )
    with pytest.raises(Unavailable, match="credentials"):
        store.stat("k")


@pytest.mark.s3
def test_s3_wrong_credentials_are_unavailable(s3_server: S3Server, s3_bucket: str) -> None:
    """A real server checks signatures: a wrong secret is refused, on GET and on HEAD alike."""
    wrong = {**s3_server.options, "aws_secret_access_key": "not-" + s3_server.secret_key}
    store = S3ObjectStore(f"s3://{s3_bucket}", **wrong)
    for call in (
        lambda: store.get("k"),
        lambda: store.stat("k"),
        lambda: list(store.list_objects()),
    ):
        with pytest.raises(Unavailable, match="refused our credentials"):
            call()


@pytest.mark.s3
def test_s3_put_if_absent_is_one_conditional_put(
    s3_store: S3ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No HEAD before the PUT, new key or not: the server's 412 says the key is taken (and
    only then does a HEAD say whose bytes it holds: `test_s3_lost_replies`)."""

    def no_head(key: str) -> None:
        raise AssertionError(f"HEAD of {key!r}")

    monkeypatch.setattr(s3_store, "stat", no_head)
    assert s3_store.put_if_absent("m1", lambda: b"one") is True
    assert s3_store.put_if_absent("m1", lambda: b"two") is False
    monkeypatch.undo()
    assert s3_store.get("m1") == b"one"


def _refusing(status: str, code: str) -> GenericError:
    return GenericError(
        f"Error performing PUT http://s3/k in 1ms - Server returned non-2xx status code: "
        f"{status} : <Error><Code>{code}</Code></Error>"
    )


@pytest.mark.s3
@pytest.mark.parametrize(
    ("status", "code", "remembered"),
    [("501", "NotImplemented", True), ("409", "ConditionalRequestConflict", False)],
)
def test_s3_put_if_absent_falls_back_to_head_and_put(
    s3_store: S3ObjectStore,
    monkeypatch: pytest.MonkeyPatch,
    status: str,
    code: str,
    remembered: bool,
) -> None:
    """A server without conditional writes (501) gets HEAD + PUT from then on; a conflict
    with another conditional write (409) that lasts through every retry gets them once.
    Either way the object is written once, and a taken key is left as it is."""
    put = s3_module.obstore.put
    conditional: list[str] = []

    def refusing_conditions(store: object, key: str, body: object, **options: object) -> object:
        if options.get("mode") == "create":
            conditional.append(key)
            raise _refusing(status, code)
        return put(store, key, body, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(s3_module.obstore, "put", refusing_conditions)
    monkeypatch.setattr(s3_module, "CONFLICT_PAUSES", (0.0,) * 3)
    assert s3_store.put_if_absent("f1", lambda: b"one") is True
    assert s3_store.put_if_absent("f1", lambda: b"two") is False
    assert conditional == (["f1"] if remembered else ["f1"] * 8)
    monkeypatch.undo()
    assert s3_store.get("f1") == b"one"


@pytest.mark.s3
def test_s3_put_if_absent_asks_again_after_a_conflict_rather_than_write_unconditionally(
    s3_store: S3ObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 409 says another conditional write of the key is under way: asked again once it
    has ended, the server's answer decides, and no PUT without the condition is sent."""
    put = s3_module.obstore.put
    sent: list[object] = []

    def conflicting_once(store: object, key: str, body: object, **options: object) -> object:
        sent.append(options.get("mode"))
        if len(sent) == 1:
            raise _refusing("409", "ConditionalRequestConflict")
        return put(store, key, body, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(s3_module.obstore, "put", conflicting_once)
    monkeypatch.setattr(s3_module, "CONFLICT_PAUSES", (0.0,) * 3)
    assert s3_store.put_if_absent("c1", lambda: b"one") is True
    assert sent == ["create", "create"]


def test_s3_construction_needs_no_network() -> None:
    store = S3ObjectStore(
        "s3://bucket-x/p", endpoint_url=f"http://127.0.0.1:{free_port()}", region_name="eu-west-1"
    )
    assert store.url == "s3://bucket-x/p"
    store.close()


@pytest.mark.parametrize(
    "url", ["s3://", "s3:///prefix", "s3://b", "s3://bucket/a//b", "s3://bucket/p?x=1", "gs://b"]
)
def test_s3_malformed_url_is_a_configuration_error(url: str) -> None:
    with pytest.raises(ConfigurationError):
        S3ObjectStore(url, region_name="us-east-1")


@pytest.mark.s3
def test_s3_keys_with_control_characters_are_listed_read_and_deleted(
    s3_server: S3Server, s3_bucket: str
) -> None:
    """obstore refuses such keys (and fails a listing that meets one): other tools write
    them, so the driver reads, lists and deletes them all the same, and refuses to write."""
    raw = s3_server.client()
    hostile = "t/tab\tnew\nline"
    data = os.urandom(3 * MAX_READ_AHEAD)
    raw.put_object(Bucket=s3_bucket, Key="ns/" + hostile, Body=data)
    raw.close()
    store = S3ObjectStore(f"s3://{s3_bucket}/ns", **s3_server.options)
    for key in ("a", "t/a", "t/z"):
        store.put(key, b"v")

    assert keys_of(store) == ["a", "t/a", hostile, "t/z"]
    assert keys_of(store, "t/t") == [hostile]
    assert sorted(store.list_folder("t").names) == ["a", hostile.removeprefix("t/"), "z"]
    assert store.stat(hostile).size == len(data)
    with store.open(hostile) as f:
        f.seek(MAX_READ_AHEAD + 5)
        assert f.read(10) == data[MAX_READ_AHEAD + 5 : MAX_READ_AHEAD + 15]
    assert store.get(hostile) == data
    with pytest.raises(InvalidArgument, match="control characters"):
        store.put("t/bell\x07", b"v")
    store.delete([hostile, "t/a"])
    assert keys_of(store) == ["a", "t/z"]
    store.close()
