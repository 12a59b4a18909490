"""The entry point: parse, open the lake, run the verb's handler, map failures to exit codes.

The exit codes are a contract scripts rely on: 0 ok, 1 user error (one line on stderr, never
a traceback), 2 conflict / lost races (retrying may succeed), 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import metadata as importlib_metadata
from typing import NoReturn

from branchwater.engine.api import DEFAULT_KV_URL, Lake
from branchwater.engine.cli import (
    branches,
    commits,
    compaction,
    gc,
    imports,
    objects,
    protect,
    refs,
    repos,
    tags,
    undo,
)
from branchwater.engine.cli.output import Output
from branchwater.engine.cli.progress import PROGRESS_DELAY, Progress
from branchwater.engine.cli.verbs import KV_ENV, Subparsers, UserError, global_options
from branchwater.engine.errors import (
    BranchwaterError,
    Conflict,
    LakeNotFound,
    PredicateFailed,
    TooManyTries,
)

PROG = "branchwater"

EXIT_OK = 0
EXIT_USER = 1
EXIT_CONFLICT = 2
EXIT_INTERRUPTED = 130
EXIT_BROKEN_PIPE = 141
"""128 + SIGPIPE, what a shell reports for a reader that went away (`branchwater ls | head`)."""

RETRYABLE = (Conflict, TooManyTries, PredicateFailed)
"""Errors where the request was sound but lost to someone else: exit 2, so scripts may retry."""

VERB_GROUPS: tuple[Callable[[Subparsers], None], ...] = (
    repos.register,
    branches.register,
    objects.register,
    imports.register,
    commits.register,
    undo.register,
    protect.register,
    tags.register,
    refs.register,
    compaction.register,
    gc.register,
)
"""In `-h` order. A new group (`compact`, `gc`) is a module with a `register`, listed here."""


class UsageError(Exception):
    """A command line argparse (or a handler) rejects before touching the lake."""


class _Parser(argparse.ArgumentParser):
    """Raise instead of exiting so usage errors get exit code 1 and the one-line format."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see '{self.prog} -h')")


def version() -> str:
    try:
        return importlib_metadata.version("branchwater")
    except importlib_metadata.PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    parser: argparse.ArgumentParser = _Parser(prog=PROG, description="Git for a data lake.")
    global_options(parser, on_verb=False)
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    sub = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    for register in VERB_GROUPS:
        register(sub)
    return parser


def kv_url(option: str | None) -> str:
    """`--kv`, else `$BRANCHWATER_KV_URL`, else the embedded SQLite lake under the cwd."""
    return option or os.environ.get(KV_ENV) or DEFAULT_KV_URL


def open_lake(url: str, args: argparse.Namespace) -> Lake:
    """The lake `url` names. Only a verb that may start one (`repo create`) creates it where
    there is none, once its arguments pass the verb's check; any other fails unless the lake
    is there (a SQLite file, a PostgreSQL or DynamoDB table), so a mistyped URL is reported
    rather than opened as a new empty lake."""
    creates = args.creates_lake is not None
    if creates:
        args.creates_lake(args)
    try:
        return Lake.connect(url, create=creates)
    except LakeNotFound as exc:
        raise UserError(no_lake(exc, args.kv)) from exc


def no_lake(missing: LakeNotFound, option: str | None) -> str:
    """What to do about a missing lake, naming the setting that pointed at it."""
    start = "'branchwater repo create NAME --namespace URL'"
    setting = "--kv" if option else f"${KV_ENV}" if os.environ.get(KV_ENV) else None
    if setting:
        return (
            f"no lake at {missing.where} (from {setting}): {missing.missing}; check the URL, "
            f"or start a lake there with {start}"
        )
    return (
        f"no lake here ({missing.where}: {missing.missing}): start one with {start}, or name "
        f"an existing lake with --kv or ${KV_ENV}"
    )


def fail(message: str, code: int) -> int:
    """The single stderr line every failure produces; multi-line messages are folded."""
    sys.stderr.write(f"{PROG}: error: {fold(message) or 'unknown error'}\n")
    return code


def fold(message: str) -> str:
    return " ".join(line.strip() for line in message.splitlines() if line.strip())


class Warnings(logging.Handler):
    """The engine's warnings (a merge hint of another merge, say) in the CLI's own format,
    one `branchwater: warning:` line each, rather than Python's bare last-resort output."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)

    def emit(self, record: logging.LogRecord) -> None:
        sys.stderr.write(f"{PROG}: warning: {fold(record.getMessage())}\n")


@contextmanager
def warnings_shown() -> Iterator[None]:
    """The engine's warnings on `Warnings` alone while a command runs (not also on handlers
    a program calling `main` has set up); as they were before, after it."""
    logger = logging.getLogger("branchwater")
    handler, propagate = Warnings(), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def silence_stdout() -> None:
    """After a broken pipe, point stdout at /dev/null so the exit flush cannot fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def parse(argv: list[str] | None) -> argparse.Namespace | int:
    """The parsed arguments, or the exit code when parsing ends the run (-h, --version, usage)."""
    parser = build_parser()
    try:
        args, extras = parser.parse_known_args(argv)
        trailing = getattr(args, "trailing", None)
        if extras and trailing and not any(word.startswith("-") for word in extras):
            getattr(args, trailing).extend(extras)
        elif extras:
            parser.error(f"unrecognized arguments: {' '.join(extras)}")
        return args
    except UsageError as exc:
        return fail(str(exc), EXIT_USER)
    except SystemExit as exc:  # -h and --version print and "exit" through argparse
        return exc.code if isinstance(exc.code, int) else EXIT_OK


def execute(args: argparse.Namespace) -> int:
    """Run the handler on an open lake; every expected failure becomes an exit code."""
    try:
        url = kv_url(args.kv)
        shown = sys.stderr.isatty() if args.progress is None else args.progress
        progress = Progress(shown, PROGRESS_DELAY)
        with progress, open_lake(url, args) as lake:
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
        if isinstance(args, int):
            return args
        with warnings_shown():
            return execute(args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
