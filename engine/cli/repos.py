"""`repo create | list | delete`."""

from __future__ import annotations

import argparse

from branchwater.engine.api import Lake
from branchwater.engine.cli.output import Output, repository_to_json, timestamp
from branchwater.engine.cli.verbs import Subparsers, group, verb
from branchwater.engine.graveler.repositories import check_new_repository


def cmd_repo_create(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    repo = lake.create_repository(args.name, args.namespace, default_branch=args.default_branch)
    out.document(
        repository_to_json(repo),
        f"Repository {repo.name!r} created: namespace {repo.storage_namespace}, "
        f"default branch {repo.default_branch!r}",
    )


def check_creation(args: argparse.Namespace) -> None:
    check_new_repository(args.name, args.namespace, args.default_branch)


def cmd_repo_list(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    out.table(
        lake.repositories(),
        repository_to_json,
        ("NAME", "DEFAULT BRANCH", "CREATED", "NAMESPACE"),
        lambda r: (
            r.name,
            r.default_branch,
            timestamp(r.record.creation_date),
            r.storage_namespace,
        ),
    )


def cmd_repo_delete(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    lake.delete_repository(args.name)
    out.document({"repository": args.name, "deleted": True}, f"Repository {args.name!r} deleted")


def register(sub: Subparsers) -> None:
    repo = group(sub, "repo", "create, list and delete repositories")
    create = verb(
        repo,
        "create",
        cmd_repo_create,
        "create a repository (and the lake, where there is none)",
        creates_lake=check_creation,
    )
    create.add_argument("name", metavar="NAME")
    create.add_argument("--namespace", required=True, metavar="URL", help="file:// or s3:// URL")
    create.add_argument("--default-branch", default="main", metavar="BRANCH")
    verb(repo, "list", cmd_repo_list, "list repositories")
    verb(repo, "delete", cmd_repo_delete, "delete a repository").add_argument(
        "name", metavar="NAME"
    )
