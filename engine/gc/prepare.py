"""`prepare_uncommitted_for_gc`: every branch's uncommitted addresses, as Parquet, for GC.

A run writes under `<namespace>/_branchwater/retention/gc/uncommitted/<run_id>/`:

- `uncommitted/part-NNNNN.parquet`: (address, creation_time, branch, source, size) of every
  entry in a staging token (`source` = `staged`), a sealed token (`sealed`) or a compacted
  metarange but not in HEAD (`compacted`); `size` is the one the entry records, which spares
  GC a look at the object. Files target `GCSettings.prepare_file_bytes`.
- `uncommitted/copies-NNNNN.parquet`: the copy records (`copy`, no size), read only after
  every branch was scanned, as lakeFS's GC design requires. Always written, so the folder is
  readable when empty.
- `_SUCCESS`: the manifest (JSON), written last. A run without it is unfinished and must be
  ignored; `_progress.json` says where to resume it.

Run ids sort newest first and encode the run's start (`started_at`), from which GC takes its
cutoff: an entry this run missed was staged after it started, so its object is younger than
the start (or its address is in a copy record). Entries that move while a branch is scanned
stay covered: committed ones are in the committed listing GC reads after this run, and a
compaction is followed by scanning its metarange too. A branch deleted meanwhile is skipped.
Imported entries (external addresses, outside the namespace) are left out: GC never
collects them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from itertools import islice
from operator import itemgetter
from typing import Any, Literal, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from branchwater.engine import failpoints
from branchwater.engine.errors import (
    BranchwaterError,
    CorruptedData,
    InvalidArgument,
    NotFound,
    RunExpired,
    Unavailable,
    too_many_tries,
)
from branchwater.engine.gc.addresses import newest_first_id, newest_first_time
from branchwater.engine.gc.context import GCContext
from branchwater.engine.graveler.commit import Progress
from branchwater.engine.graveler.committed.format import UTC_MICROS, split_staged
from branchwater.engine.graveler.external import external_mask
from branchwater.engine.graveler.graveler import Graveler
from branchwater.engine.graveler.model import (
    BranchRecord,
    Entry,
    RepositoryRecord,
)
from branchwater.engine.objects import ObjectStore

RETENTION_PREFIX = "_branchwater/retention/gc/uncommitted/"
ROWS_DIR = "uncommitted/"
MANIFEST = "_SUCCESS"
PROGRESS = "_progress.json"
FORMAT = "branchwater-gc-uncommitted/1"

SCHEMA = pa.schema(
    [
        pa.field("address", pa.string(), nullable=False),
        pa.field("creation_time", UTC_MICROS, nullable=False),
        pa.field("branch", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("size", pa.int64()),
    ]
)
ROW_GROUP_ROWS = 100_000
"""Rows read, decoded and written together: one Parquet row group."""
CODEC = "lz4"
"""The compression of every file GC writes (a prepare run's, and the job's sets, scratch
files and records): each is read once or twice, soon, so a fast codec pays over Snappy."""
MAX_COMPACTIONS_FOLLOWED = 10
CLOCK_SKEW_MARGIN = timedelta(minutes=5)
"""Other processes sweep expired copy records by their own clocks."""

log = logging.getLogger(__name__)


LayerKind = Literal["staged", "sealed", "compacted"]
"""Where an uncommitted entry was found: the `source` column of a run (or `copy`)."""


class PreparedRun(NamedTuple):
    run_id: str
    location: str


@dataclass
class Layer:
    """One source of uncommitted entries: a token, or a compacted metarange diffed on HEAD's."""

    kind: LayerKind
    ident: str
    base: str = ""


@dataclass
class BranchCursor:
    """How far the scan of one branch got: its layers, the one being read, the last path."""

    branch: str
    layers: list[Layer]
    layer: int = 0
    after: str = ""

    @classmethod
    def start(cls, g: Graveler, repo: RepositoryRecord, branch: BranchRecord) -> BranchCursor:
        layers = [Layer("staged", branch.staging_token)]
        layers += [Layer("sealed", token) for token in branch.sealed_tokens]
        cursor = cls(branch.name, layers)
        if branch.compacted_metarange_id:
            cursor.follow(g, repo, branch)
        return cursor

    def follow(self, g: Graveler, repo: RepositoryRecord, branch: BranchRecord) -> None:
        """Add the branch's compacted metarange, diffed against its HEAD."""
        assert branch.compacted_metarange_id
        head = g.refs.get_commit(repo, branch.commit_id).metarange_id
        self.layers.append(Layer("compacted", branch.compacted_metarange_id, head))

    def covers(self, compacted_metarange_id: str | None) -> bool:
        return compacted_metarange_id is None or any(
            layer.kind == "compacted" and layer.ident == compacted_metarange_id
            for layer in self.layers
        )


@dataclass
class RunProgress:
    """What `_progress.json` holds: enough to resume the run where it was interrupted."""

    run_id: str
    repository_id: str
    next_part: int = 0
    files: list[str] = field(default_factory=list)
    branches: dict[str, int] = field(default_factory=dict)
    done_through: str | None = None
    cursor: BranchCursor | None = None
    scanned: bool = False

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()

    @classmethod
    def decode(cls, value: bytes) -> RunProgress:
        raw = json.loads(value)
        if raw.get("cursor"):
            cursor = raw["cursor"]
            cursor["layers"] = [Layer(**layer) for layer in cursor["layers"]]
            raw["cursor"] = BranchCursor(**cursor)
        return cls(**raw)


def prepare_uncommitted_for_gc(
    g: Graveler,
    gc: GCContext,
    repo: RepositoryRecord,
    run_id: str | None = None,
    progress: Progress | None = None,
    started: Callable[[str], None] | None = None,
) -> PreparedRun:
    """Write a run and return its id and location; `run_id` resumes an unfinished run (a
    finished one is returned as it is, once its manifest reads). `started(run_id)` is told
    a new run's id before it scans anything, for a caller that resumes it if stopped (an
    Airflow retry)."""
    run = _Run(g, gc, repo, newest_first_id(gc.clock()) if run_id is None else run_id)
    if run.finished():
        read_manifest(run.objects, run.run_id, repo.unique_id)
        return run.result()
    run._check_duration()
    run.resume(required=run_id is not None)
    if started is not None and run_id is None:
        started(run.run_id)
    try:
        run.scan_branches(progress)
        copies, records = run.write_copies()
        run.finish(copies, records)
    except Unavailable as exc:
        raise Unavailable(
            f"{exc} (GC preparation run {run.run_id} stopped there: prepare again with "
            f"run_id={run.run_id!r} to resume it from its last file)"
        ) from exc
    return run.result()


def run_location(objects: ObjectStore, run_id: str) -> str:
    return objects.uri(f"{RETENTION_PREFIX}{run_id}")


def read_manifest(
    objects: ObjectStore, run_id: str, repository_id: str | None = None
) -> dict[str, Any]:
    """The manifest of a finished run; `NotFound` while it is unfinished. Given the
    repository's id, `InvalidArgument` for a run of another repository (one deleted since,
    whose namespace this one has: its listing is not this repository's)."""
    try:
        value = objects.get(f"{RETENTION_PREFIX}{run_id}/{MANIFEST}")
    except NotFound:
        raise NotFound(
            f"GC preparation run {run_id!r} has no manifest in {objects.url}: it does not "
            "exist or is unfinished (resume it with its run id)"
        ) from None
    try:
        manifest = json.loads(value)
        _check_manifest(manifest)
    except (ValueError, TypeError, KeyError) as exc:
        raise CorruptedData(
            f"GC preparation run {run_id!r} has a damaged manifest in {objects.url} ({exc}); "
            "start a new run"
        ) from None
    if repository_id is not None and manifest.get("repository_id", repository_id) != repository_id:
        raise InvalidArgument(
            f"GC preparation run {run_id!r} belongs to another repository (one deleted since, "
            "whose namespace this one has); start a new run"
        )
    return manifest


def _check_manifest(manifest: Any) -> None:
    """What GC reads of a manifest is there, of the types it expects."""
    if not isinstance(manifest, dict):
        raise TypeError("not a JSON object")
    datetime.fromisoformat(manifest["started_at"])
    files = manifest["files"]
    if not isinstance(files, list) or not all(isinstance(name, str) for name in files):
        raise TypeError("'files' is not a list of names")
    for key in ("token_expiry_seconds", "min_age_seconds"):
        if not isinstance(manifest[key], int | float):
            raise TypeError(f"{key!r} is not a number")


def read_run(objects: ObjectStore, run_id: str) -> pa.Table:
    """All rows of a finished run, as the manifest lists them."""
    manifest = read_manifest(objects, run_id)
    tables = []
    for name in manifest["files"]:
        data = objects.get(f"{RETENTION_PREFIX}{run_id}/{name}")
        tables.append(pq.read_table(pa.BufferReader(data), schema=SCHEMA))
    return pa.concat_tables(tables) if tables else SCHEMA.empty_table()


class _Run:
    def __init__(self, g: Graveler, gc: GCContext, repo: RepositoryRecord, run_id: str) -> None:
        self.g = g
        self.gc = gc
        self.repo = repo
        self.run_id = run_id
        self.started = newest_first_time(run_id)
        self.objects = g.objects(repo.storage_namespace)
        self.prefix = f"{RETENTION_PREFIX}{run_id}/"
        self.progress = RunProgress(run_id, repo.unique_id)

    def result(self) -> PreparedRun:
        return PreparedRun(self.run_id, run_location(self.objects, self.run_id))

    def finished(self) -> bool:
        return self.objects.exists(self.prefix + MANIFEST)

    def resume(self, *, required: bool) -> None:
        """Carry on from the saved progress. A run id given for a run that never saved any
        is refused rather than started: its time sets what the run protects (`started`), and
        only an id the engine took from its clock may do that."""
        try:
            saved = RunProgress.decode(self.objects.get(self.prefix + PROGRESS))
        except NotFound:
            if required:
                raise NotFound(
                    f"GC preparation run {self.run_id!r} of {self.repo.name!r} has saved no "
                    "progress to resume (it never started, or stopped before its first "
                    "file): start a new run without a run id"
                ) from None
            return
        except (ValueError, TypeError, KeyError) as exc:
            raise CorruptedData(
                f"progress of GC preparation run {self.run_id!r} is unreadable ({exc}); "
                "start a new run"
            ) from exc
        if saved.repository_id != self.repo.unique_id:
            raise InvalidArgument(
                f"GC preparation run {self.run_id!r} belongs to another repository than "
                f"{self.repo.name!r}; start a new run"
            )
        self.progress = saved

    def scan_branches(self, report: Progress | None) -> None:
        progress = self.progress
        if progress.scanned:
            return
        parts = self._writer("part", progress.next_part, self._saved)
        scanner = _BranchScanner(self.g, self.repo, progress, parts, report)
        after = progress.done_through or ""
        if progress.cursor is not None:
            after = progress.cursor.branch
            scanner.scan(progress.cursor.branch, progress.cursor)
        for branch in self.g.refs.branches(self.repo):
            if branch.name > after:
                scanner.scan(branch.name, BranchCursor.start(self.g, self.repo, branch))
        scanner.flush()
        parts.close()
        progress.scanned = True
        self._checkpoint()

    def write_copies(self) -> tuple[list[str], int]:
        """Write the copy records, read now that every branch was scanned; returns the files
        and how many records."""
        names: list[str] = []
        parts = self._writer("copies", 0, names.append)
        records = list(self.gc.copies.records(self.repo))
        self._check_duration()
        for chunk in _chunks(records, ROW_GROUP_ROWS):
            addresses = pa.array([r.address for r in chunk], pa.string())
            times = pa.array([r.created for r in chunk], UTC_MICROS)
            branches = pa.array([r.branch for r in chunk], pa.string())
            sizes = pa.nulls(len(chunk), pa.int64())
            parts.add(_batch(Columns(addresses, times, sizes), branches, "copy"))
        parts.close(always=True)
        return names, len(records)

    def finish(self, copies: list[str], records: int) -> None:
        """The manifest, with the limits the lake's clients were promised (`lakewide`)."""
        limits = self.gc.limits.settings_for_runs()
        files = [*self.progress.files, *copies]
        keep = {*files, PROGRESS}
        strays = [
            info.key
            for info in self.objects.list_objects(self.prefix)
            if info.key[len(self.prefix) :] not in keep
        ]
        self.objects.delete(strays)
        manifest = {
            "format": FORMAT,
            "run_id": self.run_id,
            "repository": self.repo.name,
            "repository_id": self.repo.unique_id,
            "started_at": self.started.isoformat(),
            "finished_at": self.gc.clock().isoformat(),
            "token_expiry_seconds": limits.token_expiry.total_seconds(),
            "min_age_seconds": limits.default_min_age.total_seconds(),
            "copy_record_ttl_seconds": limits.copy_record_ttl.total_seconds(),
            "files": files,
            "branches": self.progress.branches,
            "copy_records": records,
            "schema": SCHEMA.names,
        }
        self.objects.put(self.prefix + MANIFEST, json.dumps(manifest, indent=1).encode())
        try:
            self.objects.delete([self.prefix + PROGRESS])
        except BranchwaterError as exc:
            log.warning(
                "GC preparation run %s finished; its progress file stays: %s", self.run_id, exc
            )

    def _check_duration(self) -> None:
        """Copy records made since the start must all still be there when read."""
        elapsed = self.gc.clock() - self.started
        ttl = self.gc.limits.settings_for_runs().copy_record_ttl
        if elapsed < -CLOCK_SKEW_MARGIN:
            raise InvalidArgument(
                f"GC preparation run {self.run_id!r} starts {-elapsed} from now: its time "
                "would let GC collect objects written after it; start a new run"
            )
        if elapsed >= ttl - CLOCK_SKEW_MARGIN:
            raise RunExpired(
                f"GC preparation run {self.run_id!r} started {elapsed} ago, close to or past "
                f"the lake's shortest copy-record lifetime ({ttl}): records it "
                "must read may be gone; start a new run"
            )

    def _writer(self, stem: str, first: int, on_file: Callable[[str], None]) -> _PartWriter:
        target = self.gc.settings.prepare_file_bytes
        return _PartWriter(self.objects, self.prefix, stem, first, target, on_file)

    def _saved(self, name: str) -> None:
        self.progress.files.append(name)
        self.progress.next_part += 1
        self._checkpoint()

    def _checkpoint(self) -> None:
        self.objects.put(self.prefix + PROGRESS, self.progress.encode())


class _BranchScanner:
    """Reads branches' layers in bulk into Arrow columns and hands them to the writer.

    Staged values are decoded in batches of up to `ROW_GROUP_ROWS` across branches: a
    repository of many small staging areas costs one decoding, not one per branch (the
    `gc-prepare` benchmark's many small staging areas). Every batch reaches the
    writer whole, before anything else does, so the progress saved when the writer finishes
    a file covers exactly what the scan read."""

    def __init__(
        self,
        g: Graveler,
        repo: RepositoryRecord,
        progress: RunProgress,
        parts: _PartWriter,
        report: Progress | None,
    ) -> None:
        self.g = g
        self.repo = repo
        self.progress = progress
        self.parts = parts
        self.report = report
        self.rows = sum(progress.branches.values())
        self._staged: list[tuple[str, str, list[bytes]]] = []
        self._staged_rows = 0

    def scan(self, name: str, cursor: BranchCursor) -> None:
        """Scan every layer, then follow compactions that happened meanwhile until none did."""
        failpoints.hit("prepare.branch_scan")
        self.progress.cursor = cursor
        for _ in range(MAX_COMPACTIONS_FOLLOWED):
            while cursor.layer < len(cursor.layers):
                self._scan_layer(cursor, cursor.layers[cursor.layer])
                cursor.layer += 1
                cursor.after = ""
            try:
                current, _ = self.g.refs.get_branch(self.repo, name)
            except NotFound:
                break
            if cursor.covers(current.compacted_metarange_id):
                break
            cursor.follow(self.g, self.repo, current)
        else:
            raise too_many_tries(
                f"scanning branch {name!r} of {self.repo.name!r} for GC (compacted meanwhile)",
                MAX_COMPACTIONS_FOLLOWED,
                "resume the run with its run id",
            )
        self.progress.cursor = None
        self.progress.done_through = name

    def _scan_layer(self, cursor: BranchCursor, layer: Layer) -> None:
        if layer.kind == "compacted":
            self._scan_compacted(cursor, layer)
            return
        start = cursor.after.encode() + b"\x00" if cursor.after else b""
        for chunk in self.g.kv.scan_batches(layer.ident.encode(), start, ROW_GROUP_ROWS):
            cursor.after = chunk[-1][0].decode()
            self._staged.append((cursor.branch, layer.kind, list(map(itemgetter(1), chunk))))
            self._staged_rows += len(chunk)
            if self._staged_rows >= ROW_GROUP_ROWS:
                self.flush()

    def _scan_compacted(self, cursor: BranchCursor, layer: Layer) -> None:
        changes = self.g.committed(self.repo).diff(layer.base, layer.ident, physical=True)
        entries = (c.entry for c in changes if c.type != "removed" and c.path > cursor.after)
        for chunk in _chunks(entries, ROW_GROUP_ROWS):
            batch = _batch(_entry_columns(chunk), cursor.branch, layer.kind)
            self._emit(cursor, chunk[-1].path, batch)

    def flush(self) -> None:
        """Decode the staged values read so far and hand them to the writer."""
        if not self._staged:
            return
        pieces, self._staged, self._staged_rows = self._staged, [], 0
        values = [value for _, _, chunk in pieces for value in chunk]
        branches = pa.concat_arrays(
            [pa.repeat(pa.scalar(b, pa.string()), len(c)) for b, _, c in pieces]
        )
        sources = pa.concat_arrays(
            [pa.repeat(pa.scalar(k, pa.string()), len(c)) for _, k, c in pieces]
        )
        batch = staged_batch(values, branches, sources)
        counts = pc.value_counts(batch.column(SCHEMA.get_field_index("branch")))
        for count in counts.to_pylist():
            self._count(count["values"], count["counts"])
        self._add(batch)

    def _emit(self, cursor: BranchCursor, after: str, batch: pa.RecordBatch) -> None:
        """Hand `batch` (the rows up to `after`) to the writer behind the staged rows read
        before it. The cursor moves only once those are in: a file they finish saves the
        progress, which must not yet cover this batch."""
        self.flush()
        cursor.after = after
        self._count(cursor.branch, batch.num_rows)
        self._add(batch)

    def _count(self, branch: str, rows: int) -> None:
        branches = self.progress.branches
        branches[branch] = branches.get(branch, 0) + rows

    def _add(self, batch: pa.RecordBatch) -> None:
        self.parts.add(batch)
        self.rows += batch.num_rows
        if self.report is not None:
            self.report(self.rows)


class Columns(NamedTuple):
    """What a run records of each entry, besides its branch and source."""

    addresses: pa.Array
    times: pa.Array
    sizes: pa.Array


def staged_batch(values: list[bytes], branches: pa.Array, sources: pa.Array) -> pa.RecordBatch:
    """Rows of staged `values` (with their `branches` and `sources`), split by Arrow kernels
    as commits split them; tombstones dropped."""
    try:
        fields = split_staged(pa.array(values, pa.binary()))
    except (pa.ArrowException, ValueError) as exc:
        raise CorruptedData(f"staged entries of GC's prepare cannot be decoded: {exc}") from exc
    live = pc.invert(fields.deleted)
    columns = Columns(
        fields.address.filter(live), fields.mtime.filter(live), fields.size.filter(live)
    )
    return _batch(columns, branches.filter(live), sources.filter(live))


def _entry_columns(entries: list[Entry]) -> Columns:
    return Columns(
        pa.array([e.address for e in entries], pa.string()),
        pa.array([e.mtime for e in entries], UTC_MICROS),
        pa.array([e.size for e in entries], pa.int64()),
    )


def _batch(columns: Columns, branch: str | pa.Array, source: str | pa.Array) -> pa.RecordBatch:
    rows = len(columns.addresses)
    branches = pa.repeat(branch, rows) if isinstance(branch, str) else branch
    sources = pa.repeat(source, rows) if isinstance(source, str) else source
    arrays = [columns.addresses, columns.times, branches, sources, columns.sizes]
    return pa.record_batch(arrays, schema=SCHEMA)


def _chunks(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    iterator = iter(items)
    while chunk := list(islice(iterator, size)):
        yield chunk


class _PartWriter:
    """Parquet files of about the target size, `uncommitted/<stem>-NNNNN.parquet`, each
    encoded in memory and put whole, so a reader never sees part of a file."""

    def __init__(
        self,
        objects: ObjectStore,
        prefix: str,
        stem: str,
        first: int,
        target_bytes: int,
        on_file: Callable[[str], None],
    ) -> None:
        self.objects = objects
        self.prefix = prefix
        self.stem = stem
        self.number = first
        self.on_file = on_file
        self.target_bytes = target_bytes
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self._sink: pa.BufferOutputStream | None = None
        self._writer: pq.ParquetWriter | None = None

    def add(self, batch: pa.RecordBatch) -> None:
        batch = batch.filter(pc.invert(external_mask(batch.column("address"), self.objects.url)))
        if not batch.num_rows:
            return
        self._pending.append(batch)
        self._pending_rows += batch.num_rows
        if self._pending_rows >= ROW_GROUP_ROWS:
            self._write_pending()
            if self._sink is not None and self._sink.tell() >= self.target_bytes:
                self._finish_file()

    def close(self, *, always: bool = False) -> None:
        """Write what is pending; `always` writes a file even when there is nothing."""
        self._write_pending()
        if self._writer is None and always:
            self._open()
        if self._writer is not None:
            self._finish_file()

    def _open(self) -> pq.ParquetWriter:
        if self._writer is None:
            self._sink = pa.BufferOutputStream()
            self._writer = pq.ParquetWriter(self._sink, SCHEMA, compression=CODEC)
        return self._writer

    def _write_pending(self) -> None:
        if self._pending:
            table = pa.Table.from_batches(self._pending, SCHEMA)
            self._open().write_table(table, row_group_size=max(len(table), 1))
            self._pending, self._pending_rows = [], 0

    def _finish_file(self) -> None:
        assert self._writer is not None and self._sink is not None
        self._writer.close()
        name = f"{ROWS_DIR}{self.stem}-{self.number:05d}.parquet"
        self.objects.put(self.prefix + name, self._sink.getvalue().to_pybytes())
        self._writer, self._sink = None, None
        self.number += 1
        self.on_file(name)
