"""Commit history: the log (filtered by metadata) and merge bases, both walking ancestry in
one order.

That order is highest generation first, then newest, then by id: a commit comes after all
its descendants, so a merge-base walk can stop at the first commit both sides reach, and the
log reads commits only as its caller consumes them.
"""

from __future__ import annotations

import heapq
import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import TypeVar

from branchwater.engine.errors import InvalidArgument, NotFound
from branchwater.engine.graveler.committed import EMPTY_METARANGE_ID, CommittedStore
from branchwater.engine.graveler.model import Commit, RepositoryRecord
from branchwater.engine.graveler.refs import RefStore

T = TypeVar("T")
Ranked = tuple[int, float, str, Commit]
"""A commit as a heap item: the smallest comes first in history order."""
_LEFT, _RIGHT, _STALE = 1, 2, 4
_BOTH = _LEFT | _RIGHT


@dataclass(frozen=True)
class LogFilter:
    """What `Repository.log` keeps of a history walk, in the order it applies them: the
    walk (`first_parent`, bounded to `depth` commits), paging (`after`), the filters
    (`where`, `paths`) and at most `limit` matches."""

    first_parent: bool = False
    limit: int | None = None
    after: str | None = None
    where: Mapping[str, str] | None = None
    paths: Sequence[str] | None = None
    depth: int | None = None


def filtered_log(
    refs: RefStore,
    committed: CommittedStore | None,
    repo: RepositoryRecord,
    commit_id: str,
    spec: LogFilter,
) -> Iterator[Commit]:
    """The commits of `commit_id`'s history `spec` keeps, read as they are consumed. Every
    argument is checked now (`InvalidArgument`), not at the first `next`; `committed` is
    needed only to filter by `paths`."""
    commits = bounded(
        log(refs, repo, commit_id, first_parent=spec.first_parent), spec.depth, "depth"
    )
    if spec.after:
        commits = _after(commits, refs.get_commit(repo, spec.after))
    if spec.where is not None:
        commits = matching(commits, spec.where)
    if spec.paths is not None:
        assert committed is not None, "a paths filter reads the commits' ranges"
        commits = touching(committed, refs, repo, commits, spec.paths)
    return bounded(commits, spec.limit, "limit")


def _after(commits: Iterator[Commit], after: Commit) -> Iterator[Commit]:
    """The commits after `after`; `NotFound` once the walk, in history order, has passed
    where `after` would be without meeting it: a commit of another line of history costs
    the commits above it, not the whole history."""
    passed = _rank(after)[:3]
    for commit in commits:
        if commit.id == after.id:
            yield from commits
            return
        if _rank(commit)[:3] > passed:
            break
    raise NotFound(f"commit {after.id!r} is not in that history")


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


def bounded(items: Iterable[T], count: int | None, name: str, what: str = "commits") -> Iterator[T]:
    """The first `count` items (all of them for None); `InvalidArgument` naming the
    argument for anything but a whole number of at least 0. Nothing listed is longer than
    `sys.maxsize`, the most `islice` takes, so a larger count is as good as none."""
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
        raise InvalidArgument(f"{name} must be a number of {what} (0 or more), not {count!r}")
    return islice(items, None if count is None else min(count, sys.maxsize))


def matching(commits: Iterable[Commit], where: Mapping[str, str]) -> Iterator[Commit]:
    """The commits whose metadata holds every key of `where` (checked now) with that value,
    as they come: a caller that wants the first match reads no further (git log --grep, on
    metadata)."""
    wanted = check_where(where)
    return (c for c in commits if all(c.metadata.get(k) == v for k, v in wanted))


def check_where(where: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """A metadata filter as pairs of strings; `InvalidArgument` for anything else, since a
    filter that cannot match (a number where metadata holds text) would find nothing quietly."""
    if not isinstance(where, Mapping):
        raise InvalidArgument(f"where must map metadata keys to values, not {type(where).__name__}")
    pairs = tuple(where.items())
    for key, value in pairs:
        if not isinstance(key, str) or not key or not isinstance(value, str):
            raise InvalidArgument(
                f"where filters on text: key {key!r} and value {value!r} must be strings "
                "(and the key non-empty)"
            )
    return pairs


def touching(
    committed: CommittedStore,
    refs: RefStore,
    repo: RepositoryRecord,
    commits: Iterable[Commit],
    paths: Sequence[str],
) -> Iterator[Commit]:
    """The commits that change a path starting with one of `paths` (a path, or a folder such
    as `orders/`, checked now) against their first parent (a root commit, against the empty
    tree), as they come. Each commit costs a diff started at each prefix and stopped at its
    first change: unchanged ranges are never read."""
    return _touching(committed, refs, repo, commits, check_paths(paths))


def _touching(
    committed: CommittedStore,
    refs: RefStore,
    repo: RepositoryRecord,
    commits: Iterable[Commit],
    prefixes: tuple[str, ...],
) -> Iterator[Commit]:
    for commit in commits:
        parent = refs.get_commit(repo, commit.parents[0]).metarange_id if commit.parents else None
        before = parent or EMPTY_METARANGE_ID
        if before != commit.metarange_id and any(
            _changes_under(committed, before, commit.metarange_id, p) for p in prefixes
        ):
            yield commit


def _changes_under(committed: CommittedStore, left: str, right: str, prefix: str) -> bool:
    """True when a path under `prefix` differs. Changes come in path order from just before
    `prefix`, so the first one at or past it decides."""
    for change in committed.diff(left, right, after=prefix[:-1]):
        if change.path >= prefix:
            return change.path.startswith(prefix)
    return False


def check_paths(paths: Sequence[str]) -> tuple[str, ...]:
    """Path prefixes as non-empty strings; `InvalidArgument` for anything else (a bare string
    would be taken letter by letter)."""
    if isinstance(paths, (str, bytes)) or not isinstance(paths, Sequence):
        raise InvalidArgument(f"paths must be a list of path prefixes, not {paths!r}")
    for path in paths:
        if not isinstance(path, str) or not path:
            raise InvalidArgument(f"paths holds non-empty strings, not {path!r}")
    return tuple(paths)


def find_merge_base(refs: RefStore, repo: RepositoryRecord, left: str, right: str) -> Commit:
    """A best common ancestor: the newest of `find_merge_bases` (git merge-base)."""
    bases = find_merge_bases(refs, repo, (left,), (right,))
    if not bases:
        raise NotFound(f"commits {left[:12]} and {right[:12]} of {repo.name!r} share no ancestor")
    return bases[0]


def find_merge_bases(
    refs: RefStore, repo: RepositoryRecord, left: Sequence[str], right: Sequence[str]
) -> list[Commit]:
    """Every best common ancestor of the commits `left` and those `right` (git merge-base
    --all): reachable from both sides and no ancestor of another such, newest first. One
    unless the history criss-crosses; none if the histories are unrelated.

    The walk marks what each side reaches; a commit both reach is a base, unless a base found
    before reaches it (marked stale). In generation order every commit's marks are complete
    when it is taken, so the walk stops as soon as only stale commits are left.
    """
    marks: dict[str, int] = {}
    for side, ids in ((_LEFT, left), (_RIGHT, right)):
        for commit_id in ids:
            marks[commit_id] = marks.get(commit_id, 0) | side
    heap = [_rank(refs.get_commit(repo, commit_id)) for commit_id in marks]
    heapq.heapify(heap)
    bases: list[Commit] = []
    while any(not marks[item[2]] & _STALE for item in heap):
        commit = heapq.heappop(heap)[-1]
        mark = marks[commit.id]
        if mark & _BOTH == _BOTH and not mark & _STALE:
            bases.append(commit)
            mark = marks[commit.id] = mark | _STALE
        for parent in commit.parents:
            before = marks.get(parent, 0)
            if before | mark != before:
                marks[parent] = before | mark
                heapq.heappush(heap, _rank(refs.get_commit(repo, parent)))
    return bases


def is_ancestor(refs: RefStore, repo: RepositoryRecord, ancestor: str, commit_id: str) -> bool:
    """Whether `ancestor` is `commit_id` or one of its ancestors (git merge-base
    --is-ancestor): then it is their one best common ancestor."""
    bases = find_merge_bases(refs, repo, (ancestor,), (commit_id,))
    return [base.id for base in bases] == [ancestor]


def _first_parent(refs: RefStore, repo: RepositoryRecord, commit_id: str) -> Iterator[Commit]:
    current: str | None = commit_id
    while current:
        commit = refs.get_commit(repo, current)
        yield commit
        current = commit.parents[0] if commit.parents else None


def _rank(commit: Commit) -> Ranked:
    return (-commit.generation, -commit.creation_date.timestamp(), commit.id, commit)
