"""`tag create | list | delete`."""

from __future__ import annotations

import argparse

from branchwater.engine.api import Lake
from branchwater.engine.cli.output import Output, short, tag_to_json
from branchwater.engine.cli.verbs import Subparsers, group, verb


def cmd_tag_create(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    tag = lake.repository(args.repo).tag(args.tag, args.ref)
    out.document(tag_to_json(tag), f"Tag {tag.name!r} created at {short(tag.commit_id)}")


def cmd_tag_list(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    out.table(
        lake.repository(args.repo).tags(),
        tag_to_json,
        ("TAG", "COMMIT"),
        lambda t: (t.name, short(t.commit_id)),
    )


def cmd_tag_delete(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    lake.repository(args.repo).delete_tag(args.tag)
    out.document(
        {"repository": args.repo, "name": args.tag, "deleted": True}, f"Tag {args.tag!r} deleted"
    )


def register(sub: Subparsers) -> None:
    tag = group(sub, "tag", "create, list and delete tags")
    create = verb(tag, "create", cmd_tag_create, "tag the commit REF points at")
    create.add_argument("repo", metavar="REPO")
    create.add_argument("tag", metavar="TAG")
    create.add_argument("ref", metavar="REF")
    verb(tag, "list", cmd_tag_list, "list tags").add_argument("repo", metavar="REPO")
    delete = verb(tag, "delete", cmd_tag_delete, "delete a tag")
    delete.add_argument("repo", metavar="REPO")
    delete.add_argument("tag", metavar="TAG")
