"""A repository's storage namespace as the driver and the executors of a GC job see it.

`Namespace` is a small picklable value (the namespace URL and S3 options) that every
executor turns into its own clients, cached per process: pyarrow file systems for listing
and reading Parquet (its C++ listing is fast, and it lists "directories" on S3 too), and
the engine's object store for writes (atomic puts) and deletes (S3 DeleteObjects, 1,000 keys
a call). This Spark has no `s3a` jars, so nothing here depends on Hadoop's file systems; a
cluster that has them may still read Parquet with Spark's own reader (`spark_path`).
"""

from __future__ import annotations

import io
import json
import os
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from stat import S_ISREG
from typing import Any
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from branchwater.engine.errors import ConfigurationError, NotFound
from branchwater.engine.gc.prepare import CODEC
from branchwater.engine.objects import ObjectStore, open_object_store

_CLIENTS: dict[Namespace, tuple[pafs.FileSystem, str, ObjectStore]] = {}
_CLIENTS_LOCK = threading.Lock()


@dataclass(frozen=True)
class Listing:
    """One directory level: its files (name, size, mtime in epoch nanoseconds, as the file
    system gives it: no datetime per object) and its subdirectories. A listing without
    metadata has None for sizes and times."""

    names: list[str]
    sizes: list[int] | None
    mtimes_ns: list[int] | None
    directories: list[str]


@dataclass(frozen=True)
class Namespace:
    """A storage namespace (`file:///…` or `s3://bucket/prefix`) and its S3 options."""

    url: str
    s3_options: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, url: str, s3_options: Mapping[str, str | None] | None = None) -> Namespace:
        options = tuple(sorted((k, v) for k, v in (s3_options or {}).items() if v))
        return cls(url.rstrip("/"), options)

    @property
    def scheme(self) -> str:
        return urlsplit(self.url).scheme

    def _clients(self) -> tuple[pafs.FileSystem, str, ObjectStore]:
        with _CLIENTS_LOCK:
            clients = _CLIENTS.get(self)
            if clients is None:
                filesystem, root = _filesystem(self.url, dict(self.s3_options))
                clients = (filesystem, root, open_object_store(self.url, **dict(self.s3_options)))
                _CLIENTS[self] = clients
            return clients

    @property
    def store(self) -> ObjectStore:
        return self._clients()[2]

    def fs_path(self, key: str) -> str:
        _, root, _ = self._clients()
        return f"{root}/{key}" if key else root

    def list_dir(self, prefix: str, *, metadata: bool = True) -> Listing:
        """Files and subdirectories directly under `prefix` (a key ending without `/`).

        `metadata=False` lets a local file system skip a `stat` per file (most of a local
        listing's time); object stores list sizes and times anyway and always give them."""
        filesystem, _, _ = self._clients()
        if isinstance(filesystem, pafs.LocalFileSystem):
            return _list_local(self.fs_path(prefix), metadata)
        selector = pafs.FileSelector(self.fs_path(prefix), allow_not_found=True)
        names: list[str] = []
        sizes: list[int] = []
        mtimes: list[int] = []
        directories: list[str] = []
        file, directory = pafs.FileType.File, pafs.FileType.Directory
        for info in filesystem.get_file_info(selector):
            kind = info.type
            if kind == file:
                names.append(info.base_name)
                sizes.append(info.size)
                mtimes.append(info.mtime_ns)
            elif kind == directory:
                directories.append(info.base_name)
        return Listing(names, sizes, mtimes, directories)

    def stat(self, keys: list[str]) -> tuple[list[int | None], list[int | None]]:
        """Sizes and modification times (epoch nanoseconds) of objects, None where gone or
        where the key names no file (a folder, say), on either kind of store."""
        filesystem, root, _ = self._clients()
        sizes: list[int | None] = []
        mtimes: list[int | None] = []
        if isinstance(filesystem, pafs.LocalFileSystem):
            for key in keys:
                try:
                    info = os.stat(f"{root}/{key}")
                except FileNotFoundError:
                    info = None
                if info is None or not S_ISREG(info.st_mode):
                    sizes.append(None)
                    mtimes.append(None)
                else:
                    sizes.append(info.st_size)
                    mtimes.append(info.st_mtime_ns)
            return sizes, mtimes
        for found in filesystem.get_file_info([self.fs_path(key) for key in keys]):
            present = found.type == pafs.FileType.File
            sizes.append(found.size if present else None)
            mtimes.append(found.mtime_ns if present else None)
        return sizes, mtimes

    def read_parquet(self, key: str, columns: list[str] | None = None) -> pa.Table:
        filesystem, _, _ = self._clients()
        return pq.read_table(self.fs_path(key), columns=columns, filesystem=filesystem)

    def read_parquet_files(self, keys: list[str], columns: list[str]) -> Iterator[pa.RecordBatch]:
        """The columns of many Parquet files of one schema (the first file's), read by
        Arrow's own threads: on S3 the reads overlap instead of waiting one after another,
        and no file is looked up before it is read."""
        if not keys:
            return iter(())
        return self._dataset(keys).to_batches(columns=columns, use_threads=True)

    def read_table(self, keys: list[str], schema: pa.Schema) -> pa.Table:
        """`read_parquet_files` as one table of `schema` (empty without files)."""
        batches = list(self.read_parquet_files(keys, schema.names))
        return pa.Table.from_batches(batches).cast(schema) if batches else schema.empty_table()

    def parquet_rows(self, keys: list[str]) -> int:
        """How many rows Parquet files hold, from their footers."""
        return self._dataset(keys).count_rows() if keys else 0

    def _dataset(self, keys: list[str]) -> ds.FileSystemDataset:
        filesystem, _, _ = self._clients()
        paths = [self.fs_path(key) for key in keys]
        schema = pq.read_schema(paths[0], filesystem=filesystem)
        return ds.FileSystemDataset.from_paths(
            paths, schema=schema, format=ds.ParquetFileFormat(), filesystem=filesystem
        )

    def write_parquet(self, key: str, table: pa.Table) -> int:
        """Write a whole Parquet file with one atomic put; returns its size in bytes."""
        sink = io.BytesIO()
        pq.write_table(table, sink, compression=CODEC)
        data = sink.getvalue()
        self.store.put(key, data)
        return len(data)

    def folder_keys(self, prefix: str) -> list[str]:
        """The keys of every object under `prefix` (a key without its trailing `/`)."""
        return [info.key for info in self.store.list_objects(f"{prefix}/")]

    def delete_folder(self, prefix: str) -> None:
        self.store.delete(self.folder_keys(prefix))

    def put_json(self, key: str, document: Any) -> None:
        self.store.put(key, json.dumps(document, indent=1, sort_keys=True, default=str).encode())

    def get_json(self, key: str) -> Any:
        return json.loads(self.store.get(key))

    def exists(self, key: str) -> bool:
        return self.store.exists(key)

    def uri(self, key: str) -> str:
        return self.store.uri(key)

    def spark_path(self, key: str, s3a: bool) -> str | None:
        """The path Spark's own Parquet reader takes, or None where it cannot read."""
        if self.scheme == "file":
            return self.uri(key)
        if self.scheme == "s3" and s3a:
            return "s3a" + self.uri(key)[2:]
        return None


def _list_local(path: str, metadata: bool) -> Listing:
    """A local directory through `os.scandir`: pyarrow's listing without a Python object
    per entry, and without a `stat` per file unless asked (the entry's type is known
    without one on the usual file systems)."""
    names: list[str] = []
    sizes: list[int] = []
    mtimes: list[int] = []
    directories: list[str] = []
    try:
        entries = os.scandir(path)
    except FileNotFoundError:
        return Listing(names, sizes, mtimes, directories)
    with entries:
        for entry in entries:
            if entry.is_dir():
                directories.append(entry.name)
            elif entry.is_file():
                names.append(entry.name)
                if metadata:
                    info = entry.stat()
                    sizes.append(info.st_size)
                    mtimes.append(info.st_mtime_ns)
    if not metadata:
        return Listing(names, None, None, directories)
    return Listing(names, sizes, mtimes, directories)


def _filesystem(url: str, s3_options: dict[str, str]) -> tuple[pafs.FileSystem, str]:
    parts = urlsplit(url)
    if parts.scheme == "file":
        return pafs.LocalFileSystem(), unquote(parts.path).rstrip("/")
    if parts.scheme == "s3":
        return _s3_filesystem(s3_options), f"{parts.netloc}{parts.path}".rstrip("/")
    raise ConfigurationError(f"GC cannot list {url!r}: only file:// and s3:// namespaces")


def _s3_filesystem(options: dict[str, str]) -> pafs.S3FileSystem:
    """pyarrow's S3 client from the engine's S3 options (boto3 names); without options it
    takes the usual AWS environment, as boto3 does, `AWS_ENDPOINT_URL` included (pyarrow
    itself ignores that one: executors of a cluster whose nodes point there need it)."""
    kwargs: dict[str, Any] = {
        "access_key": options.get("aws_access_key_id"),
        "secret_key": options.get("aws_secret_access_key"),
        "session_token": options.get("aws_session_token"),
        "region": options.get("region_name"),
    }
    endpoint = (
        options.get("endpoint_url")
        or os.environ.get("AWS_ENDPOINT_URL_S3")
        or os.environ.get("AWS_ENDPOINT_URL")
    )
    if endpoint:
        parts = urlsplit(endpoint)
        kwargs["endpoint_override"] = parts.netloc or parts.path
        kwargs["scheme"] = parts.scheme or "https"
    return pafs.S3FileSystem(**{k: v for k, v in kwargs.items() if v is not None})


def missing_ok_json(ns: Namespace, key: str) -> Any | None:
    """A JSON document, or None when absent."""
    try:
        return ns.get_json(key)
    except NotFound:
        return None
