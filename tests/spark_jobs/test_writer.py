"""The Spark writer: one Parquet file per partition, written by the executors at addresses
the branch handed out, then linked; on a local namespace and on S3."""

from __future__ import annotations

import hashlib
import io
import re
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from branchwater.engine import (
    AlreadyExists,
    BranchProtected,
    BranchwaterFileSystem,
    ConfigurationError,
    InvalidArgument,
    Lake,
    failpoints,
)
from branchwater.engine.failpoints import FailpointHit
from branchwater.spark_jobs.reader import read_parquet
from branchwater.spark_jobs.writer import PartialWrite, write_parquet
from tests.fixtures.s3 import S3Server
from tests.helpers.gc import GCLake
from tests.helpers.hostile import Stored, stored

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from branchwater.engine import Branch

pytestmark = [pytest.mark.spark, pytest.mark.slow]


def rows_of(data: bytes) -> list[dict[str, object]]:
    return pq.read_table(io.BytesIO(data)).to_pylist()


def write_and_read_back(
    spark: SparkSession, lake: Lake, namespace: str, s3_options: dict[str, str] | None = None
) -> None:
    repo = lake.create_repository("written", namespace)
    branch = repo.create_branch("load")
    frame = spark.createDataFrame(
        [(i, f"row-{i}") for i in range(10)], schema="id int, name string"
    ).repartitionByRange(3, "id")
    empty = spark.createDataFrame([], schema="id int").repartition(2)

    entries = write_parquet(
        frame, branch, "tables/rows/", metadata={"job": "test"}, s3_options=s3_options
    )

    assert write_parquet(empty, branch, "tables/empty") == []
    names = [
        re.fullmatch(r"tables/rows/part-(\d{5})-([0-9a-f-]{36})\.parquet", e.path) for e in entries
    ]
    assert [int(m[1]) for m in names if m] == [0, 1, 2]
    assert len({m[2] for m in names if m}) == 1, "one write id for the write's files"
    assert [e.path for e in branch.list(prefix="tables/")] == [e.path for e in entries]
    rows = [row for entry in entries for row in rows_of(branch.read(entry.path))]
    assert sorted(r["id"] for r in rows) == list(range(10))
    for entry in entries:
        assert entry.metadata == {"job": "test"}
        assert entry.address.startswith("data/")
        assert branch.stat(entry.path).size == entry.size
        assert entry.checksum == hashlib.sha256(branch.read(entry.path)).hexdigest()
    commit = branch.commit("load rows")
    assert len(list(repo.ref(commit.id).list(prefix="tables/rows/"))) == 3


def test_a_frame_lands_on_the_branch_one_file_per_partition(
    spark: SparkSession, tmp_path: Path
) -> None:
    with Lake.connect(f"sqlite:///{tmp_path / 'lake.db'}") as lake:
        write_and_read_back(spark, lake, (tmp_path / "ns").as_uri())


@pytest.mark.s3
def test_executors_write_to_an_s3_namespace(
    spark: SparkSession, s3_server: S3Server, s3_bucket: str, tmp_path: Path
) -> None:
    options = s3_server.options
    with Lake.connect(f"sqlite:///{tmp_path / 'lake.db'}", s3_options=options) as lake:
        write_and_read_back(spark, lake, f"s3://{s3_bucket}/lakes/written", s3_options=options)


def test_s3_options_the_executors_could_not_use_are_refused_before_any_address(
    spark: SparkSession, tmp_path: Path
) -> None:
    """An executor would meet them only when writing, as a task failure far from the call."""
    kv_url = f"sqlite:///{tmp_path / 'lake.db'}"
    with Lake.connect(kv_url) as lake:
        branch = lake.create_repository("written", (tmp_path / "ns").as_uri()).branch("main")
        frame = spark.createDataFrame([(1,)], schema="id int")
        lake.wait_for_cleanup()
        before = stored(kv_url, tmp_path / "ns")
        with pytest.raises(ConfigurationError, match="unknown S3 option 'region'"):
            write_parquet(frame, branch, "t/", s3_options={"region": "eu-west-1"})
        assert stored(kv_url, tmp_path / "ns") == before


def everything(gc_lake: GCLake, tmp_path: Path) -> Stored:
    """What the lake holds, once its background cleanup is done."""
    gc_lake.lake.wait_for_cleanup()
    return stored(gc_lake.kv_url, tmp_path / "ns")


def numbers(spark: SparkSession, first: int, count: int, partitions: int) -> DataFrame:
    frame = spark.createDataFrame([(i,) for i in range(first, first + count)], schema="id int")
    return frame.repartitionByRange(partitions, "id")


def ids_file(*ids: int) -> bytes:
    """A Parquet file of the frames' schema, as another tool would have written it."""
    out = io.BytesIO()
    pq.write_table(pa.table({"id": pa.array(ids, pa.int32())}), out)
    return out.getvalue()


def ids_under(spark: SparkSession, branch: Branch, prefix: str) -> list[int]:
    return sorted(row.id for row in read_parquet(spark, branch, prefix).collect())


def test_a_prefix_already_written_is_refused_or_left_before_any_address(
    spark: SparkSession, local_gc: GCLake, tmp_path: Path
) -> None:
    """Spark's default save mode, `errorifexists` (`error`), refuses a path that exists, and
    `ignore` writes nothing there: both decided before an address is handed out."""
    etl = local_gc.repo.create_branch("etl")
    write_parquet(numbers(spark, 0, 8, 2), etl, "out/")
    before = everything(local_gc, tmp_path)
    for mode in ("errorifexists", "error", "ErrorIfExists"):
        with pytest.raises(
            AlreadyExists, match=r"already shows 'out/part-00000-.* mode='overwrite'"
        ):
            write_parquet(numbers(spark, 100, 4, 2), etl, "out", mode=mode)
    assert write_parquet(numbers(spark, 100, 4, 2), etl, "out", mode="ignore") == []
    assert everything(local_gc, tmp_path) == before
    assert ids_under(spark, etl, "out/") == list(range(8))


def test_overwrite_replaces_what_is_under_the_prefix_and_append_adds_beside_it(
    spark: SparkSession, local_gc: GCLake
) -> None:
    """Four partitions, then two with `overwrite`: the prefix holds the second frame's rows
    alone (staged or committed before), what lies beside it stays; `append` then adds."""
    repo = local_gc.repo
    etl = repo.create_branch("etl")
    etl.upload("out/committed.parquet", ids_file(900))
    etl.upload("out-side/kept.parquet", ids_file(901))
    etl.commit("earlier")
    write_parquet(numbers(spark, 0, 40, 4), etl, "out/", mode="append")
    assert len(list(etl.list("out/"))) == 5

    entries = write_parquet(numbers(spark, 1000, 10, 2), etl, "out/", mode="overwrite")

    assert [e.path for e in etl.list("out/")] == [e.path for e in entries]
    assert ids_under(spark, etl, "out/") == list(range(1000, 1010))
    assert [e.path for e in etl.list("out-side/")] == ["out-side/kept.parquet"]
    commit = etl.commit("overwritten")
    assert [e.path for e in repo.ref(commit.id).list("out/")] == [e.path for e in entries]

    write_parquet(numbers(spark, 2000, 4, 2), etl, "out", mode="Append")
    assert ids_under(spark, etl, "out/") == [*range(1000, 1010), *range(2000, 2004)]


def test_an_empty_prefix_writes_at_the_root_and_a_leading_slash_is_refused(
    spark: SparkSession, local_gc: GCLake, tmp_path: Path
) -> None:
    """Files at the root have no leading `/`, so `branchwater://` addresses them; a prefix
    starting with `/`, an unknown mode and a prefix that is not text are refused before any
    address is handed out."""
    etl = local_gc.repo.create_branch("etl")
    entries = write_parquet(numbers(spark, 0, 4, 2), etl, "")
    assert all(re.fullmatch(r"part-\d{5}-[0-9a-f-]{36}\.parquet", e.path) for e in entries)
    fs = BranchwaterFileSystem(lake=local_gc.lake, skip_instance_cache=True)
    assert sorted(fs.ls("sales/etl", detail=False)) == sorted(
        f"sales/etl/{e.path}" for e in entries
    )
    assert rows_of(fs.cat(f"sales/etl/{entries[0].path}"))

    before = everything(local_gc, tmp_path)
    with pytest.raises(InvalidArgument, match=r"prefix '/out/' starts with '/'"):
        write_parquet(numbers(spark, 0, 4, 2), etl, "/out/")
    with pytest.raises(InvalidArgument, match=r"mode 'upsert' is not a Spark save mode"):
        write_parquet(numbers(spark, 0, 4, 2), etl, "out/", mode="upsert")
    with pytest.raises(InvalidArgument, match="prefix must be a string, not int"):
        write_parquet(numbers(spark, 0, 4, 2), etl, 3)  # type: ignore[arg-type]
    assert everything(local_gc, tmp_path) == before


def test_a_protected_branch_is_refused_before_any_task_writes(
    spark: SparkSession, local_gc: GCLake, tmp_path: Path
) -> None:
    repo = local_gc.repo
    repo.protect("main", no_direct_writes=True)
    before = everything(local_gc, tmp_path)
    with pytest.raises(BranchProtected, match=r"'main' of 'sales' is protected by rule no_direct"):
        write_parquet(numbers(spark, 0, 8, 4), repo.branch("main"), "out/")
    assert everything(local_gc, tmp_path) == before, "no address handed out, no file written"


def test_a_link_failing_part_way_takes_back_the_links_before_it(
    spark: SparkSession, local_gc: GCLake
) -> None:
    """The third of four links fails: the two made are taken back, so the branch shows
    nothing of the write and a retry in the default mode finds the prefix empty."""
    etl = local_gc.repo.create_branch("etl")
    links: list[int] = []

    def third_fails() -> None:
        links.append(1)
        if len(links) == 3:
            raise FailpointHit("the third link")

    with failpoints.armed("link.before_stage", third_fails), pytest.raises(FailpointHit):
        write_parquet(numbers(spark, 0, 8, 4), etl, "out/")
    assert list(etl.list("out/")) == []
    assert list(etl.uncommitted()) == []
    assert len(write_parquet(numbers(spark, 0, 8, 4), etl, "out/")) == 4
    assert ids_under(spark, etl, "out/") == list(range(8))


def test_links_a_protection_stops_midway_are_named_when_they_cannot_be_taken_back(
    spark: SparkSession, local_gc: GCLake
) -> None:
    """`main` is protected after the first link: the second is refused, and so is taking
    the first back; the error names the file left and how to drop it."""
    repo = local_gc.repo
    main = repo.branch("main")
    links: list[int] = []

    def protect_at_second() -> None:
        links.append(1)
        if len(links) == 2:
            repo.protect("main", no_direct_writes=True)

    with (
        failpoints.armed("link.before_stage", protect_at_second),
        pytest.raises(
            PartialWrite, match=r"and 1 could not be taken back: 'out/part-00000-"
        ) as raised,
    ):
        write_parquet(numbers(spark, 0, 8, 4), main, "out/")
    assert isinstance(raised.value.__cause__, BranchProtected)
    assert len(list(main.list("out/"))) == 1
    main.reset()
    assert list(main.list("out/")) == []


def test_an_overwrite_whose_deletes_are_refused_names_the_entries_left(
    spark: SparkSession, local_gc: GCLake
) -> None:
    repo = local_gc.repo
    main = repo.branch("main")
    first = write_parquet(numbers(spark, 0, 8, 2), main, "out/")
    main.commit("first")
    stages: list[int] = []

    def protect_at_first_delete() -> None:
        stages.append(1)
        if len(stages) == 3:  # two links, then the first delete
            repo.protect("main", no_direct_writes=True)

    with (
        failpoints.armed("write.before_stage", protect_at_first_delete),
        pytest.raises(PartialWrite, match=r"could not delete the 2 earlier entries") as raised,
    ):
        write_parquet(numbers(spark, 100, 4, 2), main, "out/", mode="overwrite")
    assert all(e.path in str(raised.value) for e in first)
    assert len(list(main.list("out/"))) == 4


def test_a_gc_run_while_the_files_are_linked_keeps_them_and_collects_a_write_taken_back(
    spark: SparkSession, local_gc: GCLake
) -> None:
    """A GC run between the tasks' writes and the first link keeps every file: its default
    minimum age is a link token's life, so it spares what live tokens may still link. The
    files of a write whose links were taken back are garbage, which a run without a
    minimum age collects, leaving the linked write whole."""
    etl = local_gc.repo.create_branch("etl")
    summaries: list[object] = []

    def collect_once() -> None:
        if not summaries:
            summaries.append(local_gc.run(min_age=None))

    with failpoints.armed("link.before_stage", collect_once):
        kept = write_parquet(numbers(spark, 0, 8, 4), etl, "kept/")
    assert summaries, "the GC run happened between the writes and the links"
    assert ids_under(spark, etl, "kept/") == list(range(8))

    links: list[int] = []

    def second_fails() -> None:
        links.append(1)
        if len(links) == 2:
            raise FailpointHit("the second link")

    before = set(local_gc.data_objects())
    with failpoints.armed("link.before_stage", second_fails), pytest.raises(FailpointHit):
        write_parquet(numbers(spark, 100, 8, 4), etl, "failed/")
    taken_back = set(local_gc.data_objects()) - before
    assert len(taken_back) == 4
    local_gc.lake.wait_for_cleanup()

    local_gc.run()

    assert not taken_back & set(local_gc.data_objects())
    assert {e.address for e in kept} <= set(local_gc.data_objects())
    assert ids_under(spark, etl, "kept/") == list(range(8))
