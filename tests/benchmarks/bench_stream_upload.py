"""A streamed upload (issue 38): `Branch.upload_file` of a large local file against copying
the same file into the namespace with the object layer's base library alone, on the selected
back end (`backends`): local files (`embedded`) or SeaweedFS's S3 server (`stack`, the lake's
KV on PostgreSQL).

- `stream-upload`: `--mb` (2 GB) uploaded by `upload_file` (one streamed write, the SHA-256
  computed on the way, then the staging) against `shutil.copyfile` into the object root and
  a SHA-256 of the file (local files: the copy and the hash any content-addressed write must
  do, one after the other) or obstore's `put` of the file (S3, the object layer's base:
  parallel multipart), each in a child process of its own; the best of `--rounds`, the two
  sides alternating. `peak_rss_mb` is the upload child's peak RSS (VmHWM), its imports
  included.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from tests.benchmarks.backends import Backend, open_backend
from tests.benchmarks.declarations import Benchmark, Suite
from tests.helpers.servers import unique_name

BENCHMARKS = Suite(
    section="Object layer",
    benchmarks=(
        Benchmark(
            "stream-upload",
            measures="`Branch.upload_file` of a 2 GB file into the namespace (local files, or "
            "S3 on the stack), in a child process",
            reference="copying it there with the object layer's base alone: `shutil.copyfile` "
            "then `hashlib.file_digest` (SHA-256) on local files, obstore's `put` of the file "
            "on S3",
            target=1.1,
            limits={"peak_rss_mb": 256},
        ),
    ),
)
PREFIX = "up"
"""Where both sides write, under the object root: removed after each side."""

CHILD = r"""
import json, re, sys, time
from pathlib import Path

def peak_mb():
    status = open("/proc/self/status").read()
    return int(re.search(r"VmHWM:\s*(\d+) kB", status).group(1)) / 1024

args = json.loads(sys.argv[1])
if args["side"] == "branchwater":
    from branchwater.engine import Lake
    with Lake.connect(args["kv_url"], s3_options=args["s3_options"] or None) as lake:
        repo = lake.create_repository(args["repo"], storage_namespace=args["namespace"])
        branch = repo.branch("main")
        branch.upload("warm", b"opens the store's client")
        started = time.perf_counter()
        entry = branch.upload_file("big.bin", args["file"])
        seconds = time.perf_counter() - started
        assert entry.size == args["size"], entry
    print(json.dumps({"seconds": seconds, "peak_mb": peak_mb()}))
    sys.exit(0)
from branchwater.stack.seaweedfs import S3Server
from tests.benchmarks.backends import Backend
server = S3Server(**args["server"]) if args["server"] else None
backend = Backend(args["name"], Path(args["root"]), args["kv_url"], server, args["bucket"])
if server is not None:
    import obstore
    store = backend.library()
    obstore.put(store, "warm", b"opens the store's client")
    started = time.perf_counter()
    obstore.put(store, args["key"], Path(args["file"]))
    seconds = time.perf_counter() - started
    assert obstore.head(store, args["key"])["size"] == args["size"]
else:
    import hashlib, os, shutil
    target = backend.root / args["key"]
    os.makedirs(target.parent, exist_ok=True)
    started = time.perf_counter()
    shutil.copyfile(args["file"], target)
    with open(args["file"], "rb") as f:
        hashlib.file_digest(f, "sha256")
    seconds = time.perf_counter() - started
print(json.dumps({"seconds": seconds, "peak_mb": peak_mb()}))
"""


def child(args: dict[str, Any]) -> dict[str, float]:
    done = subprocess.run(
        [sys.executable, "-c", CHILD, json.dumps(args)],
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"{args['side']} child failed:\n{done.stderr[-3000:]}")
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def make_file(path: Path, mb: int) -> None:
    block = os.urandom(1 << 20)
    with open(path, "wb") as f:
        for i in range(mb):
            f.write(i.to_bytes(8, "big") + block[8:])


def compare(backend: Backend, file: Path, rounds: int) -> None:
    size = file.stat().st_size
    base: dict[str, Any] = {
        "name": backend.name,
        "root": str(backend.root),
        "kv_url": backend.kv_url,
        "server": asdict(backend.server) if backend.server else None,
        "bucket": backend.bucket,
        "s3_options": backend.s3_options,
        "file": str(file),
        "size": size,
    }
    ours: list[dict[str, float]] = []
    floor: list[float] = []
    for number in range(rounds):
        sides = ["base", "branchwater"] if number % 2 else ["branchwater", "base"]
        for side in sides:
            if side == "base":
                key = f"{PREFIX}/copy-{number}"
                floor.append(child({**base, "side": side, "key": key})["seconds"])
            else:
                repo = unique_name("up-")
                namespace = backend.namespace(f"{PREFIX}/{repo}")
                ours.append(child({**base, "side": side, "repo": repo, "namespace": namespace}))
            clean(backend)
    best = min(r["seconds"] for r in ours)
    print(
        f"BENCH stream-upload ratio={best / min(floor):.2f} seconds={best:.2f} "
        f"base_s={min(floor):.2f} peak_rss_mb={max(r['peak_mb'] for r in ours):.0f} "
        f"mb={size >> 20} {backend.label}",
        flush=True,
    )


def clean(backend: Backend) -> None:
    """Remove what a side wrote, so the disk holds one copy at a time."""
    if backend.server is None:
        shutil.rmtree(backend.root / PREFIX, ignore_errors=True)
        return
    import obstore

    obstore.delete(backend.library(), backend.keys(PREFIX))


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench_stream_upload", description=__doc__)
    parser.add_argument("--mb", type=int, default=2048, help="the file's size in MiB")
    parser.add_argument("--rounds", type=int, default=2)
    args, _ = parser.parse_known_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="bench-stream-upload-"))
    try:
        big = scratch / "big.bin"
        make_file(big, args.mb)
        with open_backend(scratch / "lake") as backend:
            compare(backend, big, args.rounds)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
