"""What every verb group declares its verbs with.

Each group module has a `register(subparsers)` that adds its parsers through `verb` and
`group`, beside the handlers they name (as lakectl keeps each verb's flags by its `Run`).
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable
from typing import Any, TypeAlias

from branchwater.engine.api import DEFAULT_KV_URL, Lake
from branchwater.engine.cli.output import Output

KV_ENV = "BRANCHWATER_KV_URL"

Handler: TypeAlias = Callable[[Lake, argparse.Namespace, Output], None]
Subparsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"


class UserError(Exception):
    """A problem with the user's local files or input, reported like a `BranchwaterError`."""


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
    parent: Subparsers,
    name: str,
    handler: Handler,
    help_text: str,
    *,
    creates_lake: Callable[[argparse.Namespace], None] | None = None,
) -> argparse.ArgumentParser:
    """A verb's parser. Only a verb given `creates_lake`, the check its arguments must pass
    first (so a refused command leaves no lake behind), may start a SQLite lake where there
    is none; every other one needs the file, so a mistyped URL fails instead of making an
    empty lake (as git fails outside a repository)."""
    parser = parent.add_parser(name, help=help_text, description=help_text)
    global_options(parser, on_verb=True)
    parser.set_defaults(handler=handler, creates_lake=creates_lake)
    return parser


def trailing_list(parser: argparse.ArgumentParser, dest: str, nargs: str, **kwargs: Any) -> None:
    """The verb's last positional, a list: argparse fills it where the positionals first
    stand, empty before an option (`restore REPO BRANCH --source REF PATH`), and then calls
    what follows the option unrecognized; `app.parse` gives those words to this list."""
    parser.add_argument(dest, nargs=nargs, **kwargs)
    parser.set_defaults(trailing=dest)


def group(parent: Subparsers, name: str, help_text: str) -> Subparsers:
    parser = parent.add_parser(name, help=help_text, description=help_text)
    return parser.add_subparsers(title="commands", metavar="COMMAND", required=True)


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


def count(text: str) -> int:
    """A positive whole number of items to show or walk: one beyond `sys.maxsize`, more than
    any listing holds, counts as that (the most `islice` takes)."""
    return min(positive_int(text), sys.maxsize)


def fraction(text: str) -> float:
    """A share between 0 and 1, inclusive."""
    try:
        number = float(text)
    except ValueError:
        number = math.nan
    if not 0 <= number <= 1:
        raise argparse.ArgumentTypeError(f"expected a fraction between 0 and 1, got {text!r}")
    return number


def add_meta(parser: argparse.ArgumentParser) -> None:
    """`--meta K=V`, repeatable, for every verb that records user metadata."""
    parser.add_argument("--meta", action="append", type=key_value, default=[], metavar="K=V")
