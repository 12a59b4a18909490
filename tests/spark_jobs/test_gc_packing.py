"""Packing the mark's shuffle by slice: every address arrives, once, with its set's bit and
its columns, in a row keyed by the slice it names."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest

from branchwater.engine.gc.addresses import slice_name
from branchwater.engine.gc.runs.plan import UTC_MICROS
from branchwater.spark_jobs.gc import packing

SLICES = [slice_name(datetime(2026, 11, day, tzinfo=UTC)) for day in (1, 2, 3)]


def unpacked(batches: list[pa.RecordBatch]) -> list[tuple[str, int, pa.Table | None]]:
    return [row for batch in batches for row in packing.unpacked(batch)]


def test_each_packed_row_holds_the_addresses_of_its_slice_with_their_columns() -> None:
    addresses = [f"data/{SLICES[i % 3]}/{i:04d}" for i in range(30)] + ["elsewhere/x"]
    when = datetime(2026, 11, 4, tzinfo=UTC)
    table = pa.table(
        {
            "address": addresses,
            "size": pa.array(range(len(addresses)), pa.int64()),
            "mtime": pa.array([when] * len(addresses), UTC_MICROS),
        }
    )

    table = pa.concat_tables([table.slice(0, 16), table.slice(16)])
    assert table.column("address").num_chunks == 2

    rows = unpacked(list(packing.pack(table, 4)))

    assert {bit for _, bit, _ in rows} == {4}
    by_slice = {name: read for name, _, read in rows}
    assert sorted(by_slice) == sorted(["", *SLICES])
    assert by_slice[""] is not None and by_slice[""].column("address").to_pylist() == [
        "elsewhere/x"
    ]
    for name in SLICES:
        read = by_slice[name]
        assert read is not None and read.schema == table.schema
        assert all(a.startswith(f"data/{name}/") for a in read.column("address").to_pylist())
    back = pa.concat_tables([read for _, _, read in rows if read is not None])
    assert sorted(back.to_pylist(), key=str) == sorted(table.to_pylist(), key=str)


def test_a_large_slice_is_split_over_rows_and_the_rows_over_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(packing, "ROWS_PER_PACK", 4)
    monkeypatch.setattr(packing, "BATCHES_OF", 2)
    addresses = [f"data/{SLICES[0]}/{i:04d}" for i in range(10)] + [f"data/{SLICES[1]}/a"]

    batches = list(packing.pack(pa.table({"address": addresses}), 2))

    assert [batch.num_rows for batch in batches] == [2, 2]
    rows = unpacked(batches)
    assert [(name, len(read)) for name, _, read in rows if read is not None] == [
        (SLICES[0], 4),
        (SLICES[0], 4),
        (SLICES[0], 2),
        (SLICES[1], 1),
    ]
    back = [
        a for _, _, read in rows if read is not None for a in read.column("address").to_pylist()
    ]
    assert sorted(back) == sorted(addresses)


def test_the_key_of_a_slice_s_addresses_is_the_slice_s_name() -> None:
    """A slice to list is keyed by its name: its addresses must meet it."""
    keys = packing.slice_key(pa.array([f"data/{name}/object" for name in SLICES]))
    assert keys.to_pylist() == SLICES


def test_nothing_is_packed_from_no_rows() -> None:
    assert list(packing.pack(pa.table({"address": pa.array([], pa.string())}), 1)) == []
