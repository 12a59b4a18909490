"""The reader flow of the metadata-KV design: staging token → sealed tokens → committed.

A committer drops a sealed token's entries once its commit is on the branch, so a reader that
found nothing in a sealed token re-reads the branch and retries when its layers changed.
Listings are validated page by page, so a branch of any size streams in bounded memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import islice
from typing import TypeVar

from branchwater.engine.errors import NotFound, too_many_tries
from branchwater.engine.graveler.graveler import Graveler
from branchwater.engine.graveler.iterators import Layer, combine, committed_layer, visible
from branchwater.engine.graveler.model import BranchRecord, Change, Entry, RepositoryRecord
from branchwater.engine.graveler.uncommitted import uncommitted_from

PAGE_SIZE = 1000
CHANGES_PAGE_SIZE = 8192
"""Changes a page of `uncommitted()` holds: several join batches, so a page's set-up (two
KV reads, a new scan) is spread over many changes."""
T = TypeVar("T")


def same_layers(a: BranchRecord, b: BranchRecord) -> bool:
    return (
        a.staging_token == b.staging_token
        and a.sealed_tokens == b.sealed_tokens
        and a.commit_id == b.commit_id
        and a.compacted_metarange_id == b.compacted_metarange_id
    )


def committed_lookup(
    g: Graveler, repo: RepositoryRecord, metarange_id: str, path: str
) -> Entry | None:
    try:
        return g.committed(repo).get(metarange_id, path)
    except NotFound:
        return None


def lookup_below_staging(
    g: Graveler, repo: RepositoryRecord, branch: BranchRecord, path: str
) -> Entry | None:
    """The entry `path` would show if the current staging token were empty."""
    for token in branch.sealed_tokens:
        found, value = g.staging.get(token, path)
        if found:
            return value
    return committed_lookup(g, repo, g.base_metarange(repo, branch), path)


def get_branch_entry(g: Graveler, repo: RepositoryRecord, branch_name: str, path: str) -> Entry:
    entry = find_branch_entry(g, repo, branch_name, path)
    if entry is None:
        raise NotFound(f"path {path!r} not found on branch {branch_name!r} of {repo.name!r}")
    return entry


def find_branch_entry(
    g: Graveler, repo: RepositoryRecord, branch_name: str, path: str
) -> Entry | None:
    """What the branch shows at `path`, `None` if nothing."""
    branch = g.read_branch(repo, branch_name, cached=True)
    for _ in range(g.retry.attempts):
        found, value = g.staging.get(branch.staging_token, path)
        if not found:
            value = lookup_below_staging(g, repo, branch, path)
            current = g.read_branch(repo, branch_name)
            if not same_layers(current, branch):
                branch = current
                continue
        return value
    raise too_many_tries(
        f"read of {path!r} on branch {branch_name!r} of {repo.name!r}", g.retry.attempts
    )


def get_commit_entry(
    g: Graveler, repo: RepositoryRecord, commit_id: str, path: str, ref: str
) -> Entry:
    entry = committed_lookup(g, repo, g.refs.get_commit(repo, commit_id).metarange_id, path)
    if entry is None:
        raise NotFound(f"path {path!r} not found at ref {ref!r} of {repo.name!r}")
    return entry


def list_branch(
    g: Graveler, repo: RepositoryRecord, branch_name: str, prefix: str = "", after: str = ""
) -> Iterator[Entry]:
    def page(branch: BranchRecord, start: str) -> Iterator[Entry]:
        return visible(branch_stream(g, repo, branch, start, prefix))

    return _validated_pages(g, repo, branch_name, page, after, lambda e: e.path)


def list_commit(
    g: Graveler, repo: RepositoryRecord, commit_id: str, prefix: str = "", after: str = ""
) -> Iterator[Entry]:
    metarange_id = g.refs.get_commit(repo, commit_id).metarange_id
    return g.committed(repo).iterate(metarange_id, after=after, prefix=prefix)


def staging_layers(g: Graveler, branch: BranchRecord, after: str, prefix: str = "") -> list[Layer]:
    """The branch's staged layers, newest first: its staging token, then its sealed tokens."""
    tokens = (branch.staging_token, *branch.sealed_tokens)
    return [g.staging.scan(token, after, prefix) for token in tokens]


def branch_stream(
    g: Graveler, repo: RepositoryRecord, branch: BranchRecord, after: str, prefix: str
) -> Iterator[tuple[str, Entry | None]]:
    """Every layer of the branch combined, tombstones included."""
    layers = staging_layers(g, branch, after, prefix)
    base = g.base_metarange(repo, branch)
    layers.append(committed_layer(g.committed(repo).iterate(base, after=after, prefix=prefix)))
    return combine(layers)


def uncommitted_changes(g: Graveler, repo: RepositoryRecord, branch_name: str) -> Iterator[Change]:
    """What a commit now would record, page by page (see the `uncommitted` module)."""

    def page(branch: BranchRecord, start: str) -> Iterator[Change]:
        return uncommitted_from(g, repo, branch, start)

    return _validated_pages(g, repo, branch_name, page, "", _change_path, CHANGES_PAGE_SIZE)


def _change_path(change: Change) -> str:
    return change.path


def _validated_pages(
    g: Graveler,
    repo: RepositoryRecord,
    branch_name: str,
    page: Callable[[BranchRecord, str], Iterator[T]],
    after: str,
    path_of: Callable[[T], str],
    page_size: int | None = None,
) -> Iterator[T]:
    size = page_size or PAGE_SIZE
    branch = g.read_branch(repo, branch_name, cached=True)
    while True:
        for _ in range(g.retry.attempts):
            items = list(islice(page(branch, after), size))
            current = g.read_branch(repo, branch_name)
            if same_layers(current, branch):
                break
            branch = current
        else:
            raise too_many_tries(
                f"listing of branch {branch_name!r} of {repo.name!r}", g.retry.attempts
            )
        yield from items
        if len(items) < size:
            return
        after = path_of(items[-1])
