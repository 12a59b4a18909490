"""Tag creation, and the rule it shares with branch creation: a branch and a tag never share
a name, since resolution would read one and hide the other (lakeFS refuses such a branch)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Literal

from branchwater.engine.errors import AlreadyExists, NotFound, PredicateFailed
from branchwater.engine.graveler.fence import claim
from branchwater.engine.graveler.graveler import Graveler
from branchwater.engine.graveler.model import RepositoryRecord, Tag
from branchwater.engine.graveler.names import check_ref_name


def create_tag(g: Graveler, repo: RepositoryRecord, name: str, ref: str) -> Tag:
    check_ref_name(name, "tag")
    tag = Tag(name, g.refs.resolve(repo, ref).commit_id)
    claim(g, repo, tag.commit_id)
    g.refs.insert_tag(repo, tag)
    refuse_shadowing(g, repo, "tag", name, lambda: _take_back_tag(g, repo, tag))
    return tag


RefKind = Literal["branch", "tag"]


def refuse_shadowing(
    g: Graveler, repo: RepositoryRecord, kind: RefKind, name: str, take_back: Callable[[], None]
) -> None:
    """Checked after the insert, so that of a branch and a tag created at once under one name
    at least one sees the other; that one takes itself back and is refused."""
    other: RefKind = "tag" if kind == "branch" else "branch"
    if not _exists(g, repo, other, name):
        return
    take_back()
    raise AlreadyExists(
        f"a {other} named {name!r} exists in repository {repo.name!r}: a {kind} of that name "
        f"would hide it (or be hidden) wherever a ref names it; choose another name"
    )


def _exists(g: Graveler, repo: RepositoryRecord, kind: RefKind, name: str) -> bool:
    try:
        if kind == "tag":
            g.refs.get_tag(repo, name)
        else:
            g.refs.get_branch(repo, name)
    except NotFound:
        return False
    return True


def _take_back_tag(g: Graveler, repo: RepositoryRecord, tag: Tag) -> None:
    with contextlib.suppress(NotFound, PredicateFailed):
        g.refs.remove_tag_if(repo, tag)
