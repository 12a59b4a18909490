"""The mark's bookkeeping in Arrow: the addresses read, one row each, and where each listed
object finds its row."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa

from branchwater.engine.gc.runs import plan
from branchwater.spark_jobs.gc.marking import READ_SCHEMA

EARLY = datetime(2026, 11, 1, tzinfo=UTC)
LATE = datetime(2026, 11, 2, tzinfo=UTC)


def read(rows: list[tuple[str, int, int | None, datetime | None]]) -> pa.Table:
    address, sources, size, mtime = (list(column) for column in zip(*rows, strict=True))
    return pa.table([address, sources, size, mtime], schema=READ_SCHEMA)


def test_each_address_read_is_one_row_with_all_its_bits_its_largest_size_and_latest_time() -> None:
    first = read(
        [
            ("data/s/a", plan.NEW_COMMITTED, 5, None),
            ("data/s/b", plan.UNCOMMITTED, None, EARLY),
            ("data/s/a", plan.NEW_COMMITTED, 7, None),
        ]
    )
    second = read(
        [
            ("data/s/a", plan.UNCOMMITTED, None, LATE),
            ("data/s/b", plan.PENDING, 3, LATE),
            ("data/s/c", plan.CARRIED, None, None),
        ]
    )
    refs = pa.concat_tables([first, second])
    assert refs.column("address").num_chunks == 2

    union = plan.union_by_address(refs)

    rows = {row["address"]: row for row in union.to_pylist()}
    assert union.num_rows == 3
    assert rows["data/s/a"] == {
        "address": "data/s/a",
        "sources": plan.NEW_COMMITTED | plan.UNCOMMITTED,
        "size": 7,
        "mtime": LATE,
    }
    assert rows["data/s/b"]["sources"] == plan.UNCOMMITTED | plan.PENDING
    assert (rows["data/s/b"]["size"], rows["data/s/b"]["mtime"]) == (3, LATE)
    assert rows["data/s/c"] == {
        "address": "data/s/c",
        "sources": plan.CARRIED,
        "size": None,
        "mtime": None,
    }


def test_each_listed_object_finds_the_row_of_its_address_or_none() -> None:
    refs = read(
        [("data/s/a", plan.NEW_COMMITTED, 1, None), ("data/s/b", plan.UNCOMMITTED, 2, None)]
    )
    listed = pa.chunked_array([["data/s/b", "data/s/new"], ["data/s/a"]])

    union = plan.union_by_address(refs)
    position = plan.lookup(listed, union)

    found = [
        None if p is None else union.column("address")[p].as_py() for p in position.to_pylist()
    ]
    assert found == ["data/s/b", None, "data/s/a"]


def test_nothing_read_and_nothing_listed_gives_an_empty_union() -> None:
    union = plan.union_by_address(READ_SCHEMA.empty_table())
    position = plan.lookup(pa.array([], pa.string()), union)
    assert union.num_rows == 0 and len(position) == 0
    assert union.column_names == ["address", "sources", "size", "mtime"]
