"""`branch create | list | delete | reset`."""

from __future__ import annotations

import argparse

from branchwater.engine.api import Lake
from branchwater.engine.cli.output import Output, branch_to_json, short
from branchwater.engine.cli.verbs import Subparsers, group, verb


def cmd_branch_create(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    branch = lake.repository(args.repo).create_branch(args.name, source=args.source)
    commit_id = branch.commit_id
    out.document(
        {"repository": args.repo, **branch_to_json(args.name, commit_id)},
        f"Branch {args.name!r} created from {args.source!r} at {short(commit_id)}",
    )


def cmd_branch_list(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    repo = lake.repository(args.repo)
    heads = [(b.name, b.commit_id) for b in lake.graveler.refs.branches(repo.record)]
    out.table(
        heads,
        lambda head: branch_to_json(*head),
        ("BRANCH", "COMMIT"),
        lambda head: (head[0], short(head[1])),
    )


def cmd_branch_delete(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    lake.repository(args.repo).delete_branch(args.name)
    out.document(
        {"repository": args.repo, "name": args.name, "deleted": True},
        f"Branch {args.name!r} deleted",
    )


def cmd_branch_reset(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    branch = lake.repository(args.repo).branch(args.name)
    branch.reset(to=args.to)
    if args.to is None:
        text = f"Branch {args.name!r} reset: uncommitted changes dropped"
    else:
        text = f"Branch {args.name!r} reset to {args.to!r} ({short(branch.commit_id)})"
        text += ": uncommitted changes dropped"
    out.document(
        {"repository": args.repo, "name": args.name, "reset": True, "commit": branch.commit_id},
        text,
    )


def register(sub: Subparsers) -> None:
    branch = group(sub, "branch", "create, list, delete and reset branches")
    create = verb(branch, "create", cmd_branch_create, "create a branch from any ref")
    create.add_argument("repo", metavar="REPO")
    create.add_argument("name", metavar="NAME")
    create.add_argument("--source", required=True, metavar="REF")
    verb(branch, "list", cmd_branch_list, "list branches").add_argument("repo", metavar="REPO")
    parsers = {}
    for name, handler, help_text in (
        ("delete", cmd_branch_delete, "delete a branch and its uncommitted changes"),
        ("reset", cmd_branch_reset, "drop a branch's uncommitted changes (--to: and move it)"),
    ):
        parsers[name] = verb(branch, name, handler, help_text)
        parsers[name].add_argument("repo", metavar="REPO")
        parsers[name].add_argument("name", metavar="NAME")
    parsers["reset"].add_argument(
        "--to",
        default=None,
        metavar="REF",
        help="point the branch at REF's commit too, as git reset --hard",
    )
