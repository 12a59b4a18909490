"""Read a ref's objects with Spark: the ref resolved on the driver, the files read on executors.

The driver streams the ref's entries under a prefix into manifest files of `MANIFEST_ROWS`
entries each, handed to the executors with `SparkContext.addFile`, so a ref with millions of
entries never sits in the driver's memory at once; it keeps only the files' sizes, a part at
a time, to pack them into Spark partitions as `spark.read` does (`maxPartitionBytes`,
`openCostInBytes`). A Parquet file larger than the split size is cut into byte ranges, as
Spark's Parquet source cuts it: the driver knows only its size, and the task of each range
reads the footer and the row groups whose midpoint lies in its range (`_row_groups`). Each
Spark task reads its slice of a manifest and the physical files (or ranges) it names with
pyarrow, from file objects the engine's object store opens (one store per Python worker,
kept across its tasks: `shared_object_store`; ranged reads: a
Parquet file's footer and the column chunks asked for, nothing more; a file no larger than
Spark's `openCostInBytes` is fetched whole with one GET instead), as the writer writes
them: executors need no `s3a` jars and no access to the KV store. Partition columns come
from Hive-style folders (`k=v/`) under the prefix, typed as Spark's partition discovery
types them.

The frame is the ref as it was when `read_files` listed it: a branch's uncommitted objects
included, later changes to the branch not. Manifests stay until the process exits, unless
the read is made inside `manifest_scope()`, which removes them when it ends. A Spark Connect
session is refused (`SparkConnectUnsupported`): it has no `SparkContext.addFile`.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import datetime
import io
import re
import shutil
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, cast
from urllib.parse import unquote

from branchwater.engine import (
    BranchwaterError,
    CorruptedData,
    Entry,
    InvalidArgument,
    NotFound,
    ObjectStore,
    check_s3_options,
    imported_version,
    open_source,
    shared_object_store,
    verified,
)

if TYPE_CHECKING:
    import pyarrow as pa
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

    from branchwater.engine import Ref

MANIFEST_ROWS = 50_000
"""Entries per manifest file: what the driver holds at once while it lists a ref."""
MANIFEST_ROW_GROUP = 1_024
"""Rows per manifest row group: a task reads only the groups its slice covers."""
EXTERNAL_SCHEMES = ("s3://", "file://")
"""An imported object's address is its full URI; every other address is relative to the
repository's namespace (the engine's convention, `engine/graveler/external.py`)."""
DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"
FORMATS = ("parquet", "csv", "json", "orc", "ipc", "arrow", "feather")
_PARTITION_DIR = re.compile(r"([^=/]+)=([^/]*)")
_INTEGER = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?(?:NaN|Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)")
_DATE = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")
_WIDER = ("int", "long", "double")
_KINDS = ("int", "long", "double", "date")
"""The types a partition value may have besides string, narrowest first."""


class SparkConnectUnsupported(InvalidArgument):
    """The reader was handed a Spark Connect session: it ships its manifests to the
    executors with `SparkContext.addFile` and runs its tasks' Python on them, and a Connect
    client has no `SparkContext`. Use a classic session (`SparkSession.builder.master(...)`
    without `.remote(...)`), or read through the fsspec filesystem (`branchwater://`)."""


@dataclass(frozen=True)
class Slice:
    """Rows `start` to `stop` of one manifest file: one Spark partition's files. The first
    file is read from byte `head` and the last up to byte `tail` (None: to its end), when
    they are ranges of a Parquet file cut in pieces; the files between are read whole."""

    manifest: str
    start: int
    stop: int
    head: int = 0
    tail: int | None = None


@dataclass(frozen=True)
class _Piece:
    """A file, or a byte range of it, as `spark.read` counts it when it packs partitions."""

    row: int
    begin: int
    end: int | None
    length: int


@dataclass(frozen=True)
class ReadPlan:
    """What every task needs besides its slice: how to read a file and what to yield."""

    file_format: ds.FileFormat
    data_schema: pa.Schema
    partition_types: tuple[tuple[str, str], ...]
    output_schema: pa.Schema
    s3_options: Mapping[str, str | None]
    where: str
    slices: tuple[Slice, ...] = field(default=())
    read_whole: int = 0
    """Files of at most this many bytes are read with one GET, not opened for ranged
    reads (a HEAD, the footer, the column chunks): Spark's `openCostInBytes`, what it
    counts opening a file to cost."""


def read_parquet(
    spark: SparkSession,
    ref: Ref,
    prefix: str = "",
    *,
    s3_options: Mapping[str, str | None] | None = None,
    schema: StructType | str | None = None,
) -> DataFrame:
    """The Parquet dataset under `prefix` at `ref` (a `Branch`, or `repo.ref(tag or commit)`),
    as `spark.read.parquet` would read it from a file system. See `read_files`."""
    return read_files(spark, ref, prefix, format="parquet", s3_options=s3_options, schema=schema)


def read_files(
    spark: SparkSession,
    ref: Ref,
    prefix: str = "",
    *,
    format: str | ds.FileFormat = "parquet",
    s3_options: Mapping[str, str | None] | None = None,
    schema: StructType | str | None = None,
) -> DataFrame:
    """The files under `prefix` at `ref` in any format pyarrow reads, as one DataFrame.

    `prefix` names a folder (`tables/orders/`, the whole ref when empty) or one object.
    `format` is a name in `FORMATS` or a `pyarrow.dataset.FileFormat` (CSV parse options,
    say). Files whose name, or a folder's, starts with `_` or `.` are skipped, as Spark skips
    them. `schema` (a `StructType` or DDL string) gives the data columns; without it, the
    first file's schema is used. `s3_options` (as `Lake.connect` takes them) let executors
    read an `s3://` namespace. `NotFound` when no file lies under the prefix;
    `InvalidArgument` for an unknown format or folders that disagree on partition columns.
    """
    _refuse_connect(spark)
    file_format = _file_format(format)
    base, exact = _base(ref, prefix)
    where = f"{base or '(the whole ref)'!r} at {_ref_label(ref)}"
    options = check_s3_options(s3_options or {})
    directory = Path(tempfile.mkdtemp(prefix="branchwater-read-"))
    scope = _SCOPE.get()
    (scope if scope is not None else _REMOVE_AT_EXIT).append(directory)
    listed = _write_manifests(spark, ref, base, exact, directory)
    if listed.first is None:
        raise NotFound(
            f"no files under {where} in repository {ref.repository.name!r}: "
            "check the prefix and the ref (`branchwater ls` lists what it holds)"
        )
    data_schema = _data_schema(spark, ref, listed.first, file_format, schema)
    partitions = tuple(listed.partitions.types())
    output = _output_schema(spark, data_schema, partitions)
    max_bytes, open_cost = _split_settings(spark)
    plan = ReadPlan(
        file_format,
        data_schema,
        partitions,
        output,
        options,
        where,
        tuple(
            _slices(spark, directory, listed.manifests, max_bytes, open_cost, _splits(file_format))
        ),
        open_cost,
    )
    from pyspark.sql.pandas.types import from_arrow_schema

    ids = spark.range(0, len(plan.slices), 1, numPartitions=len(plan.slices))
    return ids.mapInArrow(partial(_read_slices, plan=plan), from_arrow_schema(output))


def _refuse_connect(spark: SparkSession) -> None:
    """Refuse a Spark Connect session before anything is listed or written: it has no
    `SparkContext` to ship manifests with (pyspark bundles the Connect server's jar, but a
    Connect client can only add artifacts, not files `SparkFiles.get` finds)."""
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        raise SparkConnectUnsupported(
            "read_files/read_parquet need a classic SparkSession, not a Spark Connect one "
            f"({type(spark).__module__}.{type(spark).__name__}): it ships its manifests with "
            "SparkContext.addFile, which Connect has not; build the session without "
            ".remote(...), or read through fsspec (branchwater://REPO/REF/PATH)"
        )


def _file_format(format: str | ds.FileFormat) -> ds.FileFormat:
    import pyarrow.dataset as ds

    if isinstance(format, ds.FileFormat):
        return format
    if not isinstance(format, str) or format.lower() not in FORMATS:
        raise InvalidArgument(
            f"format {format!r} is not one pyarrow reads: use one of {', '.join(FORMATS)} "
            "or a pyarrow.dataset.FileFormat"
        )
    formats: dict[str, type[ds.FileFormat]] = {
        "parquet": ds.ParquetFileFormat,
        "csv": ds.CsvFileFormat,
        "json": ds.JsonFileFormat,
        "orc": ds.OrcFileFormat,
    }
    return formats.get(format.lower(), ds.IpcFileFormat)()


def _base(ref: Ref, prefix: str) -> tuple[str, Entry | None]:
    """The folder partition columns are relative to, and the object `prefix` names if it
    names one exactly (as `spark.read` reads a file path as that file)."""
    if not isinstance(prefix, str):
        raise InvalidArgument(f"prefix must be a string, not {type(prefix).__name__}")
    if prefix and not prefix.endswith("/"):
        try:
            return prefix.rsplit("/", 1)[0] + "/" if "/" in prefix else "", ref.stat(prefix)
        except NotFound:
            return prefix + "/", None
    return prefix, None


def _ref_label(ref: Ref) -> str:
    commit_id = ref.commit_id
    return ref.name if ref.name == commit_id else f"{ref.name!r} (commit {commit_id[:12]})"


@dataclass
class _Listed:
    manifests: list[str]
    partitions: _PartitionColumns
    first: Entry | None = None


def _write_manifests(
    spark: SparkSession, ref: Ref, base: str, exact: Entry | None, directory: Path
) -> _Listed:
    """Stream the ref's entries into manifest files, `MANIFEST_ROWS` at a time, each added
    to the Spark context; partition columns and their types are worked out on the way."""
    listed = _Listed([], _PartitionColumns())
    namespace = ref.repository.storage_namespace
    entries = iter([exact]) if exact is not None else ref.list(prefix=base)
    rows = _ManifestRows()
    for entry in entries:
        relative = entry.path[len(base) :]
        if _hidden(relative):
            continue
        values = listed.partitions.add(relative, entry.path)
        listed.first = listed.first or entry
        rows.add(entry, _location(namespace, entry.address), values)
        if len(rows) == MANIFEST_ROWS:
            listed.manifests.append(rows.write(spark, directory))
            rows = _ManifestRows()
    if len(rows):
        listed.manifests.append(rows.write(spark, directory))
    return listed


def _hidden(relative: str) -> bool:
    """Spark's rule for files and folders it does not read (`_SUCCESS`, `.crc` files)."""
    return any(
        (part.startswith("_") and "=" not in part) or part.startswith(".")
        for part in relative.split("/")
    )


def _location(namespace: str, address: str) -> tuple[str, str]:
    """The object store URL and key of an entry's object: the namespace and the address,
    or for an imported object (whose address is its own URI) its bucket, or the file
    system's root, and the rest."""
    if address.startswith("file:///"):
        return "file:///", address[len("file:///") :]
    if address.startswith("s3://"):
        bucket, _, key = address[len("s3://") :].partition("/")
        return f"s3://{bucket}", key
    return namespace.rstrip("/"), address


class _ManifestRows:
    def __init__(self) -> None:
        self.columns: dict[str, list[Any]] = {
            "path": [],
            "store": [],
            "key": [],
            "size": [],
            "checksum": [],
            "values": [],
            "imported": [],
        }

    def __len__(self) -> int:
        return len(self.columns["path"])

    def add(self, entry: Entry, location: tuple[str, str], values: list[str | None]) -> None:
        for name, value in zip(
            self.columns,
            (entry.path, *location, entry.size, entry.checksum, values, imported_version(entry)),
            strict=True,
        ):
            self.columns[name].append(value)

    def write(self, spark: SparkSession, directory: Path) -> str:
        """Write the rows as one manifest file, add it to the Spark context, return its name."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        name = f"branchwater-manifest-{uuid.uuid4().hex}.parquet"
        table = pa.table(
            {
                "path": pa.array(self.columns["path"], pa.string()),
                "store": pa.array(self.columns["store"], pa.string()),
                "key": pa.array(self.columns["key"], pa.string()),
                "size": pa.array(self.columns["size"], pa.int64()),
                "checksum": pa.array(self.columns["checksum"], pa.string()),
                "values": pa.array(self.columns["values"], pa.list_(pa.string())),
                "imported": pa.array(self.columns["imported"], pa.string()),
            }
        )
        pq.write_table(table, directory / name, row_group_size=MANIFEST_ROW_GROUP)
        spark.sparkContext.addFile(str(directory / name))
        return name


class _PartitionColumns:
    """Hive-style partition columns of the files seen so far, and each column's type."""

    def __init__(self) -> None:
        self.names: tuple[str, ...] | None = None
        self.example = ""
        self.kinds: list[str] = []

    def add(self, relative: str, path: str) -> list[str | None]:
        folders = relative.split("/")[:-1]
        pairs: list[tuple[str, str]] = []
        for folder in reversed(folders):
            match = _PARTITION_DIR.fullmatch(folder)
            if match is None:
                break
            pairs.insert(0, (unquote(match[1]), unquote(match[2])))
        names = tuple(name for name, _ in pairs)
        if self.names is None:
            self.names, self.example = names, path
            self.kinds = ["null"] * len(names)
        elif names != self.names:
            raise InvalidArgument(
                f"conflicting partition folders: {self.example!r} has partition columns "
                f"{list(self.names)}, {path!r} has {list(names)}; read a prefix whose files "
                "all lie at the same depth of k=v folders"
            )
        values = [None if value == DEFAULT_PARTITION else value for _, value in pairs]
        self.kinds = [_wider(kind, _kind(v)) for kind, v in zip(self.kinds, values, strict=True)]
        return values

    def types(self) -> Iterator[tuple[str, str]]:
        for name, kind in zip(self.names or (), self.kinds, strict=True):
            yield name, "string" if kind == "null" else kind


def _kind(value: str | None) -> str:
    """The type Spark's partition discovery gives one value: int, long, double, date,
    string (or none yet, for a null). Typed by `_parsed`, as each task reads it back."""
    if value is None:
        return "null"
    return next((kind for kind in _KINDS if _parsed(value, kind) is not None), "string")


def _parsed(value: str, kind: str) -> int | float | datetime.date | str | None:
    """`value` as a column of `kind` holds it, None if it is not one. Numbers are ASCII
    digits with an optional sign, point and exponent, or `NaN`/`Infinity`, as Java parses
    them for Spark; what Java takes besides (spaces around, a `d`/`f` suffix, hexadecimal,
    digits of other scripts), or Python's `int`/`float` (`1_000`, `nan`), stays a string,
    as does an integer beyond bigint (Spark's `decimal`), which a double would round."""
    if kind in ("int", "long"):
        bits = 31 if kind == "int" else 63
        if _INTEGER.fullmatch(value) is None:
            return None
        try:
            number = int(value)
        except ValueError:  # more digits than Python converts
            return None
        return number if -(2**bits) <= number < 2**bits else None
    if kind == "double":
        whole = _INTEGER.fullmatch(value) is not None
        if _DECIMAL.fullmatch(value) is None or (whole and _parsed(value, "long") is None):
            return None
        return float(value)
    if kind == "date":
        if _DATE.fullmatch(value) is None:
            return None
        try:
            return datetime.date.fromisoformat(value)
        except ValueError:
            return None
    return value


def _wider(left: str, right: str) -> str:
    if left == "null" or left == right:
        return right
    if right == "null":
        return left
    if left in _WIDER and right in _WIDER:
        return _WIDER[max(_WIDER.index(left), _WIDER.index(right))]
    return "string"


def _data_schema(
    spark: SparkSession,
    ref: Ref,
    first: Entry,
    file_format: ds.FileFormat,
    schema: StructType | str | None,
) -> pa.Schema:
    """The given schema, else the first file's, read through `Ref.open` (a Parquet footer
    costs ranged reads of its end only)."""
    if schema is not None:
        return _arrow_schema(spark, schema)
    with ref.open(first.path, verify=False) as f:
        try:
            found = file_format.inspect(f)
        except Exception as exc:
            raise CorruptedData(
                f"cannot read the schema of {first.path!r} at {_ref_label(ref)} as "
                f"{file_format.default_extname or 'the given format'}: {exc}"
            ) from None
    return _spark_compatible(found)


def _arrow_schema(spark: SparkSession, schema: StructType | str) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    try:
        struct = schema if isinstance(schema, StructType) else StructType.fromDDL(schema)
    except Exception as exc:
        raise InvalidArgument(
            f"schema {schema!r} is not a DDL string Spark parses: {exc}"
        ) from None
    if not isinstance(struct, StructType):
        raise InvalidArgument(f"schema {schema!r} is not a struct of columns")
    return to_arrow_schema(struct, timezone="UTC")


def _spark_compatible(schema: pa.Schema) -> pa.Schema:
    """A file's schema in types Spark has: unsigned integers widened as Spark's Parquet
    reader widens them, dictionaries decoded, large variants made plain."""
    import pyarrow as pa

    return pa.schema([field.with_type(_compatible(field.type)) for field in schema])


def _compatible(t: pa.DataType) -> pa.DataType:
    import pyarrow as pa

    widened = {pa.uint8(): pa.int16(), pa.uint16(): pa.int32(), pa.uint32(): pa.int64()}
    if t in widened:
        return widened[t]
    if t == pa.uint64():
        return pa.decimal128(20, 0)
    if pa.types.is_dictionary(t):
        return _compatible(t.value_type)
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_large_list(t) or pa.types.is_list(t):
        return pa.list_(_compatible(t.value_type))
    if pa.types.is_struct(t):
        return pa.struct([f.with_type(_compatible(f.type)) for f in t])
    if pa.types.is_timestamp(t) and t.unit == "ns":
        return pa.timestamp("us", t.tz)
    return t


def _output_schema(
    spark: SparkSession, data: pa.Schema, partitions: Sequence[tuple[str, str]]
) -> pa.Schema:
    """The rows' Arrow schema as Spark expects them back from `mapInArrow`: data columns,
    then partition columns (a partition column replaces a data column of its name)."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

    names = {name for name, _ in partitions}
    fields = [f for f in data if f.name not in names]
    fields += [pa.field(name, _partition_type(kind)) for name, kind in partitions]
    struct = from_arrow_schema(pa.schema(fields))
    large = spark.conf.get("spark.sql.execution.arrow.useLargeVarTypes", "false") == "true"
    return to_arrow_schema(struct, timezone="UTC", prefers_large_types=large)


def _partition_type(kind: str) -> pa.DataType:
    import pyarrow as pa

    types = {"int": pa.int32(), "long": pa.int64(), "double": pa.float64(), "date": pa.date32()}
    return types.get(kind, pa.string())


def _splits(file_format: ds.FileFormat) -> bool:
    """Whether a file larger than the split size is read in byte ranges: Parquet only,
    whose row groups a range can select; other formats are read whole by one task."""
    import pyarrow.dataset as ds

    return isinstance(file_format, ds.ParquetFileFormat)


def _slices(
    spark: SparkSession,
    directory: Path,
    manifests: Sequence[str],
    max_bytes: int,
    open_cost: int,
    split: bool = False,
) -> Iterator[Slice]:
    """Pack the files into Spark partitions in listing order, as `spark.read` sizes them:
    up to `maxSplitBytes`, each file counting `openCostInBytes` more than its size; with
    `split`, a file larger than `maxSplitBytes` counts as pieces of that size. Reads the
    manifests' size column back, one file at a time."""
    import pyarrow.parquet as pq

    sizes = [pq.read_table(directory / m, columns=["size"]).column(0) for m in manifests]
    total = sum(int(s.to_numpy().sum()) + open_cost * len(s) for s in sizes)
    per_core = total // max(1, spark.sparkContext.defaultParallelism)
    limit = max(1, min(max_bytes, max(open_cost, per_core)))
    for name, column in zip(manifests, sizes, strict=True):
        first: _Piece | None = None
        last: _Piece | None = None
        filled = 0
        for piece in _pieces(column.to_numpy(), limit if split else None):
            cost = piece.length + open_cost
            if last is not None and (filled + cost > limit or piece.row == last.row):
                yield _slice(name, first or last, last)
                first, filled = None, 0
            first, last = first or piece, piece
            filled += cost
        if last is not None:
            yield _slice(name, first or last, last)


def _pieces(sizes: Sequence[int], limit: int | None) -> Iterator[_Piece]:
    """Each file whole, or with a `limit`, cut in ranges of `limit` bytes as Spark cuts a
    splittable file (the first range open below, the last open above: `_row_groups`)."""
    for row, value in enumerate(sizes):
        size = int(value)
        if limit is None or size <= limit:
            yield _Piece(row, 0, None, size)
            continue
        for begin in range(0, size, limit):
            end = begin + limit
            yield _Piece(row, begin, end if end < size else None, min(limit, size - begin))


def _slice(manifest: str, first: _Piece, last: _Piece) -> Slice:
    return Slice(manifest, first.row, last.row + 1, first.begin, last.end)


def _split_settings(spark: SparkSession) -> tuple[int, int]:
    """`maxPartitionBytes` and `openCostInBytes` in bytes. A split size below 1 is refused:
    it would cut a file into one piece per byte, each a slice the driver holds."""

    def size(key: str, default: str, least: int) -> int:
        value = str(spark.conf.get(key, default)).strip().lower()
        units = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
        try:
            unit = value[-2] if value.endswith("b") and len(value) > 1 else value[-1]
            if unit in units:
                number = int(float(value.rstrip("b")[:-1]) * units[unit])
            else:
                number = int(value.rstrip("b"))
        except (IndexError, ValueError):
            number = least - 1
        if number < least:
            raise InvalidArgument(
                f"{key}={value!r} is not a size of at least {least} byte(s) "
                "(a number of bytes, or with a unit: 128m, 4m, 1g)"
            )
        return number

    return (
        size("spark.sql.files.maxPartitionBytes", "128m", 1),
        size("spark.sql.files.openCostInBytes", "4m", 0),
    )


def _read_slices(batches: Iterator[pa.RecordBatch], *, plan: ReadPlan) -> Iterator[pa.RecordBatch]:
    """Runs in a Spark task: read the files of the slices whose numbers come in."""
    for batch in batches:
        for number in batch.column(0).to_pylist():
            yield from _read_slice(plan, plan.slices[number])


def _read_slice(plan: ReadPlan, part: Slice) -> Iterator[pa.RecordBatch]:
    import pyarrow.parquet as pq
    from pyspark import SparkFiles

    manifest = pq.ParquetFile(SparkFiles.get(part.manifest))
    groups: list[int] = []
    first = offset = 0
    for group in range(manifest.num_row_groups):
        stop = first + manifest.metadata.row_group(group).num_rows
        if first < part.stop and stop > part.start:
            offset = offset if groups else part.start - first
            groups.append(group)
        first = stop
    rows = manifest.read_row_groups(groups).slice(offset, part.stop - part.start)
    last = part.stop - part.start - 1
    for number, row in enumerate(rows.to_pylist()):
        store = shared_object_store(row["store"], **plan.s3_options)
        span = (part.head if number == 0 else 0, part.tail if number == last else None)
        yield from _read_file(plan, store, row, span)


def _read_file(
    plan: ReadPlan,
    store: ObjectStore,
    row: Mapping[str, Any],
    span: tuple[int, int | None] = (0, None),
) -> Iterator[pa.RecordBatch]:
    """One file's rows in the output schema, its partition values as constant columns; a
    missing or unreadable object fails the task naming the path and the ref. A `span`
    other than the whole file (a range of a Parquet file) reads its row groups only."""
    import pyarrow as pa

    where = store.uri(row["key"])
    scalars = _partition_scalars(plan, row)
    try:
        with _opened(plan, store, row, span) as source:
            fragment = plan.file_format.make_fragment(source)
            if span != (0, None):
                groups = _row_groups(fragment.metadata, *span)
                if not groups:
                    return
                fragment = fragment.subset(row_group_ids=groups)
            names = [f.name for f in plan.data_schema]
            for batch in fragment.to_batches(schema=plan.data_schema, columns=names):
                columns = {name: batch.column(name) for name in names}
                for name, scalar in scalars.items():
                    columns[name] = pa.repeat(scalar, batch.num_rows)
                arrays = [columns[f.name].cast(f.type) for f in plan.output_schema]
                yield pa.RecordBatch.from_arrays(arrays, schema=plan.output_schema)
    except NotFound:
        raise NotFound(
            f"object {row['path']!r} under {plan.where} is missing from storage at "
            f"{where}: deleted since the read was planned (a branch's object "
            "removed and collected by GC)"
        ) from None
    except CorruptedData as exc:
        raise CorruptedData(
            f"cannot read object {row['path']!r} under {plan.where} at {where}: {exc}"
        ) from None
    except BranchwaterError:
        raise
    except (OSError, pa.ArrowException) as exc:
        raise CorruptedData(
            f"cannot read object {row['path']!r} under {plan.where} at {where}: {exc}"
        ) from None


@contextlib.contextmanager
def _opened(
    plan: ReadPlan, store: ObjectStore, row: Mapping[str, Any], span: tuple[int, int | None]
) -> Iterator[Any]:
    """A pyarrow source over the file: its bytes from one GET where the whole of a small file
    is read (`ReadPlan.read_whole`), else the store's file object for ranged reads. Either is
    held to its entry as `Ref.open` holds it (`verified`): a size other than the entry's is
    `CorruptedData` at once, an end reached early or passed while reading too, and a
    checksum the engine can recompute is checked once every byte has been read (a whole
    read always; a ranged one that reads the file through). An imported object is opened
    as `Ref.open` opens it (`open_source`): held to the version its import recorded, so an
    object rewritten at its source, before or while it is read, is `CorruptedData`, not
    the commit's content."""
    import pyarrow as pa

    whole = span == (0, None) and row["size"] <= plan.read_whole
    imported = row.get("imported")
    entry = _entry(row)
    if imported is None and whole:
        with verified(io.BytesIO(store.get(row["key"])), entry, _rewritten) as f:
            yield pa.BufferReader(f.read())
        return
    key = row["key"]
    with (
        store.open(key) if imported is None else open_source(store, key, imported) as f,
        verified(cast(BinaryIO, _unbuffered(f)), entry, _rewritten) as checked,
    ):
        if whole:
            yield pa.BufferReader(checked.read())
        else:
            yield pa.PythonFile(_unbuffered(checked), mode="r")


_UNRECORDED = datetime.datetime.fromtimestamp(0, datetime.timezone.utc)
"""The modification time of an entry a task rebuilds from its manifest row, which does not
carry it: `verified` holds an object to its entry's size and checksum alone."""


def _entry(row: Mapping[str, Any]) -> Entry:
    """The entry a manifest row was listed from, as far as a read checks an object by it."""
    return Entry(row["path"], row["key"], row["size"], row["checksum"], _UNRECORDED)


def _rewritten(mismatch: str) -> CorruptedData:
    """`_read_file` names the object, the ref and where it is stored around this."""
    return CorruptedData(f"it was truncated or rewritten in storage: {mismatch}")


def _row_groups(metadata: pq.FileMetaData, begin: int, end: int | None) -> list[int]:
    """The row groups of a file range, by Spark's rule (parquet-mr's midpoint filter): a
    group belongs to the range its bytes' midpoint lies in, so each is read by exactly one
    of the file's ranges, and a range holding no midpoint reads nothing. The first range is
    open below and the last open above (`_pieces`), so a group a hostile footer places
    outside the file is still read once, and fails there."""
    chosen = []
    for number in range(metadata.num_row_groups):
        group = metadata.row_group(number)
        midpoint = 0
        if group.num_columns:
            chunk = group.column(0)
            start = chunk.data_page_offset
            dictionary = chunk.dictionary_page_offset
            if chunk.has_dictionary_page and dictionary and 0 < dictionary < start:
                start = dictionary
            size = sum(group.column(c).total_compressed_size for c in range(group.num_columns))
            midpoint = start + size // 2
        if (begin == 0 or midpoint >= begin) and (end is None or midpoint < end):
            chosen.append(number)
    return chosen


def _unbuffered(f: BinaryIO) -> io.RawIOBase | BinaryIO:
    """The store's file object without its read-ahead: pyarrow asks for whole footers and
    column chunks (coalesced), so a read-ahead would only fetch columns it skips."""
    raw = getattr(f, "raw", None)
    return raw if isinstance(raw, io.RawIOBase) else f


def _typed(value: str | None, kind: pa.DataType) -> pa.Scalar:
    """`value` as a partition column of `kind` (a type `_partition_type` gives) holds it,
    parsed by the rule `_kind` typed it by: Arrow's cast refuses some of what that rule
    takes (a sign, `NaN`)."""
    import pyarrow as pa

    if value is None:
        return pa.scalar(None, kind)
    name = next((k for k in _KINDS if _partition_type(k) == kind), "string")
    parsed = _parsed(value, name)
    if parsed is None:
        raise InvalidArgument(
            f"partition value {value!r} is not a {name}, the type the driver gave its column "
            "(do the executors run the driver's version of branchwater?)"
        )
    return pa.scalar(parsed, kind)


def _partition_scalars(plan: ReadPlan, row: Mapping[str, Any]) -> dict[str, pa.Scalar]:
    """The file's partition values, typed before its bytes are read: a value its type
    refuses is the plan's fault, never the file's (not `CorruptedData`)."""
    scalars = {}
    for (name, _), value in zip(plan.partition_types, row["values"], strict=True):
        try:
            scalars[name] = _typed(value, plan.output_schema.field(name).type)
        except InvalidArgument as exc:
            raise InvalidArgument(f"object {row['path']!r} under {plan.where}: {exc}") from None
    return scalars


_REMOVE_AT_EXIT: list[Path] = []
_SCOPE: contextvars.ContextVar[list[Path] | None] = contextvars.ContextVar(
    "branchwater_reader_scope", default=None
)


@contextlib.contextmanager
def manifest_scope() -> Iterator[None]:
    """Remove the manifests of every read made inside the block when it ends.

    A frame is lazy: Spark reads its manifests whenever it (or a frame derived from it) is
    evaluated, and an executor that joins later fetches them from the driver then. So the
    reader cannot tell when they are no longer needed, and by default keeps them until the
    process exits. A long-lived driver (a service, a notebook) that reads many times wraps
    each unit of work in `with manifest_scope():` and evaluates its frames inside it; a
    frame evaluated after its scope ended is not supported (its tasks may not find their
    manifests). Scopes nest: each removes the reads made in it, not in an outer one."""
    directories: list[Path] = []
    token = _SCOPE.set(directories)
    try:
        yield
    finally:
        _SCOPE.reset(token)
        for directory in directories:
            shutil.rmtree(directory, ignore_errors=True)


@atexit.register
def _remove_manifests() -> None:
    """Manifests live as long as the process, as long as a frame may be evaluated again."""
    for directory in _REMOVE_AT_EXIT:
        shutil.rmtree(directory, ignore_errors=True)
