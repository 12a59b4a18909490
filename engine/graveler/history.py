"""Commit history: the log and merge bases, both walking ancestry in one order.

That order is highest generation first, then newest, then by id: a commit comes after all
its descendants, so a merge-base walk can stop at the first commit both sides reach, and the
log reads commits only as its caller consumes them.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator

from branchwater.engine.errors import NotFound
from branchwater.engine.graveler.model import Commit, RepositoryRecord
from branchwater.engine.graveler.refs import RefStore

Ranked = tuple[int, float, str, Commit]
"""A commit as a heap item: the smallest comes first in history order."""


def log(
    refs: RefStore, repo: RepositoryRecord, commit_id: str, *, first_parent: bool = False
) -> Iterator[Commit]:
    """Newest first. Full ancestry visits each commit once, highest generation first."""
    if first_parent:
        yield from _first_parent(refs, repo, commit_id)
        return
    seen = {commit_id}
    heap = [_rank(refs.get_commit(repo, commit_id))]
    while heap:
        current = heapq.heappop(heap)[-1]
        yield current
        for parent_id in current.parents:
            if parent_id not in seen:
                seen.add(parent_id)
                heapq.heappush(heap, _rank(refs.get_commit(repo, parent_id)))


def find_merge_base(refs: RefStore, repo: RepositoryRecord, left: str, right: str) -> Commit:
    """The first commit reachable from both, walking by generation from the newest."""
    marks: dict[str, int] = {left: 1}
    marks[right] = marks.get(right, 0) | 2
    heap = [_rank(refs.get_commit(repo, cid)) for cid in {left, right}]
    heapq.heapify(heap)
    while heap:
        commit = heapq.heappop(heap)[-1]
        mark = marks[commit.id]
        if mark == 3:
            return commit
        for parent in commit.parents:
            before = marks.get(parent, 0)
            if before | mark != before:
                marks[parent] = before | mark
                heapq.heappush(heap, _rank(refs.get_commit(repo, parent)))
    raise NotFound(f"commits {left[:12]} and {right[:12]} of {repo.name!r} share no ancestor")


def _first_parent(refs: RefStore, repo: RepositoryRecord, commit_id: str) -> Iterator[Commit]:
    current: str | None = commit_id
    while current:
        commit = refs.get_commit(repo, current)
        yield commit
        current = commit.parents[0] if commit.parents else None


def _rank(commit: Commit) -> Ranked:
    return (-commit.generation, -commit.creation_date.timestamp(), commit.id, commit)
