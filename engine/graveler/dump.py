"""Refs dump and restore: a repository's commits, branches and tags as one JSON file.

Committed data (ranges, metaranges) stays in the storage namespace; a dump restores into a
repository over the same namespace (or a copy of it), which must still be bare.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from branchwater.engine.errors import (
    AlreadyExists,
    CorruptedData,
    InvalidArgument,
    NotFound,
    PredicateFailed,
)
from branchwater.engine.graveler.graveler import Graveler
from branchwater.engine.graveler.model import BranchRecord, Commit, RepositoryRecord, Tag
from branchwater.engine.graveler.staging import new_staging_token

FORMAT = "branchwater-refs/1"


def dump_refs(g: Graveler, repo: RepositoryRecord, path: Path) -> int:
    commits = [json.loads(c.encode()) for c in g.refs.list_commits(repo)]
    branches = [{"name": b.name, "commit_id": b.commit_id} for b in g.refs.branches(repo)]
    tags = [dataclasses.asdict(t) for t in g.refs.list_tags(repo)]
    document = {
        "format": FORMAT,
        "repository": repo.name,
        "default_branch": repo.default_branch,
        "commits": commits,
        "branches": branches,
        "tags": tags,
    }
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(document, indent=1))
    tmp.replace(path)
    return len(commits) + len(branches) + len(tags)


def restore_refs(g: Graveler, repo: RepositoryRecord, path: Path) -> int:
    document = _load(path)
    _check_bare(g, repo)
    commits = [Commit.decode(json.dumps(raw).encode()) for raw in document["commits"]]
    for commit in commits:
        g.refs.put_commit(repo, commit)
    tags = [Tag(**raw) for raw in document["tags"]]
    for tag in tags:
        g.refs.insert_tag(repo, tag)
    branches = document["branches"]
    for raw in branches:
        _restore_branch(g, repo, raw["name"], raw["commit_id"])
    return len(commits) + len(tags) + len(branches)


def _load(path: Path) -> dict:
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        raise NotFound(f"refs dump {str(path)!r} does not exist") from None
    except (OSError, ValueError) as exc:
        raise CorruptedData(f"refs dump {str(path)!r} cannot be read: {exc}") from exc
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise CorruptedData(f"{str(path)!r} is not a Branchwater refs dump ({FORMAT})")
    return document


def _check_bare(g: Graveler, repo: RepositoryRecord) -> None:
    """Restoring over history would interleave two histories; only a fresh repository takes it."""
    commits = list(g.refs.list_commits(repo))
    branches = list(g.refs.branches(repo))
    staged = any(g.has_uncommitted(b) for b in branches)
    if len(commits) > 1 or len(branches) > 1 or staged or any(True for _ in g.refs.list_tags(repo)):
        raise InvalidArgument(
            f"repository {repo.name!r} is not bare: restore refs into a newly created repository"
        )


def _restore_branch(g: Graveler, repo: RepositoryRecord, name: str, commit_id: str) -> None:
    try:
        g.refs.insert_branch(repo, BranchRecord(name, commit_id, new_staging_token(repo, name)))
        return
    except AlreadyExists:
        pass
    branch, predicate = g.refs.get_branch(repo, name)
    try:
        g.refs.set_branch_if(repo, dataclasses.replace(branch, commit_id=commit_id), predicate)
    except PredicateFailed:
        raise AlreadyExists(
            f"branch {name!r} changed while restoring refs; restore again"
        ) from None
