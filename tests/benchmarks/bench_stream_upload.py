"""A streamed upload (issue 38): `Branch.upload_file` of a large local file against copying
the same file into the namespace with the object layer's base library alone, on local files
and on the SeaweedFS S3 server.

- `stream-upload-<backend>`: `--mb` (2 GB) uploaded by `upload_file` (one streamed write,
  the SHA-256 computed on the way, then the staging) against `shutil.copyfile` into the
  namespace folder and a SHA-256 of the file (local files: the copy and the hash any
  content-addressed write must do, one after the other) or obstore's `put` of the file (S3,
  the object layer's base: parallel multipart), each in a child process of its own; the
  best of `--rounds`, the two sides alternating. `peak_rss_mb` is the upload child's peak
  RSS (VmHWM), its imports included.
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

from tests.benchmarks.declarations import Benchmark, Suite
from tests.fixtures.s3 import running_seaweedfs
from tests.helpers.servers import unique_name

BENCHMARKS = Suite(
    section="Object layer",
    benchmarks=tuple(
        Benchmark(
            f"stream-upload-{backend}",
            measures=f"`Branch.upload_file` of a 2 GB file on {where}, in a child process",
            reference=f"copying it into the namespace with {base} alone",
            target=1.1,
            limits={"peak_rss_mb": 256},
        )
        for backend, where, base in (
            ("local", "local files", "`shutil.copyfile` then `hashlib.file_digest` (SHA-256)"),
            ("s3", "S3 (SeaweedFS)", "obstore's `put` of the file"),
        )
    ),
)

CHILD = r"""
import json, re, sys, time

def peak_mb():
    status = open("/proc/self/status").read()
    return int(re.search(r"VmHWM:\s*(\d+) kB", status).group(1)) / 1024

args = json.loads(sys.argv[1])
if args["side"] == "branchwater":
    from branchwater.engine import Lake
    with Lake.connect(args["kv"], s3_options=args["s3"] or None) as lake:
        repo = lake.create_repository(args["repo"], storage_namespace=args["namespace"])
        branch = repo.branch("main")
        branch.upload("warm", b"opens the store's client")
        started = time.perf_counter()
        entry = branch.upload_file("big.bin", args["file"])
        seconds = time.perf_counter() - started
        assert entry.size == args["size"], entry
elif args["s3"]:
    from pathlib import Path
    import obstore
    from branchwater.stack.seaweedfs import S3Server
    from tests.benchmarks.backends import STACK, Backend
    server = S3Server(**args["server"])
    store = Backend(STACK, Path("."), "", server, args["bucket"]).library()
    obstore.put(store, "warm", b"opens the store's client")
    started = time.perf_counter()
    obstore.put(store, args["key"], Path(args["file"]))
    seconds = time.perf_counter() - started
    assert obstore.head(store, args["key"])["size"] == args["size"]
else:
    import hashlib, os, shutil
    target = args["namespace"].removeprefix("file://") + "/" + args["key"]
    os.makedirs(os.path.dirname(target), exist_ok=True)
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


def compare(backend: str, base: dict[str, Any], rounds: int, scratch: Path) -> None:
    ours: list[dict[str, float]] = []
    floor: list[float] = []
    for number in range(rounds):
        sides = ["base", "branchwater"] if number % 2 else ["branchwater", "base"]
        for side in sides:
            if side == "base":
                floor.append(child({**base, "side": side, "key": f"copy-{number}"})["seconds"])
            else:
                repo = unique_name("up-")
                namespace = base["namespace"] + f"/{repo}"
                args = {**base, "side": side, "repo": repo, "namespace": namespace}
                args["kv"] = f"sqlite:///{scratch}/{repo}.db"
                ours.append(child(args))
            _clean(base)
    best = min(r["seconds"] for r in ours)
    print(
        f"BENCH stream-upload-{backend} ratio={best / min(floor):.2f} seconds={best:.2f} "
        f"base_s={min(floor):.2f} peak_rss_mb={max(r['peak_mb'] for r in ours):.0f} "
        f"mb={base['size'] >> 20}",
        flush=True,
    )


def _clean(base: dict[str, Any]) -> None:
    """Remove what a side wrote, so the disk holds one copy at a time."""
    if base["s3"]:
        import boto3

        client = boto3.session.Session().client("s3", **base["s3"])
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=base["bucket"]):
            keys = [{"Key": o["Key"]} for o in page.get("Contents", ())]
            if keys:
                client.delete_objects(Bucket=base["bucket"], Delete={"Objects": keys})
        client.close()
    else:
        shutil.rmtree(base["namespace"].removeprefix("file://"), ignore_errors=True)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench_stream_upload", description=__doc__)
    parser.add_argument("--mb", type=int, default=2048, help="the file's size in MiB")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--backends", default="local,s3", help="comma-separated")
    args, _ = parser.parse_known_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="bench-stream-upload-"))
    try:
        big = scratch / "big.bin"
        make_file(big, args.mb)
        common = {"file": str(big), "size": args.mb << 20, "s3": None}
        if "local" in args.backends.split(","):
            namespace = f"file://{scratch}/lake"
            compare("local", {**common, "namespace": namespace}, args.rounds, scratch)
        if "s3" in args.backends.split(","):
            with running_seaweedfs() as server:
                bucket = unique_name("bench-")
                server.client().create_bucket(Bucket=bucket)
                s3 = {**common, "s3": server.options, "server": asdict(server), "bucket": bucket}
                compare("s3", {**s3, "namespace": f"s3://{bucket}"}, args.rounds, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1:])
