"""`revert | cherry-pick | restore`: undoing and redoing commits, and taking paths back from
one (`branch reset --to` moves a whole branch)."""

from __future__ import annotations

import argparse

from branchwater.engine.api import Lake
from branchwater.engine.cli.commits import default_committer
from branchwater.engine.cli.output import Output, merge_to_json, short
from branchwater.engine.cli.verbs import (
    Subparsers,
    UserError,
    add_meta,
    positive_int,
    trailing_list,
    verb,
)


def cmd_revert(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    _pick(lake, args, out, "reverted")


def cmd_cherry_pick(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    _pick(lake, args, out, "cherry-picked")


def _pick(lake: Lake, args: argparse.Namespace, out: Output, done: str) -> None:
    """Revert and cherry-pick take the same arguments and print the same way."""
    repo = lake.repository(args.repo)
    operation = repo.revert if done == "reverted" else repo.cherry_pick
    result = operation(
        args.branch,
        args.commit,
        args.parent,
        message=args.message,
        metadata=dict(args.meta),
        committer=args.committer if args.committer is not None else default_committer(),
        allow_dirty=args.allow_dirty,
    )
    text = (
        f"[{args.branch} {short(result.commit.id)}] {done} {args.commit} "
        f"({result.attempts} attempt(s))"
    )
    out.document(merge_to_json(result), text)


def cmd_restore(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    branch = lake.repository(args.repo).branch(args.branch)
    staged = branch.restore(_restored_paths(args), source=args.source, every_path=args.all)
    out.document(
        {"repository": args.repo, "branch": args.branch, "source": args.source, "staged": staged},
        f"Restored {staged} path(s) on {args.branch!r} from {args.source!r} (uncommitted)",
    )


def _restored_paths(args: argparse.Namespace) -> list[str]:
    """The PATHs (none for `--all`: every path). An empty PATH is refused, as git refuses an
    empty pathspec: to the engine it is the prefix of every path, so an unset shell variable
    would restore the whole branch over its uncommitted changes."""
    if args.all:
        if args.paths:
            raise UserError("restore takes PATHs or --all, not both")
        return []
    if not args.paths:
        raise UserError("say what to restore: PATHs, or --all for every path")
    if "" in args.paths:
        raise UserError(
            "an empty PATH would restore every path of the branch (an unset shell variable?): "
            "pass --all for that"
        )
    return list(args.paths)


def register(sub: Subparsers) -> None:
    for name, handler, help_text in (
        ("revert", cmd_revert, "commit on BRANCH the undoing of COMMIT's changes"),
        ("cherry-pick", cmd_cherry_pick, "commit on BRANCH the changes of COMMIT"),
    ):
        parser = verb(sub, name, handler, help_text)
        parser.add_argument("repo", metavar="REPO")
        parser.add_argument("branch", metavar="BRANCH")
        parser.add_argument("commit", metavar="COMMIT", help="any ref")
        parser.add_argument(
            "--parent",
            type=positive_int,
            default=None,
            metavar="N",
            help="for a merge commit: the parent (1 or 2) its changes are taken against",
        )
        parser.add_argument("--message", default=None, metavar="MSG")
        add_meta(parser)
        parser.add_argument("--committer", default=None)
        parser.add_argument(
            "--allow-dirty",
            action="store_true",
            help="keep BRANCH's uncommitted changes staged above the new commit",
        )
    restore = verb(
        sub,
        "restore",
        cmd_restore,
        "stage SOURCE's version of PATHs (and all under them), deleting those it lacks",
    )
    restore.add_argument("repo", metavar="REPO")
    restore.add_argument("branch", metavar="BRANCH")
    trailing_list(restore, "paths", "*", metavar="PATH")
    restore.add_argument(
        "--all", action="store_true", help="every path: the branch's whole tree as SOURCE has it"
    )
    restore.add_argument("--source", required=True, metavar="REF")
