"""MkDocs hooks (`mkdocs.yml`'s `hooks:`): pages generated at build time.

`docs/reference/cli.md` holds a `<!-- cli-reference -->` marker; the build replaces it with
what `branchwater --help` and every verb's `--help` print, so the page cannot drift from the
parser (`branchwater.engine.cli.app.build_parser`). `docs/benchmarks.md` holds a
`<!-- benchmarks -->` marker; the build replaces it with the tables `tests/benchmarks/page.py`
renders from the results file `make bench` writes and the benchmark modules' declarations.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MARKER = "<!-- cli-reference -->"
WIDTH = "80"
BENCHMARKS = "<!-- benchmarks -->"
ROOT = Path(__file__).resolve().parents[1]


def commands(
    parser: argparse.ArgumentParser, depth: int = 0
) -> Iterator[tuple[int, argparse.ArgumentParser]]:
    """`parser` and every sub-command's parser below it, depth first, in declaration order."""
    yield depth, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            seen: set[int] = set()
            for sub in action.choices.values():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    yield from commands(sub, depth + 1)


def cli_reference() -> str:
    """One section per command: its name as a heading and its `--help` as printed."""
    from branchwater.engine.cli.app import build_parser

    before = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH  # argparse wraps at the terminal's width: make it fixed
    try:
        sections = []
        for depth, parser in commands(build_parser()):
            heading = "#" * min(depth + 2, 4)
            sections.append(f"{heading} `{parser.prog}`\n\n```text\n{parser.format_help()}```\n")
        return "\n".join(sections)
    finally:
        if before is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = before


def benchmarks() -> str:
    """The benchmarks page's tables (the `tests` package is the checkout's, which the
    `mkdocs` command's own path does not hold)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from tests.benchmarks import declarations, page, results

    return page.render(results.load(), declarations.suites())


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if MARKER in markdown:
        markdown = markdown.replace(MARKER, cli_reference())
    if BENCHMARKS in markdown:
        markdown = markdown.replace(BENCHMARKS, benchmarks())
    return markdown
