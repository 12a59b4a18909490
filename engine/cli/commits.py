"""`commit | merge | publish | log | diff | uncommitted`: making history and reading it."""

from __future__ import annotations

import argparse
import getpass
import os
import shlex
from collections.abc import Iterator
from contextlib import contextmanager

from branchwater.engine.api import Lake
from branchwater.engine.cli.output import (
    Output,
    change_line,
    change_to_json,
    commit_block,
    commit_to_json,
    merge_to_json,
    short,
)
from branchwater.engine.cli.verbs import Subparsers, add_meta, count, key_value, verb
from branchwater.engine.errors import MergeRaceLost
from branchwater.engine.graveler.merge import STRATEGIES, split_hint
from branchwater.engine.graveler.model import Commit

COMMITTER_ENV = "BRANCHWATER_COMMITTER"


def default_committer() -> str:
    """Who a commit records when `--committer` is not given; git's author, loosely."""
    try:
        return os.environ.get(COMMITTER_ENV) or getpass.getuser()
    except (OSError, KeyError):
        return ""


def merge_hint(text: str) -> str:
    """`--hint`: refused unless shaped as a hint, since the engine ignores a hint that is not
    this merge's work (a stale one is fine to merge afresh past) and a typo should not pass."""
    if split_hint(text) is None:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a merge hint: a merge that lost every race to the destination "
            "exits 2 printing one (hint='METARANGE@COMMIT.TAG'); pass it back as --hint to "
            "resume that work"
        )
    return text


def cmd_commit(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    branch = lake.repository(args.repo).branch(args.branch)
    commit = branch.commit(
        args.message,
        dict(args.meta),
        committer=args.committer if args.committer is not None else default_committer(),
        allow_empty=args.allow_empty,
        progress=out.progress.counter("Applying staged entries"),
    )
    out.progress.done()
    first_line = (commit.message.splitlines() or [""])[0]
    out.document(commit_to_json(commit), f"[{args.branch} {short(commit.id)}] {first_line}")


@contextmanager
def hint_as_option(resume: str) -> Iterator[None]:
    """A lost race's advice in the CLI's words too: the option that takes its hint back."""
    try:
        yield
    except MergeRaceLost as exc:
        exc.args = (f"{exc} (from the CLI: {resume} --hint {shlex.quote(exc.hint)})",)
        raise


def cmd_merge(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    with hint_as_option("merge again with"):
        result = lake.repository(args.repo).merge(
            args.source,
            into=args.destination,
            strategy=args.strategy,
            message=args.message,
            metadata=dict(args.meta),
            committer=args.committer if args.committer is not None else default_committer(),
            hint=args.hint,
            fast_forward=args.fast_forward,
            preview=args.preview,
        )
    if args.preview:
        text = (
            f"Preview {result.commit.id} of merging {args.source} into {args.destination} "
            f"({args.destination} not moved): publish it with "
            f"'branchwater publish {args.repo} {short(result.commit.id)} {args.destination}'"
        )
    else:
        how = "fast-forward" if result.fast_forward else f"{result.attempts} attempt(s)"
        text = f"[{args.destination} {short(result.commit.id)}] merged {args.source} ({how})"
    out.document(merge_to_json(result), text)


def cmd_publish(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    with hint_as_option("merge --preview again with"):
        result = lake.repository(args.repo).publish(args.commit, into=args.destination)
    text = f"[{args.destination} {short(result.commit.id)}] published the merge preview"
    out.document(merge_to_json(result), text)


def cmd_log(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    """Commits print as the walk finds them, a blank line between two (as git log), so a
    filtered search shows its first match at once; nothing matched prints nothing."""
    commits = lake.repository(args.repo).log(
        args.ref,
        first_parent=args.first_parent,
        limit=args.limit,
        after=args.after,
        where=dict(args.where) or None,
        paths=args.path or None,
        depth=args.depth,
    )
    out.stream(enumerate(commits), lambda item: commit_to_json(item[1]), _numbered_block)


def _numbered_block(item: tuple[int, Commit]) -> str:
    index, commit = item
    return ("\n" if index else "") + commit_block(commit).rstrip("\n")


def cmd_diff(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    out.stream(lake.repository(args.repo).diff(args.left, args.right), change_to_json, change_line)


def cmd_uncommitted(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    changes = lake.repository(args.repo).branch(args.branch).uncommitted()
    out.stream(changes, change_to_json, change_line)


def register(sub: Subparsers) -> None:
    commit = verb(sub, "commit", cmd_commit, "commit a branch's uncommitted changes")
    commit.add_argument("repo", metavar="REPO")
    commit.add_argument("branch", metavar="BRANCH")
    commit.add_argument("-m", "--message", required=True, metavar="MSG")
    add_meta(commit)
    commit.add_argument("--allow-empty", action="store_true")
    commit.add_argument(
        "--committer", default=None, help=f"default: ${COMMITTER_ENV}, else the OS user"
    )
    merge = verb(sub, "merge", cmd_merge, "merge SOURCE (any ref) into the branch DEST")
    merge.add_argument("repo", metavar="REPO")
    merge.add_argument("source", metavar="SOURCE")
    merge.add_argument("destination", metavar="DEST")
    merge.add_argument("--strategy", choices=STRATEGIES, default=None)
    merge.add_argument("-m", "--message", default=None, metavar="MSG")
    add_meta(merge)
    merge.add_argument("--committer", default=None)
    merge.add_argument(
        "--hint",
        type=merge_hint,
        default=None,
        metavar="HINT",
        help="resume the work of a merge that lost every race (it exits 2 printing the hint)",
    )
    merge.add_argument(
        "--no-ff",
        dest="fast_forward",
        action="store_false",
        help="write a merge commit even when DEST could be fast-forwarded to SOURCE",
    )
    merge.add_argument(
        "--preview",
        action="store_true",
        help="build the merge commit without moving DEST; print its id for publish",
    )
    publish = verb(
        sub,
        "publish",
        cmd_publish,
        "move DEST to a merge preview (merge --preview) if DEST has not moved since",
    )
    publish.add_argument("repo", metavar="REPO")
    publish.add_argument("commit", metavar="PREVIEW", help="the preview's commit id")
    publish.add_argument("destination", metavar="DEST")
    log = verb(sub, "log", cmd_log, "show commits reachable from REF, newest first")
    log.add_argument("repo", metavar="REPO")
    log.add_argument("ref", metavar="REF")
    log.add_argument("--limit", type=count, default=None, metavar="N")
    log.add_argument("--first-parent", action="store_true")
    log.add_argument("--after", default=None, metavar="COMMIT", help="page on after this commit")
    log.add_argument(
        "--depth",
        type=count,
        default=None,
        metavar="N",
        help="look at the newest N commits only (the filters apply to those)",
    )
    log.add_argument(
        "--where",
        action="append",
        type=key_value,
        default=[],
        metavar="K=V",
        help="only commits whose metadata has K=V (repeatable: all must hold)",
    )
    log.add_argument(
        "--path",
        action="append",
        default=[],
        metavar="PREFIX",
        help="only commits that change a path starting with PREFIX (repeatable: any)",
    )
    diff = verb(
        sub, "diff", cmd_diff, "changes from LEFT's commit to RIGHT's (+ added ~ changed - removed)"
    )
    diff.add_argument("repo", metavar="REPO")
    diff.add_argument("left", metavar="LEFT")
    diff.add_argument("right", metavar="RIGHT")
    uncommitted = verb(sub, "uncommitted", cmd_uncommitted, "show a branch's uncommitted changes")
    uncommitted.add_argument("repo", metavar="REPO")
    uncommitted.add_argument("branch", metavar="BRANCH")
