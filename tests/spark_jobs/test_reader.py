"""The Spark reader: a ref's files read on executors with Hive-style partition columns, at a
branch (uncommitted changes included), a tag and a commit id, on local files and on S3; the
listing streamed into manifests; typed errors for bad input, for objects GC collected
and for objects truncated or rewritten in storage."""

from __future__ import annotations

import contextlib
import datetime
import functools
import io
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.dataset
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from branchwater.engine import (
    ConfigurationError,
    CorruptedData,
    InvalidArgument,
    Lake,
    NotFound,
    ObjectStore,
    failpoints,
    imported_version,
    open_object_store,
)
from branchwater.engine.graveler.checksums import content_checksum
from branchwater.engine.objects.s3 import S3ObjectStore
from branchwater.engine.objects.store import MAX_READ_AHEAD
from branchwater.spark_jobs import reader
from branchwater.spark_jobs.reader import read_files, read_parquet
from tests.fixtures.s3 import S3Server
from tests.helpers.gc import GCLake
from tests.spark_jobs.conftest import ReaderLake

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from branchwater.engine import Branch, Entry, Repository

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def parquet(rows: list[dict[str, Any]], row_group_size: int | None = None) -> bytes:
    out = io.BytesIO()
    pq.write_table(pa.Table.from_pylist(rows), out, row_group_size=row_group_size)
    return out.getvalue()


def payload_rows(first: int, count: int) -> list[dict[str, Any]]:
    """Rows that do not compress: a file's size grows with its rows."""
    return [{"id": i, "blob": os.urandom(48).hex()} for i in range(first, first + count)]


@contextlib.contextmanager
def split_settings(spark: SparkSession, max_bytes: int, open_cost: int) -> Iterator[None]:
    spark.conf.set("spark.sql.files.maxPartitionBytes", str(max_bytes))
    spark.conf.set("spark.sql.files.openCostInBytes", str(open_cost))
    try:
        yield
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
        spark.conf.unset("spark.sql.files.openCostInBytes")


def ids_by_partition(frame: DataFrame) -> list[list[int]]:
    """Each Spark partition's ids, in partition order."""
    return [sorted(row[0] for row in rows) for rows in frame.select("id").rdd.glom().collect()]


def orders(first: int, count: int) -> list[dict[str, Any]]:
    return [
        {"id": i, "amount": i * 10 % 97, "note": f"order {i}"} for i in range(first, first + count)
    ]


def collected(frame: DataFrame) -> list[tuple[Any, ...]]:
    return sorted(tuple(row) for row in frame.collect())


def task_row(repo: Repository, entry: Entry) -> tuple[ObjectStore, dict[str, Any]]:
    """The store a task opens for `entry` and the manifest row it reads it by, as the driver
    lists it (`reader._ManifestRows`)."""
    store_url, key = reader._location(repo.storage_namespace, entry.address)
    return open_object_store(store_url), {
        "path": entry.path,
        "key": key,
        "size": entry.size,
        "checksum": entry.checksum,
        "values": [],
        "imported": imported_version(entry),
    }


def load_v1(branch: Branch) -> None:
    """Two dates, two regions; Spark's marker and checksum files, which readers skip."""
    branch.upload("tables/orders/day=2026-11-01/region=north/part-0.parquet", parquet(orders(0, 5)))
    branch.upload("tables/orders/day=2026-11-01/region=south/part-0.parquet", parquet(orders(5, 3)))
    branch.upload("tables/orders/day=2026-11-02/region=north/part-0.parquet", parquet(orders(8, 4)))
    branch.upload("tables/orders/_SUCCESS", b"")
    branch.upload("tables/orders/day=2026-11-02/region=north/.part-0.parquet.crc", b"crc")
    branch.upload("tables/other/part-0.parquet", parquet(orders(100, 2)))


def expected(*parts: tuple[int, int, str, str]) -> list[tuple[Any, ...]]:
    return sorted(
        (row["id"], row["amount"], row["note"], datetime.date.fromisoformat(day), region)
        for first, count, day, region in parts
        for row in orders(first, count)
    )


V1 = [(0, 5, "2026-11-01", "north"), (5, 3, "2026-11-01", "south"), (8, 4, "2026-11-02", "north")]


def test_a_partitioned_dataset_reads_at_a_branch_a_tag_and_a_commit(
    spark: SparkSession, reader_lake: ReaderLake
) -> None:
    repo, options = reader_lake.repo, reader_lake.s3_options
    main = repo.branch("main")
    load_v1(main)
    v1 = main.commit("v1")
    repo.tag("v1", v1.id)
    main.upload("tables/orders/day=2026-11-03/region=west/part-0.parquet", parquet(orders(20, 6)))
    main.delete("tables/orders/day=2026-11-01/region=south/part-0.parquet")

    at_tag = read_parquet(spark, repo.ref("v1"), "tables/orders/", s3_options=options)
    at_commit = read_parquet(spark, repo.ref(v1.id), "tables/orders", s3_options=options)
    at_branch = read_parquet(spark, main, "tables/orders/", s3_options=options)

    assert at_tag.schema.simpleString() == (
        "struct<id:bigint,amount:bigint,note:string,day:date,region:string>"
    )
    assert collected(at_tag) == expected(*V1)
    assert collected(at_commit) == expected(*V1)
    changed = [V1[0], V1[2], (20, 6, "2026-11-03", "west")]
    assert collected(at_branch) == expected(*changed)
    assert collected(at_branch.where("region = 'west'").select("id")) == [
        (i,) for i in range(20, 26)
    ]


def test_a_prefix_with_no_files_is_not_found(spark: SparkSession, reader_lake: ReaderLake) -> None:
    main = reader_lake.repo.branch("main")
    load_v1(main)
    with pytest.raises(NotFound, match=r"no files under 'tables/none/' at 'main'"):
        read_parquet(spark, main, "tables/none")
    main.upload("tables/hidden/_SUCCESS", b"")
    with pytest.raises(NotFound, match="tables/hidden/"):
        read_parquet(spark, main, "tables/hidden/")
    with pytest.raises(NotFound, match="tables/orders"):
        read_parquet(spark, reader_lake.repo.ref(main.commit("v1").id), "tables/orders/x/")


def test_a_prefix_naming_one_object_reads_that_object(
    spark: SparkSession, reader_lake: ReaderLake
) -> None:
    main = reader_lake.repo.branch("main")
    load_v1(main)
    frame = read_parquet(
        spark, main, "tables/other/part-0.parquet", s3_options=reader_lake.s3_options
    )
    assert frame.columns == ["id", "amount", "note"]
    assert collected(frame) == sorted(tuple(r.values()) for r in orders(100, 2))


def test_a_listing_streams_into_manifests_and_spreads_over_partitions(
    spark: SparkSession, reader_lake: ReaderLake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small manifests and small splits: many of each, and every row read exactly once."""
    monkeypatch.setattr(reader, "MANIFEST_ROWS", 5)
    monkeypatch.setattr(reader, "MANIFEST_ROW_GROUP", 3)
    added: list[str] = []
    add_file = spark.sparkContext.addFile

    def adding(path: str) -> None:
        added.append(path)
        add_file(path)

    monkeypatch.setattr(spark.sparkContext, "addFile", adding)
    main = reader_lake.repo.branch("main")
    for i in range(16):
        main.upload(f"t/n={i % 4}/part-{i:03d}.parquet", parquet(orders(i * 10, 3)))
    spark.conf.set("spark.sql.files.maxPartitionBytes", "12k")
    spark.conf.set("spark.sql.files.openCostInBytes", "4k")
    try:
        frame = read_parquet(spark, main, "t/", s3_options=reader_lake.s3_options)
    finally:
        spark.conf.unset("spark.sql.files.maxPartitionBytes")
        spark.conf.unset("spark.sql.files.openCostInBytes")

    assert len(added) == 4
    assert frame.rdd.getNumPartitions() >= 8
    rows = collected(frame)
    assert [r[0] for r in rows] == sorted(i * 10 + k for i in range(16) for k in range(3))
    assert {(r[0] // 10) % 4 for r in rows if r[3] == 1} == {1}


def test_any_format_pyarrow_reads(spark: SparkSession, reader_lake: ReaderLake) -> None:
    import pyarrow.csv
    import pyarrow.dataset as ds

    main = reader_lake.repo.branch("main")
    main.upload("csv/k=1/a.csv", b"id,name\n1,one\n2,two\n")
    main.upload("csv/k=2/b.csv", b"id,name\n3,three\n")
    main.upload("semi/a.csv", b"id;name\n4;four\n")
    main.upload("json/a.json", b'{"id": 5, "name": "five"}\n{"id": 6, "name": "six"}\n')
    options = reader_lake.s3_options

    csv = read_files(spark, main, "csv/", format="csv", s3_options=options)
    assert csv.schema.simpleString() == "struct<id:bigint,name:string,k:int>"
    assert collected(csv) == [(1, "one", 1), (2, "two", 1), (3, "three", 2)]
    semi = ds.CsvFileFormat(parse_options=pyarrow.csv.ParseOptions(delimiter=";"))
    assert collected(read_files(spark, main, "semi", format=semi, s3_options=options)) == [
        (4, "four")
    ]
    json = read_files(
        spark, main, "json/", format="json", schema="id long, name string", s3_options=options
    )
    assert collected(json) == [(5, "five"), (6, "six")]


def test_partition_values_are_typed_as_spark_types_them(
    spark: SparkSession, reader_lake: ReaderLake
) -> None:
    main = reader_lake.repo.branch("main")
    data = parquet([{"x": 1}])
    for folder in (
        "i=1/l=3000000000/d=1.5/s=a%2Fb",
        "i=2/l=4/d=2/s=__HIVE_DEFAULT_PARTITION__",
    ):
        main.upload(f"p/{folder}/part.parquet", data)
    frame = read_parquet(spark, main, "p/", s3_options=reader_lake.s3_options)
    assert frame.schema.simpleString() == "struct<x:bigint,i:int,l:bigint,d:double,s:string>"
    assert collected(frame) == [(1, 1, 3_000_000_000, 1.5, "a/b"), (1, 2, 4, 2.0, None)]


SPARK_TYPED_FOLDERS = (
    "a=+5/b=1_000/c=NaN/d=3000000000/e=2026-11-01/f=nan",
    "a=-7/b=2/c=.5/d=+1/e=2026-02-30/f=1",
    "a=007/b=3/c=-Infinity/d=4/e=2026-11-02/f=2",
)
"""Values Spark's partition discovery types by Java's parsers: a sign, leading zeros, `NaN`
and `Infinity` are numbers; `1_000`, `nan` and a date that does not exist are strings."""


def test_partition_values_read_as_spark_reads_the_same_folders(
    spark: SparkSession, reader_lake: ReaderLake, tmp_path: Path
) -> None:
    main = reader_lake.repo.branch("main")
    for number, folder in enumerate(SPARK_TYPED_FOLDERS):
        data = parquet([{"x": number}])
        main.upload(f"typed/{folder}/part.parquet", data)
        native = tmp_path / "native" / folder
        native.mkdir(parents=True)
        (native / "part.parquet").write_bytes(data)

    frame = read_parquet(spark, main, "typed/", s3_options=reader_lake.s3_options)
    spark_frame = spark.read.parquet(str(tmp_path / "native"))

    assert frame.schema.simpleString() == spark_frame.schema.simpleString()
    assert frame.schema.simpleString() == (
        "struct<x:bigint,a:int,b:string,c:double,d:bigint,e:string,f:string>"
    )
    by_x = sorted(map(tuple, frame.collect()))
    assert repr(by_x) == repr(sorted(map(tuple, spark_frame.collect())))
    assert by_x[0][1:3] == (5, "1_000")


def test_partition_values_spark_alone_takes_for_numbers_stay_strings(
    spark: SparkSession, reader_lake: ReaderLake
) -> None:
    """Spaces around, a `d` suffix and digits of other scripts, which Java's parsers take
    and Arrow's cast does not, keep the folder's text (before, the driver typed them as
    numbers and every task failed to read them back), as does an integer beyond bigint,
    which Spark types `decimal` and a double would round."""
    main = reader_lake.repo.branch("main")
    values = [" 7", "\u0661\u0662", "5d", "12345678901234567891", "12"]
    for number, value in enumerate(values):
        main.upload(f"kept/k={value}/part.parquet", parquet([{"x": number}]))
    frame = read_parquet(spark, main, "kept/", s3_options=reader_lake.s3_options)
    assert frame.schema.simpleString() == "struct<x:bigint,k:string>"
    assert collected(frame) == list(enumerate(values))


NUMBERISH = st.text(st.sampled_from("0123456789+-._eE \u0661dfNaInity"), max_size=8)


@settings(max_examples=300, deadline=None)
@given(values=st.lists(NUMBERISH | st.text(max_size=12), min_size=1, max_size=3))
def test_every_partition_value_reads_back_as_the_type_its_column_was_given(
    values: list[str],
) -> None:
    """What the driver types a column as, from all its folders' values, each task parses
    every one of those values as: the driver and the tasks never disagree. (Values are
    valid Unicode: paths are, and `unquote` replaces what does not decode.)"""
    kind = functools.reduce(reader._wider, map(reader._kind, values), "null")
    arrow_type = reader._partition_type(kind)
    for value in values:
        assert reader._typed(value, arrow_type).type == arrow_type


def test_a_partition_value_its_type_refuses_fails_the_task_as_a_bad_plan(tmp_path: Path) -> None:
    """Not `CorruptedData`: the file is not at fault, and is not even opened."""
    schema = pa.schema([("x", pa.int64())])
    output = pa.schema([("x", pa.int64()), ("k", pa.int32())])
    plan = reader.ReadPlan(
        pa.dataset.ParquetFileFormat(), schema, (("k", "int"),), output, {}, "'t/'"
    )
    row = {"path": "t/k=x/a.parquet", "key": "data/absent", "size": 1, "values": ["x"]}
    store = open_object_store(tmp_path.as_uri())
    with pytest.raises(
        InvalidArgument, match=r"object 't/k=x/a.parquet' under 't/': partition value 'x'"
    ):
        list(reader._read_file(plan, store, row))
    store.close()


def test_bad_input_raises_typed_errors(spark: SparkSession, reader_lake: ReaderLake) -> None:
    main = reader_lake.repo.branch("main")
    main.upload("mixed/k=1/a.parquet", parquet([{"x": 1}]))
    main.upload("mixed/b.parquet", parquet([{"x": 2}]))
    main.upload("broken/a.parquet", b"not parquet")
    with pytest.raises(
        InvalidArgument,
        match=r"'mixed/b.parquet' has partition columns \[\], 'mixed/k=1/a.parquet' has \['k'\]",
    ):
        read_parquet(spark, main, "mixed/")
    with pytest.raises(InvalidArgument, match="format 'xlsx'"):
        read_files(spark, main, "mixed/", format="xlsx")
    with pytest.raises(InvalidArgument, match="prefix must be a string"):
        read_parquet(spark, main, 3)  # type: ignore[arg-type]
    with pytest.raises(CorruptedData, match=r"schema of 'broken/a.parquet' at 'main'"):
        read_parquet(spark, main, "broken/")
    with pytest.raises(ConfigurationError, match="S3 option endpoint_url must be a string"):
        read_parquet(spark, main, "mixed/", s3_options={"endpoint_url": 9000})  # type: ignore[dict-item]


def test_an_object_collected_after_the_read_was_planned_fails_the_read_by_name(
    spark: SparkSession, local_gc: GCLake
) -> None:
    """The worst interleaving: the frame is planned at a branch, its object deleted from the
    branch and collected by a GC run, then the frame evaluated: a clear error, no wrong rows."""
    main = local_gc.repo.branch("main")
    main.upload("t/keep.parquet", parquet(orders(0, 2)))
    main.commit("keep")
    main.upload("t/staged.parquet", parquet(orders(10, 2)))
    frame = read_parquet(spark, main, "t/")
    main.delete("t/staged.parquet")
    local_gc.lake.wait_for_cleanup()

    summary = local_gc.run()

    assert summary.counts["deleted"].objects == 1
    with pytest.raises(
        Exception, match=r"object 't/staged.parquet' under 't/' at 'main'.* missing"
    ):
        frame.collect()
    assert collected(read_parquet(spark, main, "t/")) == sorted(
        tuple(r.values()) for r in orders(0, 2)
    )


def test_an_imported_file_rewritten_at_its_source_fails_the_read_by_name(
    spark: SparkSession, tmp_path: Path
) -> None:
    """As `Ref.open`: the import recorded the file's version, never its bytes, so a rewrite
    at the source keeping the size read as the commit's content."""
    source = tmp_path / "source"
    source.mkdir()
    (source / "a.parquet").write_bytes(parquet(orders(0, 2)))
    (source / "b.parquet").write_bytes(parquet(orders(10, 2)))
    with Lake.connect(f"sqlite:///{tmp_path}/lake.db") as lake:
        repo = lake.create_repository("sales", (tmp_path / "ns").as_uri())
        imported = repo.branch("main").import_objects(source.as_uri(), prefix="t/").commit
        assert imported is not None
        at_commit = repo.ref(imported.id)
        assert len(collected(read_parquet(spark, at_commit, "t/"))) == 4

        rewritten = source / "b.parquet"
        rewritten.write_bytes(parquet(orders(20, 2)))
        later = rewritten.stat().st_mtime_ns + 10**9
        os.utime(rewritten, ns=(later, later))

        with pytest.raises(Exception, match=r"'t/b.parquet'.*rewritten at its source"):
            read_parquet(spark, at_commit, "t/").collect()


@pytest.mark.parametrize("read_whole", [0, 1 << 20], ids=["ranged", "whole"])
def test_an_imported_file_rewritten_after_the_tasks_check_is_not_read(
    tmp_path: Path, read_whole: int
) -> None:
    """A task opens an imported file as `Ref.open` does (`open_source`): a rewrite right
    after the version check, before the open, is `CorruptedData`, not the commit's rows."""
    source = tmp_path / "source"
    source.mkdir()
    landed = source / "orders.csv"
    landed.write_text("amount\n" + "10\n" * 100)
    hour_ago = landed.stat().st_mtime_ns - 3600 * 10**9
    os.utime(landed, ns=(hour_ago, hour_ago))
    with Lake.connect(f"sqlite:///{tmp_path}/lake.db") as lake:
        repo = lake.create_repository("sales", (tmp_path / "ns").as_uri())
        main = repo.branch("main")
        main.import_objects(source.as_uri(), prefix="raw/")
        store, row = task_row(repo, main.stat("raw/orders.csv"))
        schema = pa.schema([("amount", pa.int64())])
        plan = reader.ReadPlan(
            pa.dataset.CsvFileFormat(), schema, (), schema, {}, "'raw/'", read_whole=read_whole
        )

        def amounts() -> list[int]:
            batches = reader._read_file(plan, store, row)
            return pa.Table.from_batches(list(batches)).column("amount").to_pylist()

        assert sum(amounts()) == 1000

        def rewritten() -> None:
            landed.write_text("amount\n" + "99999\n" * 100)

        with (
            failpoints.armed("source.after_check", rewritten),
            pytest.raises(CorruptedData, match=r"'raw/orders.csv'.*rewritten at its source"),
        ):
            amounts()
        store.close()


AMOUNTS = "amount\n" + "10\n" * 100
"""A CSV file that still parses when cut at a line or rewritten digit for digit."""
CSV_SCHEMA = pa.schema([("amount", pa.int64())])


@contextlib.contextmanager
def committed_csv(tmp_path: Path) -> Iterator[tuple[ObjectStore, dict[str, Any], Path]]:
    """`AMOUNTS` committed on a local namespace: the store and manifest row a task reads it
    by, and the file holding its bytes."""
    with Lake.connect(f"sqlite:///{tmp_path}/lake.db") as lake:
        repo = lake.create_repository("sales", (tmp_path / "ns").as_uri())
        main = repo.branch("main")
        main.upload("raw/orders.csv", AMOUNTS.encode())
        main.commit("orders")
        store, row = task_row(repo, main.stat("raw/orders.csv"))
        try:
            yield store, row, tmp_path / "ns" / row["key"]
        finally:
            store.close()


def csv_plan(read_whole: int) -> reader.ReadPlan:
    return reader.ReadPlan(
        pa.dataset.CsvFileFormat(), CSV_SCHEMA, (), CSV_SCHEMA, {}, "'raw/'", read_whole=read_whole
    )


@pytest.mark.parametrize("read_whole", [0, 1 << 20], ids=["ranged", "whole"])
@pytest.mark.parametrize(
    ("stored", "mismatch"),
    [
        (AMOUNTS[:-30], r"it has \d+ bytes where its entry records \d+"),
        (AMOUNTS + "10\n", r"it has \d+ bytes where its entry records \d+"),
        (AMOUNTS.replace("10", "99"), r"its sha256 is not the [0-9a-f]{64} its entry records"),
    ],
    ids=["truncated", "grown", "rewritten"],
)
def test_a_committed_object_changed_in_storage_is_not_read(
    tmp_path: Path, read_whole: int, stored: str, mismatch: str
) -> None:
    """A task holds a committed object to its entry as `Ref.open` does: bytes cut at a line,
    added, or rewritten at the same size, all still valid CSV, are `CorruptedData` naming
    the object, never rows the commit did not hold."""
    with committed_csv(tmp_path) as (store, row, _):
        store.put(row["key"], stored.encode())
        with pytest.raises(
            CorruptedData,
            match=rf"object 'raw/orders.csv' under 'raw/' at file://.*: it was truncated or "
            rf"rewritten in storage: {mismatch}",
        ):
            list(reader._read_file(csv_plan(read_whole), store, row))


def cut(stored: Path) -> None:
    os.truncate(stored, 20)


def grow(stored: Path) -> None:
    with stored.open("a") as f:
        f.write("10\n")


@pytest.mark.parametrize(
    ("change", "mismatch"),
    [
        (cut, r"it ended after 20 of the \d+ bytes its entry records"),
        (grow, r"it holds more than the \d+ bytes its entry records"),
    ],
    ids=["truncated", "grown"],
)
def test_a_committed_object_changed_while_a_task_reads_it_fails_that_read(
    tmp_path: Path, change: Callable[[Path], None], mismatch: str
) -> None:
    """A ranged read is checked as it goes, as `Ref.open`'s file is: the file cut or grown
    after the task opened it and checked its size fails the read that finds the end moved."""
    plan = csv_plan(0)
    with (
        committed_csv(tmp_path) as (store, row, stored),
        reader._opened(plan, store, row, (0, None)) as source,
    ):
        change(stored)
        with pytest.raises(CorruptedData, match=mismatch):
            plan.file_format.make_fragment(source).to_table(schema=CSV_SCHEMA)


def test_a_truncated_committed_object_fails_the_spark_read_by_name(
    spark: SparkSession, reader_lake: ReaderLake
) -> None:
    """The object cut at a line in storage after its commit still parses: Spark's action
    fails with the task's `CorruptedData` naming it, the ref and the commit, instead of
    returning the rows left."""
    from pyspark.errors import PythonException

    repo, options = reader_lake.repo, reader_lake.s3_options
    main = repo.branch("main")
    main.upload("raw/orders.csv", AMOUNTS.encode())
    commit = main.commit("orders")
    frame = read_files(spark, main, "raw/", format="csv", schema="amount long", s3_options=options)
    assert frame.count() == 100
    store = open_object_store(repo.storage_namespace, **options)
    store.put(main.stat("raw/orders.csv").address, AMOUNTS[:-30].encode())
    store.close()

    with pytest.raises(
        PythonException,
        match=rf"CorruptedData: cannot read object 'raw/orders.csv' under 'raw/' at 'main' "
        rf"\(commit {commit.id[:12]}\) at .*: it was truncated or rewritten in storage",
    ):
        frame.collect()


def test_files_missing_a_column_of_the_schema_give_nulls(
    spark: SparkSession, reader_lake: ReaderLake
) -> None:
    main = reader_lake.repo.branch("main")
    main.upload("e/a.parquet", parquet([{"id": 1}]))
    main.upload("e/b.parquet", parquet([{"id": 2, "extra": "x"}]))
    options = reader_lake.s3_options
    first = read_parquet(spark, main, "e/", s3_options=options)
    assert first.columns == ["id"]
    assert collected(first) == [(1,), (2,)]
    given = read_parquet(spark, main, "e/", schema="id int, extra string", s3_options=options)
    assert given.schema.simpleString() == "struct<id:int,extra:string>"
    assert collected(given.fillna("none")) == [(1, "none"), (2, "x")]


@pytest.mark.s3
def test_a_task_reads_only_the_columns_it_needs_from_s3(
    s3_server: S3Server, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A task's file object is the store's, without its read-ahead: pyarrow's reads of a
    footer and one small column fetch a few small ranges, not the large column beside it."""
    store = open_object_store(f"s3://{s3_bucket}/ns", **s3_server.options)
    large = 6 * MAX_READ_AHEAD
    table = pa.table({"id": [1, 2], "blob": [os.urandom(large // 2), os.urandom(large // 2)]})
    out = io.BytesIO()
    pq.write_table(table, out, compression="none")
    store.put("data/file", out.getvalue())
    fetched: list[int] = []
    original = S3ObjectStore._get_range

    def spy(self: S3ObjectStore, key: str, etag: str, start: int, stop: int | None) -> Any:
        data = original(self, key, etag, start, stop)
        fetched.append(len(data))
        return data

    monkeypatch.setattr(S3ObjectStore, "_get_range", spy)
    schema = pa.schema([("id", pa.int64())])
    plan = reader.ReadPlan(
        pa.dataset.ParquetFileFormat(), schema, (), schema, s3_server.options, "'data/'"
    )
    row = {
        "path": "t/file",
        "key": "data/file",
        "size": out.tell(),
        "checksum": content_checksum(out.getvalue()),
        "values": [],
    }

    batches = list(reader._read_file(plan, store, row))

    assert pa.Table.from_batches(batches).column("id").to_pylist() == [1, 2]
    assert 0 < sum(fetched) < MAX_READ_AHEAD
    store.close()


def test_a_task_reads_a_small_file_whole_with_one_get(
    s3_server: S3Server, s3_bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A file within Spark's `openCostInBytes` costs one GET, not a HEAD and ranged reads of
    its footer and columns: on S3 each is a round trip."""
    store = open_object_store(f"s3://{s3_bucket}/ns", **s3_server.options)
    out = io.BytesIO()
    pq.write_table(pa.table({"id": [1, 2], "name": ["a", "b"]}), out)
    store.put("data/small", out.getvalue())

    def refused(*args: Any) -> Any:
        raise AssertionError("a ranged read or a HEAD of a small file")

    monkeypatch.setattr(S3ObjectStore, "_get_range", refused)
    monkeypatch.setattr(S3ObjectStore, "stat", refused)
    schema = pa.schema([("id", pa.int64())])
    plan = reader.ReadPlan(
        pa.dataset.ParquetFileFormat(),
        schema,
        (),
        schema,
        s3_server.options,
        "'data/'",
        read_whole=out.tell(),
    )
    row = {
        "path": "t/small",
        "key": "data/small",
        "size": out.tell(),
        "checksum": content_checksum(out.getvalue()),
        "values": [],
    }

    batches = list(reader._read_file(plan, store, row))

    assert pa.Table.from_batches(batches).column("id").to_pylist() == [1, 2]
    store.close()


def test_a_spark_connect_session_is_refused_with_a_typed_error(reader_lake: ReaderLake) -> None:
    """A Connect client has no SparkContext to ship manifests with: the reader refuses it
    before listing anything, naming what to do. The session is an instance of pyspark's
    Connect class made without connecting: building one with `.remote(...).create()` makes
    it pyspark's default session, and the classic session the other tests share then hangs."""
    from pyspark.sql.connect.session import SparkSession as ConnectSession

    connect = object.__new__(ConnectSession)
    with pytest.raises(reader.SparkConnectUnsupported, match=r"classic SparkSession"):
        read_parquet(connect, reader_lake.repo.branch("main"), "tables/")  # type: ignore[arg-type]


def test_a_manifest_scope_removes_its_reads_manifests_when_it_ends(
    spark: SparkSession, reader_lake: ReaderLake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Frames evaluated inside the scope read normally (twice, lazily); when the scope ends
    its reads' manifest folders are gone, while a read made outside any scope keeps its
    manifests until exit (a lazy frame may be evaluated again)."""
    main = reader_lake.repo.branch("main")
    main.upload("s/part-0.parquet", parquet(orders(0, 3)))
    made: list[str] = []
    mkdtemp = reader.tempfile.mkdtemp

    def recording(**kwargs: Any) -> str:
        made.append(mkdtemp(**kwargs))
        return made[-1]

    monkeypatch.setattr(reader.tempfile, "mkdtemp", recording)
    outside = read_parquet(spark, main, "s/", s3_options=reader_lake.s3_options)
    with reader.manifest_scope():
        inner = read_parquet(spark, main, "s/", s3_options=reader_lake.s3_options)
        with reader.manifest_scope():
            nested = read_parquet(spark, main, "s/", s3_options=reader_lake.s3_options)
            assert len(collected(nested)) == 3
        assert not os.path.exists(made[2]), "the nested scope removed its read's manifests"
        assert os.path.exists(made[1])
        assert len(collected(inner)) == 3
        assert len(collected(inner.filter("id >= 1"))) == 2
    assert not os.path.exists(made[1])
    assert os.path.exists(made[0])
    assert len(collected(outside)) == 3


def test_a_large_parquet_file_is_read_in_ranges_by_several_tasks(
    spark: SparkSession, reader_lake: ReaderLake, tmp_path: Path
) -> None:
    """A file of 40 row groups, four times the split size: one task per range of the file,
    each reading the row groups whose midpoint lies in its range, so every row once, in the
    same partitions as Spark's own Parquet source puts them when it reads the same bytes."""
    main = reader_lake.repo.branch("main")
    data = parquet(payload_rows(0, 4_000), row_group_size=100)
    main.upload("big/k=7/part-0.parquet", data)
    (tmp_path / "same.parquet").write_bytes(data)
    split = len(data) // 4 + 1
    with split_settings(spark, split, 1024):
        frame = read_parquet(spark, main, "big/", s3_options=reader_lake.s3_options)
        spark_own = ids_by_partition(spark.read.parquet(str(tmp_path / "same.parquet")))

    parts = ids_by_partition(frame)
    assert frame.rdd.getNumPartitions() == math.ceil(len(data) / split) == 4
    assert all(parts), "every range holds some row groups' midpoints"
    assert sorted(i for part in parts for i in part) == list(range(4_000))
    assert parts == spark_own
    assert set(frame.select("k").distinct().collect()) == {(7,)}


def test_a_huge_row_group_is_read_by_one_task_among_small_files(
    spark: SparkSession, reader_lake: ReaderLake
) -> None:
    """A file of one row group larger than three splits is cut in ranges, but only the
    range holding the group's midpoint reads it; the small files beside it are read whole,
    with their own partition values."""
    from pyspark.sql.functions import spark_partition_id

    main = reader_lake.repo.branch("main")
    huge = parquet(payload_rows(0, 3_000))
    main.upload("mix/k=1/a.parquet", parquet(payload_rows(10_000, 5)))
    main.upload("mix/k=2/huge.parquet", huge)
    main.upload("mix/k=3/c.parquet", parquet(payload_rows(20_000, 7)))
    split = len(huge) // 3 - 1
    with split_settings(spark, split, 1024):
        frame = read_parquet(spark, main, "mix/", s3_options=reader_lake.s3_options)

    assert frame.rdd.getNumPartitions() >= 4
    rows = frame.select("id", "k", spark_partition_id().alias("task")).collect()
    assert sorted(r.id for r in rows) == [
        *range(3_000),
        *range(10_000, 10_005),
        *range(20_000, 20_007),
    ]
    assert len({r.task for r in rows if r.k == 2}) == 1
    assert {r.k for r in rows if r.id < 3_000} == {2}
    assert sorted(r.id for r in rows if r.k != 2) == [
        *range(10_000, 10_005),
        *range(20_000, 20_007),
    ]


def test_a_csv_file_larger_than_a_split_is_read_whole_by_one_task(
    spark: SparkSession, reader_lake: ReaderLake
) -> None:
    main = reader_lake.repo.branch("main")
    text = "id,blob\n" + "".join(f"{i},{os.urandom(48).hex()}\n" for i in range(2_000))
    main.upload("csv/a.csv", text.encode())
    with split_settings(spark, len(text) // 5, 1024):
        frame = read_files(spark, main, "csv/", format="csv", s3_options=reader_lake.s3_options)

    assert frame.rdd.getNumPartitions() == 1
    assert ids_by_partition(frame) == [list(range(2_000))]


def corrupt_footer(data: bytes) -> bytes:
    """The file with its footer's bytes overwritten: its length and magic kept, so the
    footer is found and fails to parse."""
    length = int.from_bytes(data[-8:-4], "little")
    return data[: -8 - length] + b"\xff" * length + data[-8:]


def test_a_large_file_with_a_corrupt_footer_fails_with_the_readers_error(
    spark: SparkSession, reader_lake: ReaderLake
) -> None:
    """Read without a schema, the footer is the first file's and fails on the driver with
    `CorruptedData`; with a schema, each range's task reads it and the action fails with
    the task's `CorruptedData` naming the object, not a Java error."""
    from pyspark.errors import PythonException

    main = reader_lake.repo.branch("main")
    main.upload("bad/a.parquet", corrupt_footer(parquet(payload_rows(0, 2_000), 100)))
    options = reader_lake.s3_options
    with split_settings(spark, 16 * 1024, 1024):
        with pytest.raises(CorruptedData, match=r"schema of 'bad/a.parquet' at 'main'"):
            read_parquet(spark, main, "bad/", s3_options=options)
        frame = read_parquet(spark, main, "bad/", schema="id long, blob string", s3_options=options)

    assert frame.rdd.getNumPartitions() > 1
    with pytest.raises(
        PythonException, match=r"CorruptedData: cannot read object 'bad/a.parquet' under 'bad/'"
    ):
        frame.collect()


def test_negative_or_zero_split_settings_are_refused(
    spark: SparkSession, reader_lake: ReaderLake
) -> None:
    main = reader_lake.repo.branch("main")
    main.upload("t/a.parquet", parquet(orders(0, 3)))
    for max_bytes, open_cost in (("0", "4m"), ("-1", "4m"), ("128m", "-1")):
        spark.conf.set("spark.sql.files.maxPartitionBytes", max_bytes)
        spark.conf.set("spark.sql.files.openCostInBytes", open_cost)
        try:
            with pytest.raises(InvalidArgument, match=r"spark\.sql\.files\..* is not a size"):
                read_parquet(spark, main, "t/", s3_options=reader_lake.s3_options)
        finally:
            spark.conf.unset("spark.sql.files.maxPartitionBytes")
            spark.conf.unset("spark.sql.files.openCostInBytes")


def test_a_large_file_collected_after_the_read_was_planned_fails_its_ranges_by_name(
    spark: SparkSession, local_gc: GCLake
) -> None:
    """Each range of a file cut in pieces opens the object itself: once a GC run collected
    it, the evaluation fails naming it, and no range yields rows of it."""
    main = local_gc.repo.branch("main")
    main.upload("t/keep.parquet", parquet(orders(0, 2)))
    main.commit("keep")
    big = parquet(payload_rows(100, 2_000), 100)
    main.upload("t/staged.parquet", big)
    with split_settings(spark, len(big) // 3, 1024):
        frame = read_parquet(spark, main, "t/")
    assert frame.rdd.getNumPartitions() >= 3
    main.delete("t/staged.parquet")
    local_gc.lake.wait_for_cleanup()

    assert local_gc.run().counts["deleted"].objects == 1
    with pytest.raises(
        Exception, match=r"object 't/staged.parquet' under 't/' at 'main'.* missing"
    ):
        frame.collect()
