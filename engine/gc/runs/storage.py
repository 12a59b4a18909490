"""A repository's storage namespace as the driver and the executors of a GC job see it.

`Namespace` is a small picklable value (the namespace URL and S3 options) that every
executor turns into its own object store, one per process (`shared_object_store`): the
engine's one object layer (`engine/objects`) lists, stats, reads Parquet (through its
seekable ranged reads), writes (atomic puts) and deletes (S3 DeleteObjects, 1,000 keys a
call, several calls at once).
This Spark has no `s3a` jars, so nothing here depends on Hadoop's file systems; a cluster
that has them may still read Parquet with Spark's own reader (`spark_path`).
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import pyarrow as pa
import pyarrow.parquet as pq

from branchwater.engine.errors import NotFound
from branchwater.engine.gc.prepare import CODEC
from branchwater.engine.objects import Listing, ObjectStore, shared_object_store

READERS = 8
"""Parquet files read at once: on S3 their requests overlap instead of waiting in turn."""

T = TypeVar("T")

__all__ = ["Listing", "Namespace", "missing_ok_json"]


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

    @property
    def store(self) -> ObjectStore:
        return shared_object_store(self.url, **dict(self.s3_options))

    def list_dir(self, prefix: str, *, metadata: bool = True) -> Listing:
        """Files and subdirectories directly under `prefix` (a key ending without `/`).

        `metadata=False` lets a local file system skip a `stat` per file (most of a local
        listing's time); object stores list sizes and times anyway and always give them."""
        return self.store.list_folder(prefix, metadata=metadata)

    def stat(self, keys: list[str]) -> tuple[list[int | None], list[int | None]]:
        """Sizes and modification times (epoch nanoseconds) of objects, None where gone or
        where the key names no file (a folder, say), on either kind of store."""
        found = self.store.stat_many(keys)
        return found.sizes, found.mtimes_ns

    def read_parquet(self, key: str, columns: list[str] | None = None) -> pa.Table:
        """One whole-object GET, then the columns from memory through `ParquetFile`: the
        files read here (ranges, a run's outputs) are small enough that the footer and column
        reads of a seekable file cost more round trips on S3 than the bytes they skip, and
        `read_table`'s dataset layer costs as much again as the read for one."""
        return pq.ParquetFile(pa.BufferReader(self.store.get(key))).read(columns=columns)

    def read_parquet_files(self, keys: list[str], columns: list[str]) -> Iterator[pa.RecordBatch]:
        """The columns of many Parquet files of one schema (the first file's), `READERS`
        files read at once, in order: on S3 the reads overlap instead of waiting one after
        another, and no file is looked up before it is read."""
        if not keys:
            return iter(())
        return self._batches(keys, columns)

    def _batches(self, keys: list[str], columns: list[str]) -> Iterator[pa.RecordBatch]:
        schema: pa.Schema | None = None
        for table in self.map_keys(keys, lambda key: self.read_parquet(key, columns)):
            if schema is None:
                schema = table.schema
            elif table.schema != schema:
                table = table.cast(schema)
            yield from table.to_batches()

    def read_table(self, keys: list[str], schema: pa.Schema) -> pa.Table:
        """`read_parquet_files` as one table of `schema` (empty without files)."""
        batches = list(self.read_parquet_files(keys, schema.names))
        return pa.Table.from_batches(batches).cast(schema) if batches else schema.empty_table()

    def parquet_rows(self, keys: list[str]) -> int:
        """How many rows Parquet files hold, from their footers."""
        return sum(self.map_keys(keys, self._rows))

    def _rows(self, key: str) -> int:
        with self.store.open(key) as f:
            return int(pq.ParquetFile(f).metadata.num_rows)

    def map_keys(self, keys: list[str], read: Callable[[str], T]) -> Iterator[T]:
        """`read` of each key in order, up to `READERS` at once (on S3 each is a request or
        two, which overlap instead of waiting in turn)."""
        if len(keys) <= 1:
            yield from map(read, keys)
            return
        with ThreadPoolExecutor(min(READERS, len(keys)), thread_name_prefix="bw-gc-read") as pool:
            yield from pool.map(read, keys)

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

    def delete_folder(self, prefix: str) -> list[str]:
        """Delete every object under `prefix`; return their keys."""
        keys = self.folder_keys(prefix)
        self.store.delete(keys)
        return keys

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


def missing_ok_json(ns: Namespace, key: str) -> Any | None:
    """A JSON document, or None when absent."""
    try:
        return ns.get_json(key)
    except NotFound:
        return None
