"""`refs dump | restore`: a repository's commits, branches and tags to a file and back."""

from __future__ import annotations

import argparse

from branchwater.engine.api import Lake
from branchwater.engine.cli.output import Output, shown
from branchwater.engine.cli.verbs import Subparsers, UserError, group, verb


def cmd_refs_dump(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    try:
        count = lake.repository(args.repo).dump_refs(args.file)
    except OSError as exc:
        raise UserError(f"cannot write {args.file!r}: {exc.strerror or exc}") from exc
    out.document(
        {"repository": args.repo, "file": args.file, "records": count},
        f"Dumped {count} records of {args.repo!r} to {shown(args.file)}",
    )


def cmd_refs_restore(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    try:
        count = lake.repository(args.repo).restore_refs(args.file)
    except OSError as exc:
        raise UserError(f"cannot read {args.file!r}: {exc.strerror or exc}") from exc
    out.document(
        {"repository": args.repo, "file": args.file, "records": count},
        f"Restored {count} records into {args.repo!r} from {shown(args.file)}",
    )


def register(sub: Subparsers) -> None:
    refs = group(sub, "refs", "dump and restore commits, branches and tags")
    for name, handler, help_text in (
        ("dump", cmd_refs_dump, "write a repository's refs to FILE as JSON"),
        ("restore", cmd_refs_restore, "load a dump into a bare repository"),
    ):
        parser = verb(refs, name, handler, help_text)
        parser.add_argument("repo", metavar="REPO")
        parser.add_argument("file", metavar="FILE")
