"""Deprecated: `python -m branchwater.engine.walkthrough` is the engine-only walk-through (the
name `demo` is the main job's, `branchwater.demo`)."""

from __future__ import annotations

import warnings

from branchwater.engine.walkthrough import main, run

__all__ = ["main", "run"]

warnings.warn(
    "branchwater.engine.demo is now branchwater.engine.walkthrough",
    DeprecationWarning,
    stacklevel=2,
)

if __name__ == "__main__":
    main()
