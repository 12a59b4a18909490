"""The back end a benchmark module runs on, chosen in one place: `embedded` (SQLite + local
files, `make bench`) or `stack` (PostgreSQL on the local server + SeaweedFS's S3 gateway, as
`make stack` runs them; `make bench BACKEND=stack`), from `BENCH_BACKEND`
(`results.backend()`, which the runner sets).

`open_backend(root)` gives a module a `Backend`: the KV URL, storage namespaces and S3
options to open a lake with, a bulk load straight into the KV table (what a benchmark
measures is never the staging), and the raw operations floors are made of on the same back
end: the driver's own SQL, and the object library's own PUT and GET. On the stack each use
gets a private database, dropped on the way out, and a SeaweedFS server of its own (stopped
by its pid) unless it is handed one; Spark stays local on both. Every `BENCH` line ends with
`backend.label` (`backend=<name>`), which the runner records it under.
"""

from __future__ import annotations

import io
import os
import sqlite3
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from branchwater.engine.api import Lake
from branchwater.engine.kv.sql import DEFAULT_TABLE
from branchwater.engine.objects import ObjectStore, open_object_store
from branchwater.stack.seaweedfs import S3Server
from tests.benchmarks.results import BACKENDS as NAMED
from tests.benchmarks.results import DEFAULT_BACKEND, backend
from tests.helpers.servers import PG_HOST, PG_PORT, PG_USER, private_database, unique_name

EMBEDDED, STACK = DEFAULT_BACKEND, "stack"
BACKENDS = tuple(NAMED)
KVRow = tuple[bytes, bytes, bytes]
"""A KV row as the table holds it: partition key, key, value."""
PUTS_IN_FLIGHT = 16
"""Objects a bulk load PUTs at once: setup, not a figure."""


@dataclass(frozen=True)
class Backend:
    """Where one benchmark's lake lives; picklable, so spawned workers open the same one.
    `root` is local scratch on both (the SQLite file, range caches, Spark's files); object
    keys given to the floor helpers are relative to the object root (`root` on local files,
    the bucket on S3), so `namespace(name)`'s objects are under `name/`."""

    name: str
    root: Path
    kv_url: str
    server: S3Server | None = None
    bucket: str | None = None

    @property
    def label(self) -> str:
        return f"backend={self.name}"

    @property
    def s3_options(self) -> dict[str, str]:
        return self.server.options if self.server else {}

    @property
    def db(self) -> Path:
        """The embedded back end's SQLite file."""
        return self.root / "lake.db"

    def namespace(self, name: str) -> str:
        if self.server is None:
            return f"file://{self.root}/{name}"
        return f"s3://{self.bucket}/{name}"

    def connect(self, **options: Any) -> Lake:
        return Lake.connect(self.kv_url, s3_options=self.s3_options or None, **options)

    def objects(self, name: str) -> ObjectStore:
        """The engine's object store on `namespace(name)`."""
        return open_object_store(self.namespace(name), **self.s3_options)

    # KV rows, straight through the database driver ---------------------------------------

    def stage_rows(self, rows: Iterable[KVRow]) -> None:
        """Insert or replace `rows` in the KV table in one transaction, the last of a key's
        rows winning: sqlite3's `executemany`, or a PostgreSQL `COPY` into a temporary table
        then one upsert."""
        if self.server is None:
            with sqlite3.connect(self.db) as conn:
                conn.executemany(f"INSERT OR REPLACE INTO {DEFAULT_TABLE} VALUES (?, ?, ?)", rows)
                conn.commit()
            return
        import psycopg

        with psycopg.connect(self.kv_url) as conn:
            conn.execute(
                "CREATE TEMPORARY TABLE staged "
                "(n bigserial, partition_key bytea, key bytea, value bytea) ON COMMIT DROP"
            )
            with conn.cursor().copy(
                "COPY staged (partition_key, key, value) FROM STDIN (FORMAT BINARY)"
            ) as copy:
                copy.set_types(["bytea", "bytea", "bytea"])
                for row in rows:
                    copy.write_row(row)
            conn.execute(
                f"INSERT INTO {DEFAULT_TABLE} (partition_key, key, value) "
                "SELECT DISTINCT ON (partition_key, key) partition_key, key, value FROM staged "
                "ORDER BY partition_key, key, n DESC "
                "ON CONFLICT (partition_key, key) DO UPDATE SET value = EXCLUDED.value"
            )

    def checkpoint(self) -> None:
        """Fold SQLite's write-ahead log into the file, so what comes next does not pay for
        it; PostgreSQL refreshes the table's statistics instead, as autovacuum would."""
        if self.server is None:
            with sqlite3.connect(self.db) as conn:
                conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
            return
        import psycopg

        with psycopg.connect(self.kv_url, autocommit=True) as conn:
            conn.execute(f"ANALYZE {DEFAULT_TABLE}")

    def scan_rows(self, partition: bytes) -> list[tuple[bytes, bytes]]:
        """One partition's (key, value) rows in key order, by the driver alone (psycopg in
        binary format, which spares decoding `bytea`'s hex text)."""
        sql = f"SELECT key, value FROM {DEFAULT_TABLE} WHERE partition_key = {{}} ORDER BY key"
        if self.server is None:
            with sqlite3.connect(self.db) as conn:
                return conn.execute(sql.format("?"), (partition,)).fetchall()
        import psycopg

        with psycopg.connect(self.kv_url) as conn:
            cursor = conn.cursor(binary=True)
            rows: list[tuple[bytes, bytes]] = cursor.execute(
                sql.format("%s"), (partition,)
            ).fetchall()
            return rows

    # Objects, straight through the object library ----------------------------------------

    def library(self) -> Any:
        """`obstore`'s store on the object root: the library floors on S3 are measured with.
        A request may take as long as the engine's may (its client's overall timeout), not
        obstore's default 30 s: 16 DeleteObjects of 1,000 keys at once outlast that on a busy
        SeaweedFS."""
        from obstore.store import LocalStore, S3Store

        if self.server is None:
            return LocalStore(self.root, mkdir=True)
        return S3Store(
            self.bucket,
            endpoint=self.server.endpoint_url,
            access_key_id=self.server.access_key,
            secret_access_key=self.server.secret_key,
            region=self.server.region,
            virtual_hosted_style_request=False,
            client_options={"allow_http": True, "timeout": timedelta(hours=1)},
        )

    def arrow_filesystem(self) -> tuple[Any, str]:
        """pyarrow's own file system on the object root, and the root as its paths begin:
        the local one on `root`, or pyarrow's S3 client on the bucket."""
        import pyarrow.fs as pafs

        if self.server is None:
            return pafs.LocalFileSystem(), str(self.root)
        scheme, host = self.server.endpoint_url.split("://", 1)
        s3 = pafs.S3FileSystem(
            access_key=self.server.access_key,
            secret_key=self.server.secret_key,
            region=self.server.region,
            scheme=scheme,
            endpoint_override=host,
            connect_timeout=30,
            request_timeout=120,
        )
        return s3, str(self.bucket)

    def write_parquet(self, key: str, table: pa.Table, **options: Any) -> None:
        """pyarrow's Parquet write of `table` to a file, or to memory and one PUT."""
        if self.server is None:
            pq.write_table(table, self.root / key, **options)
            return
        import obstore

        buffer = io.BytesIO()
        pq.write_table(table, buffer, **options)
        obstore.put(self.library(), key, buffer.getvalue())

    def read_parquet(self, key: str) -> pa.Table:
        """pyarrow reading a Parquet file, or one GET of it and pyarrow reading that."""
        if self.server is None:
            return pq.read_table(self.root / key)
        import obstore

        data = obstore.get(self.library(), key).bytes()
        return pq.read_table(pa.BufferReader(memoryview(data)))

    def uri(self, key: str) -> str:
        """`key` as a URI: a local path, or `s3://bucket/key`."""
        return f"s3://{self.bucket}/{key}" if self.server else str(self.root / key)

    def delta_options(self) -> dict[str, str]:
        """`deltalake`'s storage options for `uri`s on this back end."""
        if self.server is None:
            return {}
        return {
            "AWS_ENDPOINT_URL": self.server.endpoint_url,
            "AWS_ACCESS_KEY_ID": self.server.access_key,
            "AWS_SECRET_ACCESS_KEY": self.server.secret_key,
            "AWS_REGION": self.server.region,
            "AWS_ALLOW_HTTP": "true",
            "AWS_S3_ALLOW_UNSAFE_RENAME": "true",
        }

    def put_bytes(self, key: str, data: bytes) -> None:
        if self.server is None:
            (self.root / key).parent.mkdir(parents=True, exist_ok=True)
            (self.root / key).write_bytes(data)
            return
        import obstore

        obstore.put(self.library(), key, data)

    def put_empty(self, keys: list[str]) -> None:
        """Empty objects at `keys` (listing and deleting cost the same whatever their size):
        files, or PUTs `PUTS_IN_FLIGHT` at once."""
        if self.server is None:
            for directory in {k.rsplit("/", 1)[0] for k in keys}:
                (self.root / directory).mkdir(parents=True, exist_ok=True)
            flags = os.O_CREAT | os.O_WRONLY
            for key in keys:
                os.close(os.open(self.root / key, flags, 0o644))
            return
        import obstore

        store = self.library()
        with ThreadPoolExecutor(PUTS_IN_FLIGHT) as pool:
            for _ in pool.map(lambda k: obstore.put(store, k, b""), keys, chunksize=64):
                pass

    def keys(self, prefix: str) -> list[str]:
        """Every object key under `prefix` (a folder), sorted."""
        if self.server is None:
            base = self.root / prefix
            return sorted(str(p.relative_to(self.root)) for p in base.rglob("*") if p.is_file())
        import obstore

        listed = obstore.list(self.library(), prefix.rstrip("/") + "/", chunk_size=1000)
        return sorted(meta["path"] for batch in listed for meta in batch)


def selected() -> str:
    """The back end this process measures (`BENCH_BACKEND`), checked."""
    name = backend()
    if name not in BACKENDS:
        raise SystemExit(f"unknown back end {name!r}: use one of {', '.join(BACKENDS)}")
    return name


@contextmanager
def open_backend(root: Path, server: S3Server | None = None) -> Iterator[Backend]:
    """The selected back end for a lake under local scratch `root` (created): on the stack a
    fresh database and bucket, on `server` or a SeaweedFS of its own, removed on the way
    out."""
    root.mkdir(parents=True, exist_ok=True)
    if selected() == EMBEDDED:
        yield Backend(EMBEDDED, root, f"sqlite:///{root / 'lake.db'}?synchronous=normal")
        return
    from tests.fixtures.s3 import running_seaweedfs

    with ExitStack() as stack:
        if server is None:
            server = stack.enter_context(running_seaweedfs())
        url = stack.enter_context(postgres_database())
        bucket = unique_name("bw-bench-")
        client = server.client()
        client.create_bucket(Bucket=bucket)
        client.close()
        yield Backend(STACK, root, url, server, bucket)


@contextmanager
def postgres_database() -> Iterator[str]:
    """A new database on the local PostgreSQL server, dropped (connections and all) after."""
    with private_database("bw_bench_") as name:
        yield f"postgresql://{PG_USER}@{PG_HOST}:{PG_PORT}/{name}"
