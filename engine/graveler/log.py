"""Commit history: first-parent chains and full ancestry in generation order, lazily."""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from branchwater.engine.graveler.model import Commit, Repository
from branchwater.engine.graveler.refs import RefStore


def log(
    refs: RefStore, repo: Repository, commit_id: str, *, first_parent: bool = False
) -> Iterator[Commit]:
    """Newest first. Full ancestry visits each commit once, highest generation first."""
    if first_parent:
        yield from _first_parent(refs, repo, commit_id)
        return
    seen = {commit_id}
    start = refs.get_commit(repo, commit_id)
    heap = [_rank(start)]
    while heap:
        _, _, _, current = heapq.heappop(heap)
        yield current
        for parent_id in current.parents:
            if parent_id not in seen:
                seen.add(parent_id)
                heapq.heappush(heap, _rank(refs.get_commit(repo, parent_id)))


def _first_parent(refs: RefStore, repo: Repository, commit_id: str) -> Iterator[Commit]:
    current: str | None = commit_id
    while current:
        commit = refs.get_commit(repo, current)
        yield commit
        current = commit.parents[0] if commit.parents else None


def _rank(commit: Commit) -> tuple[int, float, str, Commit]:
    return (-commit.generation, -commit.creation_date.timestamp(), commit.id, commit)
