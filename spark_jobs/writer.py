"""Write a Spark DataFrame to a branch through the link flow.

The driver asks the branch for one physical address per partition; each Spark task writes
its partition as one Parquet file straight to its address in the repository's storage
namespace, and reports the file's size and SHA-256 (the engine's own checksum, so the same
bytes uploaded and linked are one object); the driver then links every file at
`<prefix>/part-NNNNN.parquet`. Data never passes through the driver, and executors need
no access to the KV store: only to the object store.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote, urlsplit

if TYPE_CHECKING:
    import pyarrow as pa
    from pyarrow import fs
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
    namespace = branch.repository.storage_namespace.rstrip("/")
    addresses = {i: branch.get_physical_address() for i in range(frame.rdd.getNumPartitions())}
    targets = {i: f"{namespace}/{a.address}" for i, a in addresses.items()}
    writer = partial(_write_partition, targets=targets, s3_options=dict(s3_options or {}))
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
    targets: Mapping[int, str],
    s3_options: Mapping[str, str | None],
) -> Iterator[pa.RecordBatch]:
    """Runs in a Spark task: write this partition's rows to its address, report the file."""
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
    table = pa.Table.from_batches(rows)
    buffer = pa.BufferOutputStream()
    pq.write_table(table, buffer)
    data = buffer.getvalue().to_pybytes()
    filesystem, path = filesystem_for(targets[partition], s3_options)
    filesystem.create_dir(path.rsplit("/", 1)[0], recursive=True)
    with filesystem.open_output_stream(path) as out:
        out.write(data)
    yield pa.RecordBatch.from_pydict(
        {
            "partition": pa.array([partition], pa.int32()),
            "size": pa.array([len(data)], pa.int64()),
            "checksum": [hashlib.sha256(data).hexdigest()],
        }
    )


def filesystem_for(url: str, s3_options: Mapping[str, str | None]) -> tuple[fs.FileSystem, str]:
    """A pyarrow filesystem and path for a `file://` or `s3://` object URL."""
    from pyarrow import fs

    parts = urlsplit(url)
    if parts.scheme == "file":
        return fs.LocalFileSystem(), unquote(parts.path)
    if parts.scheme == "s3":
        return _s3(s3_options), f"{parts.netloc}{parts.path}"
    raise ValueError(f"cannot write to {url!r}: use a file:// or s3:// namespace")


def _s3(options: Mapping[str, str | None]) -> Any:
    from pyarrow import fs

    endpoint = options.get("endpoint_url")
    parsed = urlsplit(endpoint) if endpoint else None
    return fs.S3FileSystem(
        access_key=options.get("aws_access_key_id"),
        secret_key=options.get("aws_secret_access_key"),
        session_token=options.get("aws_session_token"),
        region=options.get("region_name") or "us-east-1",
        endpoint_override=parsed.netloc if parsed else None,
        scheme=parsed.scheme if parsed else "https",
    )
