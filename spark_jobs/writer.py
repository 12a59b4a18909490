"""Write a Spark DataFrame to a branch through the link flow.

The driver asks the branch for one physical address per partition; each Spark task writes
its partition as one Parquet file straight to its address in the repository's storage
namespace, through the engine's object store (the one object layer: atomic on local files,
a single PUT or an aborted-on-failure multipart upload on S3), and reports the file's size
and SHA-256 (the engine's own checksum, so the same bytes uploaded and linked are one
object); the driver then links every file at `<prefix>/part-NNNNN.parquet`. Data never
passes through the driver, and executors need no access to the KV store: only to the
object store.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from functools import partial
from typing import TYPE_CHECKING

from branchwater.engine import check_s3_options, open_object_store

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from branchwater.engine import Branch, Entry

REPORT_SCHEMA = "partition int, size long, checksum string"


def write_parquet(
    frame: DataFrame,
    branch: Branch,
    prefix: str,
    *,
    s3_options: Mapping[str, str | None] | None = None,
    metadata: Mapping[str, str] | None = None,
) -> list[Entry]:
    """Stage `frame` on `branch` as Parquet files under `prefix`, one per non-empty partition.

    `s3_options` (as `Lake.connect` takes them) let executors write to an `s3://` namespace.
    Addresses handed out for empty partitions stay unused; their tokens expire.
    """
    namespace = branch.repository.storage_namespace
    options = check_s3_options(s3_options or {})
    addresses = {i: branch.get_physical_address() for i in range(frame.rdd.getNumPartitions())}
    writer = partial(
        _write_partition,
        namespace=namespace,
        keys={i: a.address for i, a in addresses.items()},
        s3_options=options,
    )
    reports = frame.mapInArrow(writer, REPORT_SCHEMA).collect()
    entries = []
    for report in sorted(reports, key=lambda r: int(r["partition"])):
        address = addresses[report["partition"]]
        entries.append(
            branch.link_physical_address(
                f"{prefix.rstrip('/')}/part-{report['partition']:05d}.parquet",
                address.token,
                size=report["size"],
                checksum=report["checksum"],
                metadata=metadata,
                address=address.address,
            )
        )
    return entries


def _write_partition(
    batches: Iterator[pa.RecordBatch],
    *,
    namespace: str,
    keys: Mapping[int, str],
    s3_options: Mapping[str, str | None],
) -> Iterator[pa.RecordBatch]:
    """Runs in a Spark task: write this partition's rows to its address, report the file.
    A task killed midway leaves no object at the address (the store writes atomically)."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from pyspark import TaskContext

    rows = [batch for batch in batches if batch.num_rows]
    if not rows:
        return
    context = TaskContext.get()
    if context is None:
        raise RuntimeError("_write_partition runs inside a Spark task only")
    partition = context.partitionId()
    buffer = pa.BufferOutputStream()
    pq.write_table(pa.Table.from_batches(rows), buffer)
    data = buffer.getvalue().to_pybytes()
    store = open_object_store(namespace, **s3_options)
    try:
        store.put_stream(keys[partition], [data])
    finally:
        store.close()
    yield pa.RecordBatch.from_pydict(
        {
            "partition": pa.array([partition], pa.int32()),
            "size": pa.array([len(data)], pa.int64()),
            "checksum": [hashlib.sha256(data).hexdigest()],
        }
    )
