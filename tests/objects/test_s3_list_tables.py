"""`S3ObjectStore.list_tables`: the listing as Arrow tables, a page at a time, holding the
same objects in the same order as `list_objects`; a path-by-path listing's pages come out in
key order however they are cut."""

from __future__ import annotations

import random
from collections.abc import Iterator
from datetime import UTC, datetime

import pyarrow as pa
import pytest

from branchwater.engine.objects import ObjectInfo
from branchwater.engine.objects import s3 as s3_module
from branchwater.engine.objects.s3 import LIST_SCHEMA, S3ObjectStore
from tests.fixtures.s3 import S3Server


def path_by_path(keys: list[str]) -> list[str]:
    """How a store built on directories (SeaweedFS) lists: `a/b` before `a-c`."""
    return sorted(keys, key=lambda key: key.split("/"))


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("shared", ["", "a", "a/"])
def test_pages_listed_path_by_path_come_out_in_key_order(seed: int, shared: str) -> None:
    rng = random.Random(seed)
    parts = ["".join(rng.choices("a-.0", k=rng.randint(1, 3))) for _ in range(6)]
    keys = {shared + "/".join(rng.choices(parts, k=rng.randint(1, 3))) for _ in range(60)}
    kept = sorted(key for key in keys if "//" not in key)
    for listed in (path_by_path(kept), kept):
        pages = []
        while listed:
            cut = rng.randint(1, 7)
            infos = [ObjectInfo(key, 1, datetime.now(UTC)) for key in listed[:cut]]
            pages.append(s3_module._table_of(infos))
            listed = listed[cut:]

        out = [key for table in s3_module._key_ordered(pages, len(shared)) for key in table["key"]]

        assert [key.as_py() for key in out] == kept


def test_a_page_is_released_once_the_listing_leaves_its_folder() -> None:
    pages = [
        s3_module._table_of([ObjectInfo(f"d/{s}/{o}", 1, datetime.now(UTC)) for o in range(3)])
        for s in range(3)
    ]
    released = s3_module._key_ordered(iter(pages), len("d/"))

    assert next(released)["key"].to_pylist() == ["d/0/0", "d/0/1", "d/0/2"]


def test_reordering_holds_back_one_directory_at_most() -> None:
    """Slices of fixed-length names, a page a key: each slice is released once the listing
    moves to the next."""
    keys = [f"data/{s:04d}/{o:04d}" for s in range(3) for o in range(100)]
    pulled: list[str] = []

    def pages() -> Iterator[pa.Table]:
        for key in keys:
            pulled.append(key)
            yield s3_module._table_of([ObjectInfo(key, 1, datetime.now(UTC))])

    first = next(s3_module._key_ordered(pages(), len("data/")))
    assert first["key"].to_pylist() == keys[:100]
    assert len(pulled) == 101


@pytest.mark.s3
def test_tables_hold_what_list_objects_lists(s3_server: S3Server, s3_bucket: str) -> None:
    store = S3ObjectStore(f"s3://{s3_bucket}/src", **s3_server.options)
    for key in ("a/b", "a-c", "a.d/e", "a/f/g", "b", "empty"):
        store.put(key, b"" if key == "empty" else key.encode())
    s3_server.client().put_object(Bucket=s3_bucket, Key="src/marker/", Body=b"")

    tables = list(store.list_tables())
    infos = list(store.list_objects())

    assert all(table.schema == LIST_SCHEMA for table in tables)
    rows = [row for table in tables for row in table.to_pylist()]
    assert [row["key"] for row in rows] == ["a-c", "a.d/e", "a/b", "a/f/g", "b", "empty"]
    assert [ObjectInfo(**row) for row in rows] == infos
    assert all(row["etag"] and '"' not in row["etag"] for row in rows)
    assert [r["key"] for t in store.list_tables("a/") for r in t.to_pylist()] == ["a/b", "a/f/g"]
