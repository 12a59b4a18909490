"""pandas, Polars, pyarrow datasets and DuckDB read a hive-partitioned Parquet dataset through
`branchwater://` at a branch (with its uncommitted changes), a tag and a commit id, and get
exactly the rows written there.

Polars treats an unknown protocol as a local path (directories and globs included), so it
reads through fsspec file by file (`use_pyarrow=True` with `storage_options`) or a pyarrow
dataset (`pl.scan_pyarrow_dataset`)."""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass

import duckdb
import pandas as pd
import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from branchwater.engine import Branch
from tests.filesystem.conftest import FsLake

Rows = set[tuple[int, str]]
"""(id, region) pairs: what a reader returned, order aside."""


@dataclass
class Dataset:
    refs: dict[str, str]
    """Ref kind -> the ref as a path names it."""
    rows: dict[str, Rows]
    """Ref kind -> the rows written there."""


def write_part(branch: Branch, region: str, part: int, ids: range) -> Rows:
    buffer = io.BytesIO()
    pq.write_table(pa.table({"id": list(ids)}), buffer)
    branch.upload(f"tables/orders/region={region}/part-{part}.parquet", buffer.getvalue())
    return {(i, region) for i in ids}


@pytest.fixture
def dataset(fs_lake: FsLake) -> Dataset:
    """v1 (tagged): two regions; then a commit replacing one file and adding a region; then
    an uncommitted file on the branch and an uncommitted delete."""
    main, repo = fs_lake.repo.branch("main"), fs_lake.repo
    eu0 = write_part(main, "eu", 0, range(0, 5))
    eu1 = write_part(main, "eu", 1, range(5, 10))
    us0 = write_part(main, "us", 0, range(10, 15))
    repo.tag("v1", main.commit("v1").id)
    eu1_new = write_part(main, "eu", 1, range(100, 103))
    asia0 = write_part(main, "asia", 0, range(200, 204))
    second = main.commit("second").id
    us1 = write_part(main, "us", 1, range(300, 302))
    main.delete("tables/orders/region=eu/part-0.parquet")
    return Dataset(
        refs={"branch": "main", "tag": "v1", "commit": second, "ancestor": "main~1"},
        rows={
            "branch": eu1_new | us0 | asia0 | us1,
            "tag": eu0 | eu1 | us0,
            "commit": eu0 | eu1_new | us0 | asia0,
            "ancestor": eu0 | eu1 | us0,
        },
    )


def rows_of(table: pa.Table) -> Rows:
    ids = table.column("id").to_pylist()
    regions = [str(r) for r in table.column("region").to_pylist()]
    return set(zip(ids, regions, strict=True))


def read_pandas(fs_lake: FsLake, ref: str) -> Rows:
    frame = pd.read_parquet(fs_lake.url(ref, "tables/orders/"), storage_options=fs_lake.options)
    return rows_of(pa.Table.from_pandas(frame))


def read_pyarrow(fs_lake: FsLake, ref: str) -> Rows:
    data = ds.dataset(
        f"sales/{ref}/tables/orders", filesystem=fs_lake.fs, format="parquet", partitioning="hive"
    )
    return rows_of(data.to_table())


def read_duckdb(fs_lake: FsLake, ref: str) -> Rows:
    con = duckdb.connect()
    try:
        con.register_filesystem(fs_lake.fs)
        url = fs_lake.url(ref, "tables/orders/*/*.parquet")
        query = f"SELECT id, region FROM read_parquet('{url}', hive_partitioning=true)"
        return rows_of(con.sql(query).arrow().read_all())
    finally:
        con.close()


def read_polars(fs_lake: FsLake, ref: str) -> Rows:
    files = fs_lake.fs.glob(f"sales/{ref}/tables/orders/*/*.parquet")
    frames = [
        pl.read_parquet(
            f"branchwater://{path}", use_pyarrow=True, storage_options=fs_lake.options
        ).with_columns(region=pl.lit(path.split("region=")[1].split("/")[0]))
        for path in files
    ]
    by_file = rows_of(pl.concat(frames).to_arrow())
    data = ds.dataset(f"sales/{ref}/tables/orders", filesystem=fs_lake.fs, partitioning="hive")
    assert rows_of(pl.scan_pyarrow_dataset(data).collect().to_arrow()) == by_file
    return by_file


READERS: dict[str, Callable[[FsLake, str], Rows]] = {
    "pandas": read_pandas,
    "pyarrow": read_pyarrow,
    "duckdb": read_duckdb,
    "polars": read_polars,
}


@pytest.mark.parametrize("reader", sorted(READERS))
def test_readers_get_exactly_the_rows_of_each_ref(
    fs_lake: FsLake, dataset: Dataset, reader: str
) -> None:
    for kind, ref in dataset.refs.items():
        assert READERS[reader](fs_lake, ref) == dataset.rows[kind], kind


@pytest.mark.parametrize("missing", ["sales/nope/t/a.csv", "nope/main/t/a.csv"])
def test_duckdb_reading_a_missing_ref_or_repository_finds_no_files(
    fs_lake: FsLake, missing: str
) -> None:
    """As for a missing path: DuckDB's own message, not a Python traceback in its text."""
    main = fs_lake.repo.branch("main")
    main.upload("t/a.csv", b"x\n1\n")
    main.commit("a")
    con = duckdb.connect()
    try:
        con.register_filesystem(fs_lake.fs)
        with pytest.raises(duckdb.IOException, match="No files found") as raised:
            con.sql(f"SELECT count(*) FROM 'branchwater://{missing}'").fetchall()
        assert "Traceback" not in str(raised.value)
    finally:
        con.close()
