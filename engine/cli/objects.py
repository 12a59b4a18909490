"""`upload | cat | ls | rm | cp`: objects on a branch or at any ref."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from itertools import islice
from typing import BinaryIO

from branchwater.engine.api import Lake, Ref, Repository
from branchwater.engine.cli.output import Output, entry_line, entry_to_json, shown
from branchwater.engine.cli.verbs import Subparsers, UserError, add_meta, count, verb
from branchwater.engine.errors import NotFound
from branchwater.engine.graveler.model import Entry
from branchwater.engine.objects.store import CHUNK_SIZE
from branchwater.engine.units import human_size


def open_ref(repo: Repository, ref: str) -> Ref:
    """A branch when `ref` names one, so reads see its uncommitted changes (as lakectl does)."""
    try:
        return repo.branch(ref)
    except NotFound:
        return repo.ref(ref)


def open_local(file: str) -> BinaryIO:
    """The upload source: a local file, or stdin for `-`, streamed."""
    if file == "-":
        return sys.stdin.buffer
    try:
        return open(file, "rb")
    except (OSError, ValueError) as exc:  # ValueError: a NUL, as `uploads._open_local` has it
        raise UserError(f"cannot read {file!r}: {getattr(exc, 'strerror', None) or exc}") from exc


def cmd_upload(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    branch = lake.repository(args.repo).branch(args.branch)
    source = open_local(args.file)
    try:
        entry = branch.upload(args.path, source, dict(args.meta), if_absent=args.if_absent)
    finally:
        if source is not sys.stdin.buffer:
            source.close()
    out.document(
        entry_to_json(entry),
        f"Uploaded {shown(entry.path)} ({human_size(entry.size)}) to {args.repo}/{args.branch}",
    )


CAT_HOLD_BACK = 8 << 20
"""Bytes `cat` holds back before it writes any: an object no larger is verified before the
first byte goes out, so a damaged one prints nothing; a larger one streams, and a damage
found at its end fails the command after its bytes."""


def cmd_cat(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    """Refuses `--json` rather than break its promise of one JSON document: an object's
    bytes may be binary and of any size, and `ls --json` already shows its entry."""
    if out.as_json:
        raise UserError(
            "cat writes an object's bytes as stored, not JSON: drop --json "
            "('branchwater ls REPO REF PATH --json' lists its entry)"
        )
    ref = open_ref(lake.repository(args.repo), args.ref)
    with ref.open(args.path, verify=not args.no_verify) as f:
        chunk = f.read(CAT_HOLD_BACK)
        while chunk:
            out.raw(chunk)
            chunk = f.read(CHUNK_SIZE)


def cmd_ls(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    ref = open_ref(lake.repository(args.repo), args.ref)
    entries: Iterator[Entry] = ref.list(prefix=args.prefix, after=args.after)
    out.stream(islice(entries, args.limit), entry_to_json, entry_line)


def cmd_rm(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    lake.repository(args.repo).branch(args.branch).delete(args.path)
    out.document(
        {"repository": args.repo, "branch": args.branch, "path": args.path, "removed": True},
        f"Removed {shown(args.path)} from {args.repo}/{args.branch} (uncommitted)",
    )


def cmd_cp(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    entry = lake.repository(args.repo).branch(args.branch).copy(args.src, args.dst)
    out.document(
        entry_to_json(entry),
        f"Copied {shown(args.src)} to {shown(entry.path)} on {args.repo}/{args.branch} "
        "(uncommitted)",
    )


def register(sub: Subparsers) -> None:
    upload = verb(sub, "upload", cmd_upload, "stage a local file (or stdin, '-') at PATH")
    upload.add_argument("repo", metavar="REPO")
    upload.add_argument("branch", metavar="BRANCH")
    upload.add_argument("path", metavar="PATH")
    upload.add_argument("file", metavar="FILE")
    add_meta(upload)
    upload.add_argument(
        "--if-absent",
        action="store_true",
        help="only if the branch shows nothing at PATH (an exclusive creation), else fail",
    )
    cat = verb(sub, "cat", cmd_cat, "write an object's bytes to stdout (no --json)")
    cat.add_argument("repo", metavar="REPO")
    cat.add_argument("ref", metavar="REF")
    cat.add_argument("path", metavar="PATH")
    cat.add_argument(
        "--no-verify",
        action="store_true",
        help="write the bytes as stored even if their size or checksum is not the entry's",
    )
    ls = verb(sub, "ls", cmd_ls, "list objects (size, mtime, path) under PREFIX")
    ls.add_argument("repo", metavar="REPO")
    ls.add_argument("ref", metavar="REF")
    ls.add_argument("prefix", nargs="?", default="", metavar="PREFIX")
    ls.add_argument("--after", default="", metavar="PATH", help="start strictly after PATH")
    ls.add_argument("--limit", type=count, default=None, metavar="N")
    rm = verb(sub, "rm", cmd_rm, "stage the removal of an object")
    rm.add_argument("repo", metavar="REPO")
    rm.add_argument("branch", metavar="BRANCH")
    rm.add_argument("path", metavar="PATH")
    cp = verb(sub, "cp", cmd_cp, "copy an object within a branch (uncommitted)")
    cp.add_argument("repo", metavar="REPO")
    cp.add_argument("branch", metavar="BRANCH")
    cp.add_argument("src", metavar="SRC")
    cp.add_argument("dst", metavar="DST")
