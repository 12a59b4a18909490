"""Odd but legal keys on every driver: put, get, ranged reads, stat, listing and delete keep
them exactly; keys a driver cannot hold as given (empty, `.` or `..` parts, which a file
system, obstore and directory-backed S3 servers such as SeaweedFS all rewrite or refuse;
names longer than the store allows; local names it reserves) are refused with a typed error
that says why, never stored under another key."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from branchwater.engine.errors import InvalidArgument
from branchwater.engine.objects import ObjectStore
from branchwater.engine.objects.local import LocalObjectStore
from branchwater.engine.objects.s3 import S3ObjectStore

ODD_KEYS = [
    "with space",
    " lead",
    "dir/ trail ",
    "a+b",
    "a%20b",
    "a%2Fb",
    "a#b?c&d=e",
    "a~b:c*d",
    "..a",
    "a..",
    ".hidden",
    "d/.tmp",
    "ä/ü/ß",
    "emoji-\U0001f600",
    "x" * 200,
]
UNREPRESENTABLE = ["a//b", "a/./b", "a/../b", "./a", "a/.", ".."]


@pytest.mark.parametrize("key", ODD_KEYS)
def test_odd_keys_round_trip_list_and_delete(store: ObjectStore, key: str) -> None:
    data = key.encode() + bytes(range(256))
    assert store.put(key, data).size == len(data)
    store.put(f"{key}~sibling", b"s")
    assert store.get(key) == data
    assert store.stat(key).size == len(data)
    with store.open(key) as f:
        f.seek(3)
        assert f.read(5) == data[3:8]
        f.seek(-4, 2)
        assert f.read() == data[-4:]
    assert [info.key for info in store.list_objects(key)] == [key, f"{key}~sibling"]
    folder, _, name = key.rpartition("/")
    assert name in store.list_folder(folder).names
    store.delete([key])
    assert [info.key for info in store.list_objects()] == [f"{key}~sibling"]


@pytest.mark.parametrize("key", UNREPRESENTABLE)
def test_keys_with_empty_or_dot_parts_are_refused_saying_why(store: ObjectStore, key: str) -> None:
    store.put("a/b", b"the real a/b")
    for call in (
        lambda: store.put(key, b"v"),
        lambda: store.get(key),
        lambda: store.stat(key),
        lambda: store.delete([key]),
    ):
        with pytest.raises(InvalidArgument, match=re.escape("empty, '.' or '..' parts")):
            call()
    assert [info.key for info in store.list_objects()] == ["a/b"]
    assert store.get("a/b") == b"the real a/b"


@pytest.mark.parametrize("prefix", ["a//", "a//b", "a/./", "./a", "a/../a"])
def test_a_listing_prefix_with_empty_or_dot_parts_finds_nothing(
    store: ObjectStore, prefix: str
) -> None:
    """No key has such parts, so none is listed, least of all `a/b` as `a//b`."""
    store.put("a/b", b"1")
    assert list(store.list_objects(prefix)) == []


def test_local_key_longer_than_a_file_name_is_refused_saying_why(tmp_path: Path) -> None:
    store = LocalObjectStore(f"file://{tmp_path}")
    with pytest.raises(InvalidArgument, match="longer than"):
        store.put("d/" + "x" * 300, b"v")
    assert list(store.list_objects()) == []


def test_local_key_with_a_nul_is_refused_saying_why(tmp_path: Path) -> None:
    """A file name cannot hold one: the file system call would raise `ValueError`."""
    store = LocalObjectStore(f"file://{tmp_path}")
    for call in (
        lambda: store.put("d/a\x00b", b"v"),
        lambda: store.get("d/a\x00b"),
        lambda: store.stat("a\x00"),
    ):
        with pytest.raises(InvalidArgument, match="holds a NUL"):
            call()
    assert list(store.list_objects()) == []


def test_local_names_reserved_for_writes_in_progress_are_refused(tmp_path: Path) -> None:
    """Listings skip `.tmp-` names (a write in progress): such a key would be invisible."""
    store = LocalObjectStore(f"file://{tmp_path}")
    with pytest.raises(InvalidArgument, match="reserved"):
        store.put("d/.tmp-x", b"v")
    with pytest.raises(InvalidArgument, match="reserved"):
        store.put(".tmp-d/x", b"v")
    assert list(store.list_objects()) == []


@pytest.mark.s3
def test_s3_key_longer_than_the_server_takes_is_refused_saying_why(
    s3_store: S3ObjectStore,
) -> None:
    """Over S3's 1024 bytes it is refused before any request; SeaweedFS takes fewer (a file
    name's worth per part), and says so with KeyTooLongError."""
    with pytest.raises(InvalidArgument, match="1024 bytes"):
        s3_store.put("k" * 1025, b"v")
    with pytest.raises(InvalidArgument, match="too long"):
        s3_store.put("k" * 900, b"v")
    assert list(s3_store.list_objects()) == []
