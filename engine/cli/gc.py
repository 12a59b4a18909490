"""`gc prepare`: garbage collection of uncommitted objects, the engine's side."""

from __future__ import annotations

import argparse

from branchwater.engine.api import Lake
from branchwater.engine.cli.output import Output
from branchwater.engine.cli.verbs import Subparsers, group, verb
from branchwater.engine.gc.prepare import read_manifest


def cmd_gc_prepare(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    repo = lake.repository(args.repo)
    run = repo.prepare_uncommitted_for_gc(
        args.run, progress=out.progress.counter("Listing uncommitted entries")
    )
    out.progress.done()
    manifest = read_manifest(lake.graveler.objects(repo.storage_namespace), run.run_id)
    entries = sum(manifest["branches"].values())
    out.document(
        {
            "run_id": run.run_id,
            "location": run.location,
            "uncommitted": entries,
            "branches": len(manifest["branches"]),
            "copy_records": manifest["copy_records"],
            "files": manifest["files"],
        },
        f"GC run {run.run_id}: {entries:,} uncommitted entries on "
        f"{len(manifest['branches']):,} branches and {manifest['copy_records']:,} copy "
        f"records\nwritten to {run.location}",
    )


def register(sub: Subparsers) -> None:
    gc = group(sub, "gc", "garbage collection of uncommitted objects")
    prepare = verb(
        gc,
        "prepare",
        cmd_gc_prepare,
        "write every branch's uncommitted addresses (and copy records) for a GC run",
    )
    prepare.add_argument("repo", metavar="REPO")
    prepare.add_argument("--run", default=None, metavar="RUN_ID", help="resume an interrupted run")
