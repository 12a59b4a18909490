"""`branchwater`: the git-like command line over the public API (DESIGN.md, "Command line").

Every verb is a thin handler over `Lake` / `Repository` / `Branch`. `app` assembles the parser,
opens the lake and maps errors to exit codes; `output` and `progress` render results and long
work; each verb group (`repos`, `branches`, `objects`, `commits`, `tags`, `refs`) declares its
parsers beside its handlers.
"""

from __future__ import annotations

from branchwater.engine.cli.app import main

__all__ = ["main"]
