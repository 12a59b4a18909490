"""Creating and deleting repositories so that a half-finished step is never visible.

Create lists the new partition for deletion, writes it (first commit, default branch), then
the record in `graveler`, and takes the list off; delete lists the partitions to drop,
removes the record, then drops them in the background. Until the record exists, or once it
is gone, nothing reaches the partition; a list either left behind is finished, or taken
off, by `Graveler.collect_dropped_partitions`.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timezone

from branchwater.engine import failpoints
from branchwater.engine.errors import (
    AlreadyExists,
    ConfigurationError,
    Conflict,
    NotFound,
    TooManyTries,
)
from branchwater.engine.graveler.graveler import REPOSITORY_MARK, Graveler, token_partitions
from branchwater.engine.graveler.model import BranchRecord, RepositoryRecord, is_unicode
from branchwater.engine.graveler.names import check_ref_name, check_repository_name
from branchwater.engine.graveler.namespaces import location_of, overlap
from branchwater.engine.graveler.staging import new_staging_token
from branchwater.engine.urls import redact_url

NAMESPACE_MARKER = "_branchwater/repository"


def create_repository(
    g: Graveler, name: str, storage_namespace: str, default_branch: str = "main"
) -> RepositoryRecord:
    check_new_repository(name, storage_namespace, default_branch)
    if any(True for _ in _named(g, name)):
        raise AlreadyExists(f"repository {name!r} already exists")
    repo = RepositoryRecord(
        name=name,
        storage_namespace=storage_namespace.rstrip("/"),
        default_branch=default_branch,
        unique_id=uuid.uuid4().hex[:16],
        creation_date=datetime.now(timezone.utc),
    )
    location = location_of(repo.storage_namespace)
    replaced = _claim_namespace(g, repo, location)
    mark = REPOSITORY_MARK + repo.partition.decode()
    try:
        listed = g.refs.mark_partitions_for_deletion(mark, [repo.partition])
        _write_partition(g, repo)
        failpoints.hit("repository.before_insert")
    except BaseException:
        _abandon(g, repo, mark, location, replaced)
        raise
    try:
        g.refs.insert_repository(repo, mark, listed)
    except (AlreadyExists, Conflict):
        _abandon(g, repo, mark, location, replaced)
        raise
    g.refs.unmark_partitions_if(mark, listed)
    return repo


def _write_partition(g: Graveler, repo: RepositoryRecord) -> None:
    """The first, empty commit and the default branch on it."""
    empty = g.committed(repo).write_metarange([])
    first = g.refs.add_commit(
        repo, (), empty, "Repository created", creation_date=repo.creation_date
    )
    branch = repo.default_branch
    g.refs.insert_branch(repo, BranchRecord(branch, first.id, new_staging_token(repo, branch)))


def _abandon(
    g: Graveler, repo: RepositoryRecord, mark: str, location: str, replaced: bytes | None
) -> None:
    """Undo a creation whose record surely was not written: its claim, and its partition
    (listed since the creation began). An insert whose outcome is unknown (`Unavailable`)
    leaves both: the list's cleanup reads the record to tell."""
    g.refs.release_namespace(location, repo, replaced)
    g.drop_listed_later(mark, [repo.partition])


def check_new_repository(name: object, storage_namespace: object, default_branch: object) -> None:
    """What a creation refuses before it touches the lake: its names and the form of its
    namespace (the CLI checks them before opening a lake it would start for them)."""
    check_repository_name(name)
    check_ref_name(default_branch)
    _check_namespace(str(name), storage_namespace)


def _check_namespace(name: str, storage_namespace: object) -> None:
    if not isinstance(storage_namespace, str) or "://" not in storage_namespace:
        shown: object = storage_namespace
        if isinstance(storage_namespace, str):
            shown = redact_url(storage_namespace)
        raise ConfigurationError(
            f"storage namespace {shown!r} must be a URL such as file:///data/{name} "
            f"or s3://bucket/{name}"
        )
    if not storage_namespace.isprintable() or not is_unicode(storage_namespace):
        raise ConfigurationError(
            f"storage namespace {redact_url(storage_namespace)!r} holds a control character "
            "or text that is not UTF-8: name a folder or prefix of printable characters"
        )


def _named(g: Graveler, name: str) -> list[RepositoryRecord]:
    try:
        return [g.refs.get_repository(name)]
    except NotFound:
        return []


def _claim_namespace(g: Graveler, repo: RepositoryRecord, location: str) -> bytes | None:
    """Refuse a namespace another repository uses, or one inside another's or holding
    another's (`namespaces.overlap`): their objects and GC would mix. The claim in the KV
    store settles creators racing for one namespace; checking the others' claims after
    making ours settles overlapping ones (whichever checks last sees the other, both may be
    refused, never both pass); the marker object in the namespace catches a lake of its own
    using it. Returns the claim replaced (`RefStore.claim_namespace`); any failure here puts
    it back."""
    g.objects(repo.storage_namespace)
    failpoints.hit("repository.before_claim")
    replaced = g.refs.claim_namespace(location, repo)
    try:
        failpoints.hit("repository.after_claim")
        _refuse_overlap(g, repo, location)
        _mark_namespace(g, repo)
    except BaseException:
        g.refs.release_namespace(location, repo, replaced)
        raise
    return replaced


def _refuse_overlap(g: Graveler, repo: RepositoryRecord, location: str) -> None:
    """Claims and, for repositories created before claims existed, the records."""
    others = [
        (location_of(r.storage_namespace), r.storage_namespace, r.name)
        for r in g.refs.list_repositories()
    ]
    claims = [(c.location, c.namespace, c.repository) for c in g.refs.namespace_claims()]
    for there, namespace, name in [*claims, *others]:
        if name != repo.name and overlap(location, there):
            raise AlreadyExists(
                f"storage namespace {repo.storage_namespace} overlaps {namespace}, used by "
                f"repository {name!r}{g.refs.absence_note(name)}: give each repository a "
                "namespace of its own"
            )


def _mark_namespace(g: Graveler, repo: RepositoryRecord) -> None:
    """Write the marker unless one is there, in one conditional write where the store can
    (`put_if_absent`), so of two lakes creating a repository on one namespace at once only
    one marks it; a marker of another name refuses the namespace."""
    objects = g.objects(repo.storage_namespace)

    def marker() -> bytes:
        failpoints.hit("repository.before_mark")
        return repo.name.encode()

    if objects.put_if_absent(NAMESPACE_MARKER, marker):
        return
    owner = objects.get(NAMESPACE_MARKER).decode()
    if owner != repo.name:
        raise AlreadyExists(
            f"storage namespace {repo.storage_namespace} is already used by repository {owner!r}"
        )


def delete_repository(g: Graveler, name: str) -> None:
    """List the partitions, remove the record, free the namespace's claim (found by name,
    so a link moved since creation does not hide it; only this repository's, not one a
    creation of the same name has taken over meanwhile), fence the branches, then drop the
    partitions: a crash in between leaves the list for `collect_dropped_partitions`, never a
    repository that is half there."""
    repo, mark, partitions = _list_and_remove(g, name)
    for claim in list(g.refs.namespace_claims()):
        if (claim.repository, claim.namespace) == (name, repo.storage_namespace):
            failpoints.hit("repository.before_release")
            g.refs.release_namespace(claim.location, repo)
    failpoints.hit("repository.before_drop")
    g.drop_listed_later(mark, g.fence_branches(mark, partitions))


def _list_and_remove(g: Graveler, name: str) -> tuple[RepositoryRecord, str, list[bytes]]:
    """List the repository's partitions, then remove its record only while that list is as
    written: a cleanup that found the record still there (`Graveler._repository_gone`) may
    have taken the list off meanwhile, and a record removed after that would leave the
    partitions listed nowhere. Listed again then."""
    for _ in g.retry:
        repo = g.refs.get_repository(name)
        mark = REPOSITORY_MARK + repo.partition.decode()
        partitions = [repo.partition, *token_partitions(g.refs.branches(repo))]
        listed = g.refs.mark_partitions_for_deletion(mark, partitions)
        failpoints.hit("repository.before_remove")
        if g.refs.remove_repository(name, mark, listed):
            return repo, mark, partitions
    raise TooManyTries(
        f"deleting repository {name!r} gave up after {g.retry.attempts} attempts: cleanups "
        "of unfinished drops kept taking its listing off; retry later"
    )
