"""`branchwater`: the git-like command line over the public API (DESIGN.md, "Command line").

Every verb is a thin handler over `Lake` / `Repository` / `Branch`; this module only parses
arguments, renders results (aligned text, or one JSON document with `--json`) and turns errors
into exit codes. The exit codes are a contract scripts rely on: 0 ok, 1 user error (one line
on stderr, never a traceback), 2 conflict / lost races (retrying may succeed), 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from importlib import metadata as importlib_metadata
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, TypeVar
from urllib.parse import urlsplit

from branchwater.engine.api import (
    DEFAULT_KV_URL,
    Lake,
    Ref,
    Repository,
    commit_to_json,
    entry_to_json,
)
from branchwater.engine.errors import (
    BranchwaterError,
    Conflict,
    NotFound,
    PredicateFailed,
    TooManyTries,
)
from branchwater.engine.graveler.merge import STRATEGIES
from branchwater.engine.graveler.model import Change, Commit, Entry, Tag

PROG = "branchwater"
KV_ENV = "BRANCHWATER_KV_URL"
COMMITTER_ENV = "BRANCHWATER_COMMITTER"

EXIT_OK = 0
EXIT_USER = 1
EXIT_CONFLICT = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE, what a shell reports for a reader that went away (`branchwater ls | head`)."""

PROGRESS_DELAY = 1.0
"""Seconds long work runs before its progress shows: quick commands stay quiet."""

SHORT_ID = 12
"""Abbreviated commit ids in tables; `Repository.ref` resolves any unique prefix."""

RETRYABLE = (Conflict, TooManyTries, PredicateFailed)
"""Errors where the request was sound but lost to someone else: exit 2, so scripts may retry."""

DIFF_MARKS = {"added": "+", "changed": "~", "removed": "-"}

T = TypeVar("T")
Handler = Callable[[Lake, argparse.Namespace, "Output"], None]

if TYPE_CHECKING:
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]


class UsageError(Exception):
    """A command line argparse (or a handler) rejects before touching the lake."""


class UserError(Exception):
    """A problem with the user's local files or input, reported like a `BranchwaterError`."""


class _Parser(argparse.ArgumentParser):
    """Raise instead of exiting so usage errors get exit code 1 and the one-line format."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} -h')")


# ---------------------------------------------------------------------------------- output


class Progress:
    """Long work on stderr as git shows it: one line rewritten in place, then ", done.".

    Results go to stdout, so progress never mixes into them or into `--json`. By default it
    shows only where stderr is a terminal; `--progress` / `--no-progress` decide otherwise.
    As a context manager it ends an open line: with ", done." after success, bare after a
    failure, so the error line starts on a line of its own.
    """

    def __init__(self, enabled: bool, delay: float = 0.0) -> None:
        self.enabled = enabled
        self.delay = delay
        """Work that ends sooner shows nothing, as with git's delayed progress."""
        self._line = ""

    def update(self, title: str, count: int | None = None) -> None:
        if not self.enabled:
            return
        line = title if count is None else f"{title}: {count:,}"
        sys.stderr.write("\r" + line.ljust(len(self._line)))
        sys.stderr.flush()
        self._line = line

    def counter(self, title: str) -> Callable[[int], None]:
        """A `progress` callback for the engine that shows `title: n` once `delay` passed."""
        started = time.monotonic()

        def report(count: int) -> None:
            if time.monotonic() - started >= self.delay:
                self.update(title, count)

        return report

    def done(self) -> None:
        self._end(", done.\n")

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, exc_type: object, *rest: object) -> None:
        self._end("\n" if exc_type else ", done.\n")

    def _end(self, tail: str) -> None:
        if self._line:
            sys.stderr.write(tail)
            sys.stderr.flush()
            self._line = ""


class Output:
    """Renders results as human text or, with `--json`, as exactly one JSON document; long
    work reports through `progress`."""

    def __init__(self, as_json: bool, progress: Progress) -> None:
        self.as_json = as_json
        self.progress = progress

    def _write(self, text: str) -> None:
        sys.stdout.write(text)

    def document(self, doc: object, text: str) -> None:
        """One result: `doc` for machines, `text` (one or more lines) for people."""
        if self.as_json:
            self._write(json.dumps(doc, indent=2) + "\n")
        else:
            self._write(text + "\n")

    def stream(
        self, items: Iterable[T], to_json: Callable[[T], object], to_text: Callable[[T], str]
    ) -> None:
        """A listing that may be long: text lines go out as the items arrive."""
        if self.as_json:
            self._write(json.dumps([to_json(item) for item in items], indent=2) + "\n")
            return
        for item in items:
            self._write(to_text(item) + "\n")

    def table(
        self,
        items: Sequence[T],
        to_json: Callable[[T], object],
        header: Sequence[str],
        to_row: Callable[[T], Sequence[str]],
    ) -> None:
        """A short listing (repositories, branches, tags) as aligned columns under a header."""
        if self.as_json:
            self._write(json.dumps([to_json(item) for item in items], indent=2) + "\n")
            return
        if items:
            self._write("".join(line + "\n" for line in align([header, *map(to_row, items)])))

    def raw(self, data: bytes) -> None:
        """Object bytes, unchanged: `cat` must round-trip binary data."""
        sys.stdout.flush()
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()


def align(rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-align columns two spaces apart; the last column is never padded."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    return [
        "  ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[-1]])
        for row in rows
    ]


def human_size(size: int) -> str:
    """Sizes as `ls -lh` and lakectl show them: exact bytes below 1 KiB, one decimal above."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def timestamp(when: datetime) -> str:
    """UTC, second precision: fixed width keeps streamed `ls` columns aligned."""
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def short(commit_id: str) -> str:
    return commit_id[:SHORT_ID]


# ---------------------------------------------------------------------------- JSON records


def repository_to_json(repo: Repository) -> dict[str, object]:
    return {
        "name": repo.name,
        "storage_namespace": repo.storage_namespace,
        "default_branch": repo.default_branch,
        "creation_date": repo.record.creation_date.isoformat(),
    }


def change_to_json(change: Change) -> dict[str, object]:
    return {"path": change.path, "type": change.type, "entry": entry_to_json(change.entry)}


def tag_to_json(tag: Tag) -> dict[str, object]:
    return {"name": tag.name, "commit_id": tag.commit_id}


# ------------------------------------------------------------------------------- text forms


def entry_line(entry: Entry) -> str:
    return f"{human_size(entry.size):>10}  {timestamp(entry.mtime)}  {entry.path}"


def change_line(change: Change) -> str:
    return f"{DIFF_MARKS[change.type]} {change.path}"


def commit_block(commit: Commit) -> str:
    """A commit as `git log` shows it: id, merge parents, author, date, metadata, message."""
    lines = [f"commit {commit.id}"]
    if len(commit.parents) > 1:
        lines.append("Merge:  " + " ".join(short(p) for p in commit.parents))
    if commit.committer:
        lines.append(f"Author: {commit.committer}")
    lines.append(f"Date:   {timestamp(commit.creation_date)}")
    for key, value in sorted(commit.metadata.items()):
        lines.append(f"Meta:   {key}={value}")
    lines.append("")
    lines.extend(f"    {line}" for line in commit.message.splitlines() or [""])
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------------- helpers


def open_ref(repo: Repository, ref: str) -> Ref:
    """A branch when `ref` names one, so reads see its uncommitted changes (as lakectl does)."""
    try:
        return repo.branch(ref)
    except NotFound:
        return repo.ref(ref)


def read_local(file: str) -> bytes:
    """The upload source: a local file, or stdin for `-`."""
    if file == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(file).read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read {file!r}: {exc.strerror or exc}") from exc


def default_committer() -> str:
    """Who a commit records when `--committer` is not given; git's author, loosely."""
    try:
        return os.environ.get(COMMITTER_ENV) or getpass.getuser()
    except (OSError, KeyError):
        return ""


def kv_url(option: str | None) -> str:
    """`--kv`, else `$BRANCHWATER_KV_URL`, else the embedded SQLite lake under the cwd."""
    return option or os.environ.get(KV_ENV) or DEFAULT_KV_URL


def ensure_sqlite_parent(url: str) -> None:
    """Create the directory of a SQLite lake so the first command in a fresh dir just works."""
    parts = urlsplit(url)
    if parts.scheme.split("+", 1)[0] != "sqlite" or not parts.path.startswith("/"):
        return
    parent = os.path.dirname(parts.path[1:])  # sqlite:///rel.db → rel.db, ////abs → /abs
    if not parent:
        return
    try:
        os.makedirs(parent, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create the lake directory {parent!r}: {exc.strerror}") from exc


# -------------------------------------------------------------------------------- handlers


def cmd_repo_create(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    repo = lake.create_repository(args.name, args.namespace, default_branch=args.default_branch)
    out.document(
        repository_to_json(repo),
        f"Repository {repo.name!r} created: namespace {repo.storage_namespace}, "
        f"default branch {repo.default_branch!r}",
    )


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


def cmd_branch_create(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    branch = lake.repository(args.repo).create_branch(args.name, source=args.source)
    commit_id = branch.commit_id
    out.document(
        {"repository": args.repo, "name": args.name, "commit_id": commit_id},
        f"Branch {args.name!r} created from {args.source!r} at {short(commit_id)}",
    )


def cmd_branch_list(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    repo = lake.repository(args.repo)
    rows = [(b.name, b.commit_id) for b in lake.graveler.refs.branches(repo.record)]
    out.table(
        rows,
        lambda r: {"name": r[0], "commit_id": r[1]},
        ("BRANCH", "COMMIT"),
        lambda r: (r[0], short(r[1])),
    )


def cmd_branch_delete(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    lake.repository(args.repo).delete_branch(args.name)
    out.document(
        {"repository": args.repo, "name": args.name, "deleted": True},
        f"Branch {args.name!r} deleted",
    )


def cmd_branch_reset(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    lake.repository(args.repo).branch(args.name).reset()
    out.document(
        {"repository": args.repo, "name": args.name, "reset": True},
        f"Branch {args.name!r} reset: uncommitted changes dropped",
    )


def cmd_upload(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    data = read_local(args.file)
    branch = lake.repository(args.repo).branch(args.branch)
    entry = branch.upload(args.path, data, dict(args.meta))
    out.document(
        entry_to_json(entry),
        f"Uploaded {entry.path} ({human_size(entry.size)}) to {args.repo}/{args.branch}",
    )


def cmd_cat(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    out.raw(open_ref(lake.repository(args.repo), args.ref).read(args.path))


def cmd_ls(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    ref = open_ref(lake.repository(args.repo), args.ref)
    entries: Iterator[Entry] = ref.list(prefix=args.prefix, after=args.after)
    out.stream(islice(entries, args.limit), entry_to_json, entry_line)


def cmd_rm(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    lake.repository(args.repo).branch(args.branch).delete(args.path)
    out.document(
        {"repository": args.repo, "branch": args.branch, "path": args.path, "removed": True},
        f"Removed {args.path} from {args.repo}/{args.branch} (uncommitted)",
    )


def cmd_uncommitted(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    changes = lake.repository(args.repo).branch(args.branch).uncommitted()
    out.stream(changes, change_to_json, change_line)


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


def cmd_merge(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    result = lake.repository(args.repo).merge(
        args.source,
        into=args.destination,
        strategy=args.strategy,
        message=args.message,
        metadata=dict(args.meta),
        committer=args.committer if args.committer is not None else default_committer(),
        hint=args.hint,
    )
    how = "fast-forward" if result.fast_forward else f"{result.attempts} attempt(s)"
    doc = {**commit_to_json(result.commit), "attempts": result.attempts}
    doc["fast_forward"] = result.fast_forward
    text = f"[{args.destination} {short(result.commit.id)}] merged {args.source} ({how})"
    out.document(doc, text)


def cmd_log(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    commits = lake.repository(args.repo).log(
        args.ref, first_parent=args.first_parent, limit=args.limit, after=args.after
    )
    out.document(
        [commit_to_json(c) for c in commits],
        "\n".join(commit_block(c) for c in commits).rstrip("\n"),
    )


def cmd_diff(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    out.stream(lake.repository(args.repo).diff(args.left, args.right), change_to_json, change_line)


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


def cmd_refs_dump(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    try:
        count = lake.repository(args.repo).dump_refs(args.file)
    except OSError as exc:
        raise UserError(f"cannot write {args.file!r}: {exc.strerror or exc}") from exc
    out.document(
        {"repository": args.repo, "file": args.file, "records": count},
        f"Dumped {count} records of {args.repo!r} to {args.file}",
    )


def cmd_refs_restore(lake: Lake, args: argparse.Namespace, out: Output) -> None:
    try:
        count = lake.repository(args.repo).restore_refs(args.file)
    except OSError as exc:
        raise UserError(f"cannot read {args.file!r}: {exc.strerror or exc}") from exc
    out.document(
        {"repository": args.repo, "file": args.file, "records": count},
        f"Restored {count} records into {args.repo!r} from {args.file}",
    )


# ---------------------------------------------------------------------------------- parser


def key_value(text: str) -> tuple[str, str]:
    """`--meta k=v`: argparse turns the ValueError into a usage error naming the option."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    return key, value


def positive_int(text: str) -> int:
    try:
        number = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return number


def version() -> str:
    try:
        return importlib_metadata.version("branchwater")
    except importlib_metadata.PackageNotFoundError:
        return "unknown"


def global_options(parser: argparse.ArgumentParser, *, on_verb: bool) -> None:
    """`--kv`, `--json` and `--progress` before or after the verb, as lakectl's persistent
    flags allow.

    On a verb they default to SUPPRESS, so an absent flag never overwrites the value the
    top-level parser already stored.
    """
    unset = argparse.SUPPRESS if on_verb else None
    parser.add_argument(
        "--kv",
        default=unset,
        metavar="URL",
        help=f"KV store URL (default: ${KV_ENV}, else {DEFAULT_KV_URL})",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS if on_verb else False,
        help="print one JSON document",
    )
    parser.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=unset,
        help="show progress of long work on stderr (default: when stderr is a terminal)",
    )


def verb(
    parent: Subparsers, name: str, handler: Handler, help_text: str
) -> argparse.ArgumentParser:
    parser = parent.add_parser(name, help=help_text, description=help_text)
    global_options(parser, on_verb=True)
    parser.set_defaults(handler=handler)
    return parser


def group(parent: Subparsers, name: str, help_text: str) -> Subparsers:
    parser = parent.add_parser(name, help=help_text, description=help_text)
    return parser.add_subparsers(title="commands", metavar="COMMAND", required=True)


def add_repo_verbs(sub: Subparsers) -> None:
    repo = group(sub, "repo", "create, list and delete repositories")
    create = verb(repo, "create", cmd_repo_create, "create a repository")
    create.add_argument("name", metavar="NAME")
    create.add_argument("--namespace", required=True, metavar="URL", help="file:// or s3:// URL")
    create.add_argument("--default-branch", default="main", metavar="BRANCH")
    verb(repo, "list", cmd_repo_list, "list repositories")
    verb(repo, "delete", cmd_repo_delete, "delete a repository").add_argument(
        "name", metavar="NAME"
    )


def add_branch_verbs(sub: Subparsers) -> None:
    branch = group(sub, "branch", "create, list, delete and reset branches")
    create = verb(branch, "create", cmd_branch_create, "create a branch from any ref")
    create.add_argument("repo", metavar="REPO")
    create.add_argument("name", metavar="NAME")
    create.add_argument("--source", required=True, metavar="REF")
    verb(branch, "list", cmd_branch_list, "list branches").add_argument("repo", metavar="REPO")
    for name, handler, help_text in (
        ("delete", cmd_branch_delete, "delete a branch and its uncommitted changes"),
        ("reset", cmd_branch_reset, "drop a branch's uncommitted changes"),
    ):
        parser = verb(branch, name, handler, help_text)
        parser.add_argument("repo", metavar="REPO")
        parser.add_argument("name", metavar="NAME")


def add_object_verbs(sub: Subparsers) -> None:
    upload = verb(sub, "upload", cmd_upload, "stage a local file (or stdin, '-') at PATH")
    upload.add_argument("repo", metavar="REPO")
    upload.add_argument("branch", metavar="BRANCH")
    upload.add_argument("path", metavar="PATH")
    upload.add_argument("file", metavar="FILE")
    upload.add_argument("--meta", action="append", type=key_value, default=[], metavar="K=V")
    cat = verb(sub, "cat", cmd_cat, "write an object's bytes to stdout")
    cat.add_argument("repo", metavar="REPO")
    cat.add_argument("ref", metavar="REF")
    cat.add_argument("path", metavar="PATH")
    ls = verb(sub, "ls", cmd_ls, "list objects (size, mtime, path) under PREFIX")
    ls.add_argument("repo", metavar="REPO")
    ls.add_argument("ref", metavar="REF")
    ls.add_argument("prefix", nargs="?", default="", metavar="PREFIX")
    ls.add_argument("--after", default="", metavar="PATH", help="start strictly after PATH")
    ls.add_argument("--limit", type=positive_int, default=None, metavar="N")
    rm = verb(sub, "rm", cmd_rm, "stage the removal of an object")
    rm.add_argument("repo", metavar="REPO")
    rm.add_argument("branch", metavar="BRANCH")
    rm.add_argument("path", metavar="PATH")


def add_history_verbs(sub: Subparsers) -> None:
    commit = verb(sub, "commit", cmd_commit, "commit a branch's uncommitted changes")
    commit.add_argument("repo", metavar="REPO")
    commit.add_argument("branch", metavar="BRANCH")
    commit.add_argument("-m", "--message", required=True, metavar="MSG")
    commit.add_argument("--meta", action="append", type=key_value, default=[], metavar="K=V")
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
    merge.add_argument("--meta", action="append", type=key_value, default=[], metavar="K=V")
    merge.add_argument("--committer", default=None)
    merge.add_argument("--hint", default=None, help="resume from a lost race's hint")
    log = verb(sub, "log", cmd_log, "show commits reachable from REF, newest first")
    log.add_argument("repo", metavar="REPO")
    log.add_argument("ref", metavar="REF")
    log.add_argument("--limit", type=positive_int, default=None, metavar="N")
    log.add_argument("--first-parent", action="store_true")
    log.add_argument("--after", default=None, metavar="COMMIT", help="page on after this commit")
    diff = verb(
        sub, "diff", cmd_diff, "changes from LEFT's commit to RIGHT's (+ added ~ changed - removed)"
    )
    diff.add_argument("repo", metavar="REPO")
    diff.add_argument("left", metavar="LEFT")
    diff.add_argument("right", metavar="RIGHT")
    uncommitted = verb(sub, "uncommitted", cmd_uncommitted, "show a branch's uncommitted changes")
    uncommitted.add_argument("repo", metavar="REPO")
    uncommitted.add_argument("branch", metavar="BRANCH")


def add_tag_verbs(sub: Subparsers) -> None:
    tag = group(sub, "tag", "create, list and delete tags")
    create = verb(tag, "create", cmd_tag_create, "tag the commit REF points at")
    create.add_argument("repo", metavar="REPO")
    create.add_argument("tag", metavar="TAG")
    create.add_argument("ref", metavar="REF")
    verb(tag, "list", cmd_tag_list, "list tags").add_argument("repo", metavar="REPO")
    delete = verb(tag, "delete", cmd_tag_delete, "delete a tag")
    delete.add_argument("repo", metavar="REPO")
    delete.add_argument("tag", metavar="TAG")


def add_refs_verbs(sub: Subparsers) -> None:
    refs = group(sub, "refs", "dump and restore commits, branches and tags")
    for name, handler, help_text in (
        ("dump", cmd_refs_dump, "write a repository's refs to FILE as JSON"),
        ("restore", cmd_refs_restore, "load a dump into a bare repository"),
    ):
        parser = verb(refs, name, handler, help_text)
        parser.add_argument("repo", metavar="REPO")
        parser.add_argument("file", metavar="FILE")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog=PROG, description="Git for a data lake.")
    global_options(parser, on_verb=False)
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    add_repo_verbs(sub)
    add_branch_verbs(sub)
    add_object_verbs(sub)
    add_history_verbs(sub)
    add_tag_verbs(sub)
    add_refs_verbs(sub)
    return parser


# ------------------------------------------------------------------------------------ main


def fail(message: str, code: int) -> int:
    """The single stderr line every failure produces; multi-line messages are folded."""
    folded = " ".join(line.strip() for line in message.splitlines() if line.strip())
    folded = folded or "unknown error"
    sys.stderr.write(f"{PROG}: error: {folded}\n")
    return code


def silence_stdout() -> None:
    """After a broken pipe, point stdout at /dev/null so the exit flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def parse(argv: list[str] | None) -> argparse.Namespace | int:
    """The parsed arguments, or the exit code when parsing ends the run (-h, --version, usage)."""
    try:
        return build_parser().parse_args(argv)
    except UsageError as exc:
        return fail(str(exc), EXIT_USER)
    except SystemExit as exc:  # -h and --version print and "exit" through argparse
        return exc.code if isinstance(exc.code, int) else EXIT_OK


def execute(args: argparse.Namespace) -> int:
    """Run the handler on an open lake; every expected failure becomes an exit code."""
    try:
        url = kv_url(args.kv)
        ensure_sqlite_parent(url)
        shown = sys.stderr.isatty() if args.progress is None else args.progress
        progress = Progress(shown, PROGRESS_DELAY)
        with progress, Lake.connect(url) as lake:
            args.handler(lake, args, Output(args.json, progress))
            if not lake.wait_for_cleanup(progress.delay):
                progress.update("Dropping committed staging entries")
    except RETRYABLE as exc:
        return fail(str(exc), EXIT_CONFLICT)
    except (BranchwaterError, UserError) as exc:
        return fail(str(exc), EXIT_USER)
    except BrokenPipeError:
        silence_stdout()
        return EXIT_BROKEN_PIPE
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename else ""
        return fail(f"{exc.strerror or exc}{where}", EXIT_USER)
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Console-script entry point; returns the exit code (the generated script exits with it)."""
    try:
        args = parse(argv)
        return args if isinstance(args, int) else execute(args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
