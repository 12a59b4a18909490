"""Write a Spark DataFrame to a branch through the link flow.

The driver asks the branch for one physical address per partition (which a branch protected
from direct writes refuses), then checks what `mode` says to do with files already under the
prefix; each Spark
task writes its partition as one Parquet file straight to its address in the repository's
storage namespace, through the engine's object store (the one object layer: atomic on local
files, a single PUT or an aborted-on-failure multipart upload on S3), and reports the file's
size and SHA-256 (the engine's own checksum, so the same bytes uploaded and linked are one
object); the driver then links every file at `<prefix>/part-NNNNN-<write id>.parquet`, or
none of them, and with `mode="overwrite"` deletes every other entry under the prefix. Data
never passes through the driver, and executors need no access to the KV store: only to the
object store.

Files are written under link tokens, so a GC run at the same time spares them until the
tokens expire; a write that fails or is killed before linking leaves only such objects,
collected once their tokens expire. The write id makes every path new: taking a link back is
deleting its path, and no other writer's entry is ever replaced.
"""

from __future__ import annotations

import contextlib
import hashlib
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING

from branchwater.engine import (
    AlreadyExists,
    BranchwaterError,
    InvalidArgument,
    NotFound,
    check_s3_options,
    open_object_store,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import DataFrame

    from branchwater.engine import Branch, Entry, PhysicalAddress

REPORT_SCHEMA = "partition int, size long, checksum string"
MODES = {
    "errorifexists": "errorifexists",
    "error": "errorifexists",
    "overwrite": "overwrite",
    "append": "append",
    "ignore": "ignore",
}
"""Spark's save modes (`DataFrameWriter.mode`), by the names it takes, case aside."""
SHOWN_PATHS = 3
"""Paths an error message names before it says how many more there are."""


class PartialWrite(BranchwaterError):
    """A write failed after it had staged part of its changes, and could not take them back
    (most likely for the reason it failed: the KV store unreachable, the branch protected
    or deleted meanwhile). The message names what stays staged and how to clear it."""


def write_parquet(
    frame: DataFrame,
    branch: Branch,
    prefix: str,
    *,
    mode: str = "errorifexists",
    s3_options: Mapping[str, str | None] | None = None,
    metadata: Mapping[str, str] | None = None,
) -> list[Entry]:
    """Stage `frame` on `branch` as Parquet files under `prefix`, one per non-empty partition,
    and return their entries.

    `prefix` is a folder (`tables/orders/`; empty: the branch's root). `mode` is Spark's
    save mode: `errorifexists` (the default, also spelled `error`) raises `AlreadyExists` if
    the branch shows anything under the prefix, `ignore` then writes nothing and returns
    `[]`, `append` adds the files beside what is there, `overwrite` then stages the deletion
    of everything else under the prefix. The mode and the branch's protection
    (`BranchProtected`) are checked before any task runs. The files are linked all or none:
    a link that fails takes the earlier ones back (`PartialWrite` if that fails too).
    `s3_options` (as `Lake.connect` takes them) let executors write to an `s3://` namespace.
    Addresses are handed out first, which a protected branch refuses; those left unused
    (empty partitions, a mode that writes nothing) expire with their tokens.
    """
    how = _mode(mode)
    folder = _folder(prefix)
    options = check_s3_options(s3_options or {})
    addresses = {i: branch.get_physical_address() for i in range(frame.rdd.getNumPartitions())}
    shown = next(iter(branch.list(folder)), None)
    if shown is not None and how == "ignore":
        return []
    if shown is not None and how == "errorifexists":
        raise AlreadyExists(
            f"branch {branch.name!r} of {branch.repository.name!r} already shows "
            f"{shown.path!r} under {_where(folder)}: pass mode='overwrite' to "
            "replace what is there, or mode='append' to write beside it"
        )
    write_id = uuid.uuid4()
    writer = partial(
        _write_partition,
        namespace=branch.repository.storage_namespace,
        keys={i: a.address for i, a in addresses.items()},
        s3_options=options,
    )
    reports = frame.mapInArrow(writer, REPORT_SCHEMA).collect()
    entries = _link_all(
        branch,
        addresses,
        [(int(r["partition"]), int(r["size"]), str(r["checksum"])) for r in reports],
        lambda partition: f"{folder}part-{partition:05d}-{write_id}.parquet",
        metadata,
    )
    if how == "overwrite":
        _delete_others(branch, folder, {entry.path for entry in entries})
    return entries


def _mode(mode: object) -> str:
    if not isinstance(mode, str) or mode.lower() not in MODES:
        raise InvalidArgument(
            f"mode {mode!r} is not a Spark save mode: use one of {', '.join(MODES)}"
        )
    return MODES[mode.lower()]


def _folder(prefix: object) -> str:
    """The prefix as the start of its files' paths: `""` or ending in one `/`. A leading `/`
    is refused: a path in a branch has none, and `branchwater://` could not address it."""
    if not isinstance(prefix, str):
        raise InvalidArgument(f"prefix must be a string, not {type(prefix).__name__}")
    if prefix.startswith("/"):
        raise InvalidArgument(
            f"prefix {prefix!r} starts with '/': paths in a branch are relative "
            "(tables/orders/; an empty prefix is the branch's root)"
        )
    return prefix.rstrip("/") + "/" if prefix else ""


def _link_all(
    branch: Branch,
    addresses: Mapping[int, PhysicalAddress],
    reports: Sequence[tuple[int, int, str]],
    path_of: Callable[[int], str],
    metadata: Mapping[str, str] | None,
) -> list[Entry]:
    """Link each partition's file, in partition order, or none: the engine links one path
    at a time, so a failed link (an expired token, a rule set meanwhile) takes back the
    links made before it, and the branch shows none of this write's files."""
    entries: list[Entry] = []
    try:
        for partition, size, checksum in sorted(reports):
            address = addresses[partition]
            entries.append(
                branch.link_physical_address(
                    path_of(partition),
                    address.token,
                    size=size,
                    checksum=checksum,
                    metadata=metadata,
                    address=address.address,
                )
            )
    except BaseException as exc:
        _take_back(branch, [entry.path for entry in entries], exc)
        raise
    return entries


def _take_back(branch: Branch, paths: Sequence[str], cause: BaseException) -> None:
    """Delete the paths a failed write linked: each is new (its write id), so deleting it
    leaves the branch as it was. `PartialWrite` naming those left if a delete fails."""
    left = []
    for path in paths:
        try:
            _delete(branch, path)
        except BranchwaterError:
            left.append(path)
    if left:
        raise PartialWrite(
            f"write_parquet failed ({type(cause).__name__}: {cause}) after linking "
            f"{len(paths)} file(s) on branch {branch.name!r} of {branch.repository.name!r}, "
            f"and {len(left)} could not be taken back: {_named(left)}; delete them, or drop "
            "the branch's uncommitted changes with reset()"
        ) from cause


def _delete_others(branch: Branch, folder: str, kept: set[str]) -> None:
    """`overwrite`: stage the deletion of every entry under `folder` but this write's, as
    the branch shows them once it is linked (so what a concurrent write added meanwhile
    goes too). A delete that fails leaves the new files staged and says what else is."""
    others = [entry.path for entry in branch.list(folder) if entry.path not in kept]
    for done, path in enumerate(others):
        try:
            _delete(branch, path)
        except BranchwaterError as exc:
            raise PartialWrite(
                f"write_parquet staged its {len(kept)} file(s) under {_where(folder)} on "
                f"branch {branch.name!r} of {branch.repository.name!r}, but could not delete "
                f"the {len(others) - done} earlier entries still there "
                f"({type(exc).__name__}: {exc}): {_named(others[done:])}; delete them, or "
                "run the write again with mode='overwrite'"
            ) from exc


def _delete(branch: Branch, path: str) -> None:
    """Stage the deletion of `path`; one already gone (a concurrent delete) is no error."""
    with contextlib.suppress(NotFound):
        branch.delete(path)


def _where(folder: str) -> str:
    return repr(folder) if folder else "the branch's root"


def _named(paths: Sequence[str]) -> str:
    shown = ", ".join(repr(path) for path in paths[:SHOWN_PATHS])
    more = len(paths) - SHOWN_PATHS
    return f"{shown} and {more} more" if more > 0 else shown


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
