"""`spark-read`: `read_parquet` of a Parquet dataset at a commit id against the floor,
`spark.read.parquet` of the same physical files (the entries' addresses in the namespace).

Both sides build the frame from nothing and read every column of every row (a `noop` write,
so nothing is skipped or collected to the driver) on the same local Spark session. The
candidate pays for what the reader adds: resolving the commit, streaming the listing into
manifests, the first file's footer read through `Ref.open`, and rows read by pyarrow in
Python workers and handed to the JVM as Arrow. The reference pays for what Spark does with
a list of paths: more than `parallelPartitionDiscovery.threshold` (32) of them are listed by
a Spark job of their own, and footers are read to infer the schema. The files lie in one
folder (no partition columns), so both sides return the same rows.

On the stack (`backends`: PostgreSQL, the files on S3, Spark still local) this Spark has no
`s3a` file system, so the reference is the nearest read Spark can make of the same physical
files: the files packed into partitions as `spark.read` packs them (`spark_packing`), each
task GETting its files with the object library, read by pyarrow and handed to the JVM as
Arrow. Both sides then run tasks of about the same files: the candidate packs them by the
same rule, in listing order.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from tests.benchmarks.backends import Backend, open_backend
from tests.benchmarks.bench_fsspec import write_dataset
from tests.benchmarks.declarations import Benchmark, Suite

BENCHMARKS = Suite(
    section="Readers",
    benchmarks=(
        Benchmark(
            "spark-read",
            measures="`read_parquet` of a 200-file Parquet dataset at a commit id on local "
            "Spark, every column read",
            reference="`spark.read.parquet` of the same physical files (on S3, which this "
            "Spark cannot read itself: the partitions `spark.read` makes, a GET of each file "
            "in the tasks, read by pyarrow)",
            target=1.2,
        ),
    ),
)


def session(tmp: str) -> object:
    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    return (
        SparkSession.builder.master("local[2]")
        .appName("bench-spark-read")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.local.dir", f"{tmp}/spark")
        .config("spark.sql.warehouse.dir", f"{tmp}/warehouse")
        .getOrCreate()
    )


def best_of(repeats: int, ours: Callable[[], int], floor: Callable[[], int]) -> list[float]:
    """The best time of each side over `repeats` alternating rounds, after one warm-up round
    each (Python workers and JIT start once for both)."""
    best = [float("inf"), float("inf")]
    for read in (ours, floor):
        read()
    for _ in range(repeats):
        for i, read in enumerate((ours, floor)):
            t0 = time.perf_counter()
            read()
            best[i] = min(best[i], time.perf_counter() - t0)
    return best


def spark_packing(sizes: list[int], parallelism: int) -> list[list[int]]:
    """The files (by index) in the partitions `spark.read` makes of them with the default
    settings (Spark's `FilePartition.getFilePartitions`): the largest first, each partition
    filled up to `maxSplitBytes`, every file counting `openCostInBytes` more than its size."""
    max_partition, open_cost = 128 << 20, 4 << 20
    per_core = sum(size + open_cost for size in sizes) // parallelism
    split = min(max_partition, max(open_cost, per_core))
    partitions: list[list[int]] = []
    current: list[int] = []
    filled = 0
    for index in sorted(range(len(sizes)), key=lambda i: -sizes[i]):
        if current and filled + sizes[index] > split:
            partitions.append(current)
            current, filled = [], 0
        current.append(index)
        filled += sizes[index] + open_cost
    return [*partitions, current] if current else partitions


def library_reads(spark: Any, backend: Backend, urls: list[str], sizes: list[int]) -> Any:
    """The files at `urls` (`s3://bucket/key`) as a frame, in the partitions `spark.read`
    would make of them: each task GETs its files with the object library and reads them with
    pyarrow."""
    from pyspark.sql.pandas.types import from_arrow_schema

    keys = [url.removeprefix(f"s3://{backend.bucket}/") for url in urls]
    schema = from_arrow_schema(backend.read_parquet(keys[0]).schema)
    groups = [
        [keys[i] for i in group]
        for group in spark_packing(sizes, spark.sparkContext.defaultParallelism)
    ]

    def read(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import obstore

        store = backend.library()
        for batch in batches:
            for number in batch.column(0).to_pylist():
                for key in groups[number]:
                    data = obstore.get(store, key).bytes()
                    yield from pq.read_table(pa.BufferReader(memoryview(data))).to_batches()

    return spark.range(0, len(groups), 1, numPartitions=len(groups)).mapInArrow(read, schema)


def bench_read(backend: Backend, files: int, rows: int, repeats: int) -> None:
    from pyspark.sql import DataFrame, SparkSession

    from branchwater.spark_jobs.reader import read_parquet

    tmp = backend.root
    os.environ["BRANCHWATER_CACHE_DIR"] = f"{tmp}/cache"
    spark = session(str(tmp))
    assert isinstance(spark, SparkSession)
    options = backend.s3_options or None
    with backend.connect() as lake:
        lake.create_repository("bench", backend.namespace("ns"))
        commit, physical = write_dataset(lake, files, rows)
        ref = lake.repository("bench").ref(commit)
        sizes = [entry.size for entry in ref.list("tables/orders/")]

        def scan(frame: DataFrame) -> int:
            frame.write.format("noop").mode("overwrite").save()
            return len(frame.columns)

        def ours() -> int:
            return scan(read_parquet(spark, ref, "tables/orders/", s3_options=options))

        def floor() -> int:
            if backend.server is not None:
                return scan(library_reads(spark, backend, physical, sizes))
            return scan(spark.read.parquet(*physical))

        candidate, reference = best_of(repeats, ours, floor)
        counted = read_parquet(spark, ref, "tables/orders/", s3_options=options).count()
    spark.stop()
    assert counted == files * rows
    print(
        f"BENCH spark-read ratio={candidate / reference:.2f} "
        f"branchwater_ms={candidate * 1e3:.0f} spark_ms={reference * 1e3:.0f} "
        f"files={files} rows={files * rows} {backend.label}",
        flush=True,
    )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench_spark_read")
    parser.add_argument("--files", type=int, default=200)
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--repeats", type=int, default=5)
    args, _ = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory() as tmp, open_backend(Path(tmp)) as backend:
        bench_read(backend, args.files, args.rows, args.repeats)


if __name__ == "__main__":
    main(sys.argv[1:])
