"""Python source read as a syntax tree, safe inside a test process that runs Spark."""

from __future__ import annotations

import ast
import gc


def parse(source: str) -> ast.Module:
    """`ast.parse` with the garbage collector held off.

    On CPython 3.11.7 the parser's recursion count is shared: a collection during
    `ast.parse` can run a finalizer that parses too, or lets another thread run one (py4j's,
    logging a failed send with a traceback, whose carets come from `ast.parse`), and the
    outer parse then fails with `SystemError: AST constructor recursion depth mismatch`."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        return ast.parse(source)
    finally:
        if enabled:
            gc.enable()
