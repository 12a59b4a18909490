"""`import`: objects under an existing prefix brought under a branch without copying them."""

from __future__ import annotations

import argparse

from branchwater.engine.api import Lake
from branchwater.engine.cli.commits import default_committer
from branchwater.engine.cli.output import Output, commit_to_json, short, shown
from branchwater.engine.cli.verbs import Subparsers, add_meta, verb
from branchwater.engine.units import human_size


def cmd_import(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    branch = lake.repository(args.repo).branch(args.branch)
    result = branch.import_objects(
        args.source,
        prefix=args.prefix,
        commit_message=args.message,
        metadata=dict(args.meta),
        committer=args.committer if args.committer is not None else default_committer(),
        progress=out.progress.counter("Listing objects"),
    )
    out.progress.done()
    what = f"{result.count:,} object(s), {human_size(result.bytes)}"
    if result.commit is None:
        text = (
            f"{args.branch!r} already holds all {what} of {shown(args.source)}: nothing committed"
        )
    else:
        text = (
            f"[{args.branch} {short(result.commit.id)}] imported {what} from {shown(args.source)}"
        )
    if result.folder_markers:
        text += f" ({result.folder_markers:,} S3 folder marker(s) skipped)"
    doc = {
        "repository": args.repo,
        "branch": args.branch,
        "source": args.source,
        "prefix": args.prefix,
        "count": result.count,
        "bytes": result.bytes,
        "folder_markers": result.folder_markers,
        "commit": commit_to_json(result.commit) if result.commit else None,
    }
    out.document(doc, text)


def register(sub: Subparsers) -> None:
    parser = verb(
        sub,
        "import",
        cmd_import,
        "commit on BRANCH every object under SOURCE_URI (s3://bucket/prefix/ or "
        "file:///dir/, outside every namespace) without copying it",
    )
    parser.add_argument("repo", metavar="REPO")
    parser.add_argument("branch", metavar="BRANCH")
    parser.add_argument("source", metavar="SOURCE_URI")
    parser.add_argument(
        "--prefix", default="", metavar="P", help="path prefix to import under (default: the root)"
    )
    parser.add_argument("-m", "--message", default=None, metavar="MSG")
    add_meta(parser)
    parser.add_argument("--committer", default=None)
