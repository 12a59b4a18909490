"""What a branch, ref or commit lists, as the tests compare it."""

from __future__ import annotations

from typing import Any

from branchwater.engine import Repository


def listed(view: Any, **kwargs: Any) -> list[str]:
    """The paths `view.list(**kwargs)` returns, in its order (a branch, staged changes
    included, or a ref)."""
    return [entry.path for entry in view.list(**kwargs)]


def committed(repo: Repository, ref: str) -> list[str]:
    """The paths the commit `ref` resolves to holds."""
    return listed(repo.ref(ref))
