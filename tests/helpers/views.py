"""What a branch, ref or commit lists, as the tests compare it, and a repository with
work under way to compare after a server went away."""

from __future__ import annotations

from typing import Any

from branchwater.engine import Lake, Repository


def listed(view: Any, **kwargs: Any) -> list[str]:
    """The paths `view.list(**kwargs)` returns, in its order (a branch, staged changes
    included, or a ref)."""
    return [entry.path for entry in view.list(**kwargs)]


def committed(repo: Repository, ref: str) -> list[str]:
    """The paths the commit `ref` resolves to holds."""
    return listed(repo.ref(ref))


def work_under_way(lake: Lake, name: str, namespace: str) -> Repository:
    """`main` with `a` committed and `b` staged; `feature` with `f` committed, to merge."""
    repo = lake.create_repository(name, storage_namespace=namespace)
    main = repo.branch("main")
    main.upload("a", b"a")
    main.commit("a")
    feature = repo.create_branch("feature", "main")
    feature.upload("f", b"f")
    feature.commit("f")
    main.upload("b", b"b")
    return repo
