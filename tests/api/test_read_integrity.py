"""A read returns the content its entry records, or `CorruptedData` naming path and address:
objects truncated, extended or rewritten in storage (hypothesis), staged or committed."""

from __future__ import annotations

import hashlib
import itertools
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from branchwater.engine import CorruptedData
from branchwater.engine.api import Ref, Repository
from branchwater.engine.graveler import writes
from branchwater.engine.graveler.checksums import content_mismatch

_paths = itertools.count()


def object_file(repo: Repository, address: str) -> Path:
    return Path(repo.storage_namespace.removeprefix("file://")) / address


def damaged(data: bytes, how: str, at: int) -> bytes:
    """`data` truncated, extended, or rewritten in place (same size, one byte changed)."""
    at %= max(len(data), 1)
    if how == "truncated":
        return data[:at]
    if how == "extended":
        return data + b"\x00"
    return data[:at] + bytes([data[at] ^ 0x5A]) + data[at + 1 :]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    data=st.binary(min_size=1, max_size=64),
    how=st.sampled_from(["truncated", "extended", "rewritten"]),
    at=st.integers(min_value=0, max_value=63),
    committed=st.booleans(),
)
def test_a_damaged_object_is_never_returned_as_its_entry(
    repo: Repository, data: bytes, how: str, at: int, committed: bool
) -> None:
    main = repo.branch("main")
    path = f"objects/{next(_paths)}"
    entry = main.upload(path, data)
    reader: Ref = main
    if committed:
        reader = repo.ref(main.commit(f"add {path}").id)
    object_file(repo, entry.address).write_bytes(damaged(data, how, at))

    with pytest.raises(CorruptedData) as caught:
        reader.read(path)
    assert path in str(caught.value) and entry.address in str(caught.value)
    assert reader.read(path, verify=False) == damaged(data, how, at)


def test_an_intact_object_reads_back(repo: Repository) -> None:
    main = repo.branch("main")
    main.upload("a", b"intact")
    assert main.read("a") == b"intact"
    assert repo.ref(main.commit("a").id).read("a") == b"intact"


def test_a_legacy_md5_entry_is_verified_by_md5(repo: Repository) -> None:
    main = repo.branch("main")
    entry = main.upload("legacy", b"legacy bytes")
    legacy = entry._replace(checksum=hashlib.md5(b"legacy bytes").hexdigest())
    writes.stage_entry(repo.lake.graveler, repo.record, "main", legacy)
    assert main.read("legacy") == b"legacy bytes"
    object_file(repo, entry.address).write_bytes(b"legacy BYTES")
    with pytest.raises(CorruptedData, match="md5"):
        main.read("legacy")


def test_a_linked_object_is_held_to_its_size_and_to_a_checksum_the_engine_can_compute(
    repo: Repository,
) -> None:
    main = repo.branch("main")

    def link(path: str, data: bytes, checksum: str) -> None:
        physical = main.get_physical_address()
        object_file(repo, physical.address).parent.mkdir(parents=True, exist_ok=True)
        object_file(repo, physical.address).write_bytes(data)
        main.link_physical_address(path, physical.token, size=len(data), checksum=checksum)
        object_file(repo, physical.address).write_bytes(data.upper())

    link("etag", b"spark output", "d41d8cd98f00b204e9800998ecf8427e-2")
    assert main.read("etag") == b"SPARK OUTPUT"
    link("sha", b"spark output", hashlib.sha256(b"spark output").hexdigest())
    with pytest.raises(CorruptedData, match="sha256"):
        main.read("sha")


@pytest.mark.parametrize(
    ("stored", "reason"),
    [(b"abc", None), (b"ab", "2 bytes where its entry records 3"), (b"abd", "sha256")],
)
def test_content_mismatch_says_what_differs(repo: Repository, stored: bytes, reason: str) -> None:
    entry = repo.branch("main").upload("m", b"abc")
    found = content_mismatch(entry, stored)
    assert found is None if reason is None else reason in str(found)


@pytest.mark.parametrize(
    ("how", "reason"),
    [
        ("truncated", r"ended after \d+ of the 1048576 bytes"),
        ("extended", "holds more than the 1048576 bytes"),
    ],
)
def test_an_object_truncated_or_extended_while_open_fails_the_read_that_finds_it(
    repo: Repository, how: str, reason: str
) -> None:
    """A hash is never completed by a read that ends early or runs long, so the read itself
    tells: neither a short object as a normal end (a `cp` over it truncates first) nor
    bytes beyond the entry's size."""
    main = repo.branch("main")
    data = os.urandom(1 << 20)
    stored = object_file(repo, main.upload("big", data).address)
    with main.open("big") as f:
        assert f.read(1 << 16) == data[: 1 << 16]
        if how == "truncated":
            stored.write_bytes(data[: 1 << 17])
        else:
            with stored.open("ab") as out:
                out.write(b"x")
        with pytest.raises(CorruptedData, match=reason):
            f.read()
