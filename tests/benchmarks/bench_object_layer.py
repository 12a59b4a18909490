"""The object layer's base library, chosen by measurement (issue 38): the chosen base against
the other two candidates on the same objects, on the selected back end (`backends`): local
files (`embedded`, where the base is Python's own `os` and `open`, what
`engine/objects/local.py` uses; the others `pyarrow.fs` and obstore) or SeaweedFS's S3
server (`stack`, where the base is obstore, what `engine/objects/s3.py` uses; the others
boto3 and `pyarrow.fs`).

Each library is used alone, as its documentation shows, from the same thread pool where
requests are independent.

- `object-layer-put|get|range|list|delete`: `--small` objects of 1 KiB written, read back,
  read by 4 KiB ranges of one 16 MiB object, listed with sizes and mtimes under a prefix,
  and deleted in bulk (boto3: DeleteObjects batches of 1,000 in parallel; obstore: its bulk
  delete; pyarrow.fs has no bulk delete of given keys, so one `delete_file` per key from the
  pool). The median of `--rounds`, the libraries' order rotated each round.
- `object-layer-large-put|large-get`: one `--large-mb` object streamed from a local file and
  back (boto3's managed transfer, pyarrow's output/input streams, obstore's multipart put and
  streamed get), each in a child process that reports its peak RSS.

`ratio` is the base over the best of the other two: below 1 the base wins.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import resource
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from pathlib import Path
from typing import Any, Protocol

from branchwater.stack.seaweedfs import S3Server
from tests.benchmarks.backends import Backend, open_backend
from tests.benchmarks.declarations import Benchmark, Suite

_WHAT = {
    "put": "writing many 1 KiB objects",
    "get": "reading them back",
    "range": "4 KiB ranged reads of one 16 MiB object",
    "list": "listing them with sizes and mtimes under a prefix",
    "delete": "deleting them in bulk",
    "large-put": "streaming one large object from a local file",
    "large-get": "streaming it back",
}
BENCHMARKS = Suite(
    section="Object layer",
    about=(
        "The base library of `engine/objects` (Python's `os` on local files, obstore on S3) "
        "against the other two candidates, each used alone on the same objects; the table "
        "and the choice are in the "
        "[object layer's design](design/objects.md#one-object-layer-chosen-by-measurement)."
    ),
    benchmarks=tuple(
        Benchmark(
            f"object-layer-{op}",
            measures=f"{what} with the base library",
            reference="the faster of the other two doing the same (`pyarrow.fs` and obstore "
            "on local files, boto3 and `pyarrow.fs` on S3)",
        )
        for op, what in _WHAT.items()
    ),
)

SMALL_SIZE = 1 << 10
RANGE_OBJECT = 16 << 20
RANGE_SIZE = 4 << 10
CHUNK = 8 << 20
THREADS = 16
DELETE_BATCH = 1000
OPS = ("put", "get", "range", "list", "delete")
LIBRARIES = {"embedded": ("os", "pyarrow", "obstore"), "stack": ("obstore", "boto3", "pyarrow")}
"""Each back end's libraries, its base first."""


class Driver(Protocol):
    def put(self, key: str, data: bytes) -> None: ...
    def get(self, key: str) -> bytes: ...
    def get_range(self, key: str, start: int, length: int) -> bytes: ...
    def count(self, prefix: str) -> int: ...
    def delete(self, keys: list[str]) -> None: ...
    def put_file(self, key: str, path: str) -> None: ...
    def get_stream(self, key: str) -> int: ...


class Boto3Driver:
    def __init__(self, server: S3Server, bucket: str) -> None:
        import boto3
        from botocore.config import Config

        self.client = boto3.session.Session().client(
            "s3", config=Config(max_pool_connections=THREADS), **server.options
        )
        self.bucket = bucket

    def put(self, key: str, data: bytes) -> None:
        self.client.put_object(Bucket=self.bucket, Key=key, Body=data)

    def get(self, key: str) -> bytes:
        body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"]
        with body:
            data: bytes = body.read()
        return data

    def get_range(self, key: str, start: int, length: int) -> bytes:
        wanted = f"bytes={start}-{start + length - 1}"
        body = self.client.get_object(Bucket=self.bucket, Key=key, Range=wanted)["Body"]
        with body:
            data: bytes = body.read()
        return data

    def count(self, prefix: str) -> int:
        paginator = self.client.get_paginator("list_objects_v2")
        count = 0
        for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
            for obj in page.get("Contents", ()):
                if not obj["Key"].endswith("/"):
                    count += obj["Size"] >= 0 and obj["LastModified"] is not None
        return count

    def delete(self, keys: list[str]) -> None:
        remaining: Iterator[str] = iter(keys)
        batches = iter(lambda: list(islice(remaining, DELETE_BATCH)), [])

        def one(batch: list[str]) -> None:
            request = {"Objects": [{"Key": k} for k in batch], "Quiet": True}
            response = self.client.delete_objects(Bucket=self.bucket, Delete=request)
            assert not response.get("Errors"), response["Errors"][:1]

        with ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(one, batches))

    def put_file(self, key: str, path: str) -> None:
        self.client.upload_file(path, self.bucket, key)

    def get_stream(self, key: str) -> int:
        body = self.client.get_object(Bucket=self.bucket, Key=key)["Body"]
        with body:
            return sum(len(chunk) for chunk in body.iter_chunks(CHUNK))


class OsDriver:
    def __init__(self, root: str) -> None:
        self.root = Path(root)

    def put(self, key: str, data: bytes) -> None:
        path = self.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)

    def get(self, key: str) -> bytes:
        with open(self.root / key, "rb") as f:
            return f.read()

    def get_range(self, key: str, start: int, length: int) -> bytes:
        with open(self.root / key, "rb") as f:
            f.seek(start)
            return f.read(length)

    def count(self, prefix: str) -> int:
        def walk(directory: str) -> int:
            count = 0
            with os.scandir(directory) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        count += walk(entry.path)
                    else:
                        st = entry.stat()
                        count += st.st_size >= 0 and st.st_mtime > 0
            return count

        return walk(str(self.root / prefix))

    def delete(self, keys: list[str]) -> None:
        for key in keys:
            os.unlink(self.root / key)

    def put_file(self, key: str, path: str) -> None:
        target = self.root / key
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "rb") as src, open(target, "wb") as dst:
            shutil.copyfileobj(src, dst, CHUNK)

    def get_stream(self, key: str) -> int:
        with open(self.root / key, "rb") as f:
            return sum(len(chunk) for chunk in iter(lambda: f.read(CHUNK), b""))


class PyarrowDriver:
    def __init__(self, backend: Backend) -> None:
        self.fs, self.root = backend.arrow_filesystem()
        self.local = backend.server is None

    def _path(self, key: str) -> str:
        return f"{self.root}/{key}"

    def put(self, key: str, data: bytes) -> None:
        if self.local:
            self.fs.create_dir(self._path(key).rsplit("/", 1)[0], recursive=True)
        with self.fs.open_output_stream(self._path(key)) as f:
            f.write(data)

    def get(self, key: str) -> bytes:
        with self.fs.open_input_stream(self._path(key)) as f:
            data: bytes = f.read()
        return data

    def get_range(self, key: str, start: int, length: int) -> bytes:
        with self.fs.open_input_file(self._path(key)) as f:
            data: bytes = f.read_at(length, start)
        return data

    def count(self, prefix: str) -> int:
        import pyarrow.fs as pafs

        selector = pafs.FileSelector(self._path(prefix.rstrip("/")), recursive=True)
        return sum(
            1
            for info in self.fs.get_file_info(selector)
            if info.type == pafs.FileType.File and info.size >= 0 and info.mtime_ns
        )

    def delete(self, keys: list[str]) -> None:
        with ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(lambda k: self.fs.delete_file(self._path(k)), keys))

    def put_file(self, key: str, path: str) -> None:
        if self.local:
            self.fs.create_dir(self._path(key).rsplit("/", 1)[0], recursive=True)
        with open(path, "rb") as src, self.fs.open_output_stream(self._path(key)) as dst:
            while chunk := src.read(CHUNK):
                dst.write(chunk)

    def get_stream(self, key: str) -> int:
        with self.fs.open_input_stream(self._path(key)) as f:
            return sum(len(chunk) for chunk in iter(lambda: f.read(CHUNK), b""))


class ObstoreDriver:
    def __init__(self, backend: Backend) -> None:
        self.store = backend.library()

    def put(self, key: str, data: bytes) -> None:
        import obstore

        obstore.put(self.store, key, data)

    def get(self, key: str) -> bytes:
        import obstore

        return obstore.get(self.store, key).bytes().to_bytes()

    def get_range(self, key: str, start: int, length: int) -> bytes:
        import obstore

        return obstore.get_range(self.store, key, start=start, length=length).to_bytes()

    def count(self, prefix: str) -> int:
        import obstore

        count = 0
        for batch in obstore.list(self.store, prefix, chunk_size=1000):
            count += sum(1 for meta in batch if meta["size"] >= 0 and bool(meta["last_modified"]))
        return count

    def delete(self, keys: list[str]) -> None:
        import obstore

        obstore.delete(self.store, keys)

    def put_file(self, key: str, path: str) -> None:
        import obstore

        obstore.put(self.store, key, Path(path), chunk_size=CHUNK, max_concurrency=4)

    def get_stream(self, key: str) -> int:
        import obstore

        result = obstore.get(self.store, key)
        return sum(len(chunk) for chunk in result.stream(min_chunk_size=CHUNK))


def driver(library: str, backend: Backend) -> Driver:
    if library == "pyarrow":
        return PyarrowDriver(backend)
    if library == "obstore":
        return ObstoreDriver(backend)
    if library == "boto3":
        assert backend.server is not None and backend.bucket is not None
        return Boto3Driver(backend.server, backend.bucket)
    return OsDriver(str(backend.root))


def timed(op: Callable[[], object]) -> float:
    started = time.perf_counter()
    op()
    return time.perf_counter() - started


def run_small(backend: Backend, count: int, rounds: int) -> dict[str, dict[str, float]]:
    """Median seconds per (op, library) over `rounds`, each library on a prefix of its own."""
    libraries = LIBRARIES[backend.name]
    drivers = {lib: driver(lib, backend) for lib in libraries}
    drivers[libraries[0]].put("ranged.bin", random.randbytes(RANGE_OBJECT))
    payload = random.randbytes(SMALL_SIZE)
    ranges = [random.randrange(RANGE_OBJECT - RANGE_SIZE) for _ in range(max(1, count // 5))]
    times: dict[str, dict[str, list[float]]] = {op: {lib: [] for lib in libraries} for op in OPS}
    with ThreadPoolExecutor(THREADS) as pool:
        for round_number in range(rounds):
            order = libraries[round_number % 3 :] + libraries[: round_number % 3]
            for lib in order:
                d = drivers[lib]
                keys = [f"small-{lib}/{i // 1000:03d}/{i:06d}" for i in range(count)]

                def put(d: Driver = d, keys: list[str] = keys) -> None:
                    list(pool.map(lambda k: d.put(k, payload), keys))

                def get(d: Driver = d, keys: list[str] = keys) -> None:
                    got = list(pool.map(d.get, keys))
                    assert all(g == payload for g in got)

                def ranged(d: Driver = d) -> None:
                    got = list(pool.map(lambda s: d.get_range("ranged.bin", s, RANGE_SIZE), ranges))
                    assert all(len(g) == RANGE_SIZE for g in got)

                def listed(d: Driver = d, lib: str = lib) -> None:
                    found = d.count(f"small-{lib}/")
                    assert found == count, (lib, found)

                times["put"][lib].append(timed(put))
                times["get"][lib].append(timed(get))
                times["range"][lib].append(timed(ranged))
                times["list"][lib].append(timed(listed))

                def delete(d: Driver = d, keys: list[str] = keys) -> None:
                    d.delete(keys)

                times["delete"][lib].append(timed(delete))
                left = undeleted(backend, f"small-{lib}/")
                assert left == 0, f"{lib} left {left} of {count} objects undeleted"
    return {
        op: {lib: statistics.median(v) for lib, v in libs.items()} for op, libs in times.items()
    }


def undeleted(backend: Backend, prefix: str) -> int:
    """Objects of some size left under `prefix` on S3: `pyarrow.fs` leaves an empty
    directory marker where it deleted a folder's last object, which is not one of them."""
    if backend.server is None:
        return 0
    import obstore

    listed = obstore.list(backend.library(), prefix, chunk_size=1000)
    return sum(1 for batch in listed for meta in batch if meta["size"] > 0)


def _large_child(library: str, backend: Backend, op: str, key: str, path: str, queue: Any) -> None:
    d = driver(library, backend)
    started = time.perf_counter()
    if op == "large-put":
        d.put_file(key, path)
        moved = os.path.getsize(path)
    else:
        moved = d.get_stream(key)
    seconds = time.perf_counter() - started
    queue.put((seconds, moved, peak_rss()))


def peak_rss() -> int:
    """This process's peak RSS in bytes: VmHWM, since `ru_maxrss` keeps the parent's peak
    across the fork and exec that spawned it."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) << 10
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss << 10


def in_child(library: str, backend: Backend, op: str, key: str, path: str) -> tuple[float, int]:
    """Seconds and peak RSS (bytes) of one streamed transfer in a spawned child."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    child = ctx.Process(target=_large_child, args=(library, backend, op, key, path, queue))
    child.start()
    try:
        seconds, moved, rss = queue.get(timeout=1800)
    finally:
        child.join(60)
        if child.is_alive():
            child.kill()
    assert moved == os.path.getsize(path), (library, op, moved)
    return seconds, rss


def run_large(backend: Backend, path: str) -> dict[str, dict[str, tuple[float, int]]]:
    found: dict[str, dict[str, tuple[float, int]]] = {"large-put": {}, "large-get": {}}
    for lib in LIBRARIES[backend.name]:
        key = f"large-{lib}/object.bin"
        for op in found:
            found[op][lib] = in_child(lib, backend, op, key, path)
        driver(lib, backend).delete([key])
    return found


def report(backend: Backend, op: str, seconds: dict[str, float], extra: str = "") -> None:
    base, *others = LIBRARIES[backend.name]
    best = min(seconds[lib] for lib in others)
    figures = " ".join(f"{lib}_s={s:.3f}" for lib, s in seconds.items())
    print(
        f"BENCH object-layer-{op} ratio={seconds[base] / best:.2f} base={base} {figures}"
        f"{extra} {backend.label}",
        flush=True,
    )


def bench(backend: Backend, args: argparse.Namespace, big_file: str | None) -> None:
    small = run_small(backend, args.small, args.rounds)
    for op in OPS:
        report(backend, op, small[op], f" objects={args.small}")
    if big_file is None:
        return
    for op, results in run_large(backend, big_file).items():
        rss = " ".join(f"{lib}_rss_mb={r >> 20}" for lib, (_, r) in results.items())
        report(
            backend, op, {lib: s for lib, (s, _) in results.items()}, f" mb={args.large_mb} {rss}"
        )


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench_object_layer", description=__doc__)
    parser.add_argument("--small", type=int, default=10_000, help="small objects per op")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--large-mb", type=int, default=1024, help="0: skip the large object")
    args, _ = parser.parse_known_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="bench-object-layer-"))
    try:
        big_file = None
        if args.large_mb:
            big_file = str(scratch / "big.bin")
            with open(big_file, "wb") as f:
                for _ in range(args.large_mb):
                    f.write(random.randbytes(1 << 20))
        with open_backend(scratch / "store") as backend:
            bench(backend, args, big_file)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
