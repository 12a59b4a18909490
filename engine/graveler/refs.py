"""Repositories, branches, commits and tags as KV records (the KV execution plan's key schema).

Partition `graveler` holds `repos/<name>`; each repository's partition `<name>-<unique id>`
holds `branches/<id>`, `commits/<id>` and `tags/<id>`. Branch records change only through
`set_if`, which is what the lock-free commit protocol stands on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import itertools
import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import NamedTuple

from branchwater.engine.errors import (
    AlreadyExists,
    Conflict,
    InvalidArgument,
    NotFound,
    PredicateFailed,
    TooManyTries,
)
from branchwater.engine.graveler.model import BranchRecord, Commit, RepositoryRecord, Tag
from branchwater.engine.graveler.names import is_hex_id, name_key
from branchwater.engine.kv import Store

log = logging.getLogger(__name__)

GRAVELER_PARTITION = b"graveler"
REPOS_PREFIX = b"repos/"
TO_DELETE_PREFIX = b"to-delete/"
MARK_PARTS_PREFIX = b"to-delete-parts/"
TOKENS_MARK = "tokens/"
"""How the lists of staging tokens a branch update lets go of are named: one per commit,
compaction or reset, a few tokens long, never read back before they are unlisted."""
"""Parts of the to-delete lists too long for one value: `<parts id>/<index>`. Outside
`to-delete/`, so a scan of the lists never meets a part."""
MARK_PART_BYTES = 64 * 1024
"""Most bytes of one value of a to-delete list: far under DynamoDB's item limit (400 KB, key
and attribute names included; the other stores have no limit that matters here), which one
list of a repository with a few thousand branches exceeds."""
MARK_READ_ATTEMPTS = 3
"""Reads of a list whose parts changed while being read (rewritten by a growing fence, or
dropped and unlisted) before it is left for a later collection."""
NAMESPACES_PREFIX = b"namespaces/"
BRANCHES = b"branches/"
COMMITS = b"commits/"
TAGS = b"tags/"

MIN_COMMIT_PREFIX = 6
CLAIM_ATTEMPTS = 20
"""Tries at a namespace's claim: each lost one means another creator of that namespace, or
a delete of its repository, changed the claim in between."""


@dataclass(frozen=True)
class NamespaceClaim:
    """A repository's hold on where its storage namespace lies (`namespaces.location_of`)."""

    location: str
    namespace: str
    repository: str
    unique_id: str


class BranchGuard(NamedTuple):
    """The branch whose record decides when listed staging tokens may go: once it no longer
    names them (or is gone), whatever let go of them has taken effect."""

    partition: bytes
    """The repository's partition."""
    name: str


class DeletionMark(NamedTuple):
    """An entry of the to-delete list: partitions a process set out to drop, and when.

    A guarded mark is written before the branch update that lets go of its tokens, so it may
    name tokens still in use (the update is under way, or lost its race): they are dropped
    only once the branch record no longer names them.
    """

    mark: str
    partitions: list[bytes]
    marked_at: float
    guard: BranchGuard | None = None


@dataclass(frozen=True)
class ResolvedRef:
    """What a ref name points at; `branch` is set when the ref is a branch."""

    commit_id: str
    branch: BranchRecord | None = None
    branch_predicate: bytes | None = None


def commit_id_for(commit: Commit) -> str:
    """A commit's id is the hash of everything in it except the id itself."""
    body = {
        "message": commit.message,
        "metarange_id": commit.metarange_id,
        "parents": list(commit.parents),
        "metadata": dict(sorted(commit.metadata.items())),
        "creation_date": commit.creation_date.isoformat(),
        "committer": commit.committer,
        "generation": commit.generation,
    }
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


def scan_prefix(
    kv: Store, partition: bytes, prefix: bytes, after: bytes = b""
) -> Iterator[tuple[bytes, bytes]]:
    """Yield (key without prefix, value) for keys under `prefix`, strictly after `after`."""
    start = prefix + after
    for key, value in kv.scan(partition, start=start):
        if not key.startswith(prefix):
            return
        if after and key == start:
            continue
        yield key[len(prefix) :], value


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


class RefStore:
    def __init__(self, kv: Store) -> None:
        self.kv = kv
        self.clock: Callable[[], datetime] = _utc_now
        """What dates new commits: tests set a fixed clock to spread histories over months
        (retention decides on commit dates)."""

    # repositories

    def get_repository(self, name: str) -> RepositoryRecord:
        try:
            value, _ = self.kv.get(
                GRAVELER_PARTITION, REPOS_PREFIX + name_key(name, "repository name")
            )
        except NotFound:
            raise NotFound(f"repository {name!r} not found") from None
        return RepositoryRecord.decode(value)

    def insert_repository(self, repo: RepositoryRecord, mark: str, listed: bytes) -> None:
        """Write the record where none has the name (else `AlreadyExists`), only while the
        to-delete list `mark` still holds `listed` (the creation's own listing of its
        partition), in one atomic step: a cleanup that seized the list (`seize_mark`) to
        drop the partition makes it fail with `Conflict`."""
        guard = (GRAVELER_PARTITION, TO_DELETE_PREFIX + mark.encode())
        key = REPOS_PREFIX + repo.name.encode()
        try:
            created = self.kv.create_unique_guarded(
                GRAVELER_PARTITION, key, repo.encode(), guard, listed
            )
        except PredicateFailed:
            raise Conflict(
                f"repository {repo.name!r} was not created: a cleanup of unfinished drops took "
                "its creation for abandoned and drops what it wrote; create it again"
            ) from None
        if not created:
            raise AlreadyExists(f"repository {repo.name!r} already exists")

    def remove_repository(self, name: str, mark: str, listed: bytes) -> bool:
        """Remove the record only while the to-delete list `mark` still holds `listed` (the
        delete's own listing), in one atomic step; False if a cleanup seized the list
        meanwhile (`seize_mark`), which may take it off as the record was still there."""
        key = REPOS_PREFIX + name_key(name, "repository name")
        guard = (GRAVELER_PARTITION, TO_DELETE_PREFIX + mark.encode())
        return self.kv.delete_guarded(GRAVELER_PARTITION, key, guard, listed)

    def names_partition(self, partition: bytes) -> bool:
        """Whether the repository record of the name `partition` (`<name>-<unique id>`) is
        for this very partition: false once deleted, or re-created under a new unique id."""
        name = partition.decode().rpartition("-")[0]
        try:
            value, _ = self.kv.get(GRAVELER_PARTITION, REPOS_PREFIX + name.encode())
        except NotFound:
            return False
        return RepositoryRecord.decode(value).partition == partition

    def claim_namespace(self, location: str, repo: RepositoryRecord) -> bytes | None:
        """Bind `location`, where `repo`'s storage namespace lies, to this repository in one
        conditional write, so two creators of one namespace cannot both pass:
        `AlreadyExists` if another repository's name holds it. A claim by the same name (a
        creator racing for the name, which `insert_repository` settles; one a killed
        creation left; one a delete of that name under way is about to free) is taken over
        by compare-and-swap, so that delete, which frees only its own repository's claim,
        leaves this one. Returns the claim replaced, for `release_namespace` to put back."""
        key = _namespace_key(location)
        ours = _namespace_claim(location, repo)
        for _ in range(CLAIM_ATTEMPTS):
            try:
                self.kv.set_if(GRAVELER_PARTITION, key, ours, None)
                return None
            except PredicateFailed:
                pass
            try:
                held = self.kv.get(GRAVELER_PARTITION, key)
            except NotFound:
                continue
            holder = json.loads(held.value)["repository"]
            if holder != repo.name:
                raise AlreadyExists(
                    f"storage namespace {repo.storage_namespace} is already used by "
                    f"repository {holder!r}{self.absence_note(holder)}"
                )
            try:
                self.kv.set_if(GRAVELER_PARTITION, key, ours, held.predicate)
                return held.value
            except PredicateFailed:
                continue
        raise TooManyTries(
            f"claim of storage namespace {repo.storage_namespace} gave up after "
            f"{CLAIM_ATTEMPTS} attempts: other creations or deletes of repository "
            f"{repo.name!r} kept changing it; retry later"
        )

    def absence_note(self, name: str) -> str:
        """What a claim of `name` means when no repository has that name, for a refusal's
        message; empty when one has."""
        try:
            self.get_repository(name)
        except NotFound:
            return (
                f", which does not exist: being created or deleted now, or a creation or "
                f"deletion stopped part-way (creating {name!r} on its namespace finishes it, "
                "deleting it then frees the namespace)"
            )
        return ""

    def release_namespace(
        self, location: str, repo: RepositoryRecord, replaced: bytes | None = None
    ) -> None:
        """Drop `repo`'s claim on `location`, or put back the claim it `replaced`; a claim
        another creation has taken over since stays."""
        key = _namespace_key(location)
        ours = _namespace_claim(location, repo)
        with contextlib.suppress(NotFound, PredicateFailed):
            if replaced is None:
                self.kv.delete_if(GRAVELER_PARTITION, key, ours)
            else:
                self.kv.set_if(GRAVELER_PARTITION, key, replaced, ours)

    def namespace_claims(self) -> Iterator[NamespaceClaim]:
        """Every claim: of repositories that exist, and of ones being created or deleted
        right now."""
        for _, value in scan_prefix(self.kv, GRAVELER_PARTITION, NAMESPACES_PREFIX):
            yield NamespaceClaim(**json.loads(value))

    def list_repositories(self, after: str = "") -> Iterator[RepositoryRecord]:
        for _, value in scan_prefix(self.kv, GRAVELER_PARTITION, REPOS_PREFIX, after.encode()):
            yield RepositoryRecord.decode(value)

    def mark_partitions_for_deletion(
        self,
        mark: str,
        partitions: list[bytes],
        marked_at: float | None = None,
        guard: BranchGuard | None = None,
    ) -> bytes:
        """List partitions to drop under `mark`, stamped `marked_at` (epoch seconds; now by
        default) so that a drop its process abandoned can be told from one under way;
        `guard` names the branch that must let go of them first. Returns the record written,
        for a step that must not outlive it (`remove_repository`).

        A list longer than `MARK_PART_BYTES` is written in parts first and named by the
        mark's record last: a process killed in between leaves the record as it was (an
        earlier list, or none) and parts no record names (`discard_stray_parts`)."""
        when = time.time() if marked_at is None else marked_at
        document: dict[str, object] = {"marked_at": when}
        if guard is not None:
            document["guard"] = [guard.partition.decode(), guard.name]
        names = [p.decode() for p in partitions]
        key = TO_DELETE_PREFIX + mark.encode()
        inline = json.dumps({"partitions": names, **document}).encode()
        if len(inline) <= MARK_PART_BYTES:
            self.kv.set(GRAVELER_PARTITION, key, inline)
            return inline
        replaced = self._parts_named(key)
        parts = self._write_parts(mark, names)
        document["parts"] = list(parts)
        record = json.dumps(document).encode()
        self.kv.set(GRAVELER_PARTITION, key, record)
        if replaced is not None:
            self._delete_parts(*replaced)
        return record

    def _write_parts(self, mark: str, names: list[str]) -> tuple[str, int]:
        """Store `names` in parts under a new id; returns the id and how many parts."""
        parts_id = uuid.uuid4().hex
        header = {"mark": mark, "written_at": time.time()}
        budget = MARK_PART_BYTES - len(json.dumps({**header, "partitions": []}))
        chunks = _chunked(names, budget)
        for index, chunk in enumerate(chunks):
            value = json.dumps({**header, "partitions": chunk}).encode()
            self.kv.set(GRAVELER_PARTITION, _part_key(parts_id, index), value)
        return parts_id, len(chunks)

    def _parts_named(self, key: bytes) -> tuple[str, int] | None:
        """The parts the list at `key` is made of, if it is in parts."""
        try:
            value, _ = self.kv.get(GRAVELER_PARTITION, key)
        except NotFound:
            return None
        return _parts_of(json.loads(value))

    def _delete_parts(self, parts_id: str, count: int) -> None:
        for index in range(count):
            self.kv.delete(GRAVELER_PARTITION, _part_key(parts_id, index))

    def partitions_to_delete(self) -> Iterator[DeletionMark]:
        """Every list whose record is written: one whose parts are still being written (no
        record names them yet) is not a list, so a drop never acts on part of one."""
        for mark, value in scan_prefix(self.kv, GRAVELER_PARTITION, TO_DELETE_PREFIX):
            listed = self._read_mark(mark, value)
            if listed is not None:
                yield listed

    def _read_mark(self, mark: bytes, value: bytes) -> DeletionMark | None:
        """The list `value` records; its parts, if it has some, may be replaced (a fence
        grew it) or gone (dropped and unlisted) by the time they are read, so then the
        record is read again."""
        key = TO_DELETE_PREFIX + mark
        for _ in range(MARK_READ_ATTEMPTS):
            document = json.loads(value)
            names = document.get("partitions")
            parts = _parts_of(document)
            if parts is not None:
                names = self._read_parts(*parts)
            if names is not None:
                guarded = document.get("guard")
                guard = BranchGuard(guarded[0].encode(), guarded[1]) if guarded else None
                partitions = [p.encode() for p in names]
                return DeletionMark(mark.decode(), partitions, float(document["marked_at"]), guard)
            try:
                again, _ = self.kv.get(GRAVELER_PARTITION, key)
            except NotFound:
                return None
            if again == value:
                log.warning("to-delete list %s names parts that are missing; left alone", mark)
                return None
            value = again
        return None

    def _read_parts(self, parts_id: str, count: int) -> list[str] | None:
        """The names in every part, in order; None unless all `count` parts are there. Read
        one by one: a scan's batch would run on into the next lists' parts."""
        names: list[str] = []
        for index in range(count):
            try:
                value, _ = self.kv.get(GRAVELER_PARTITION, _part_key(parts_id, index))
            except NotFound:
                return None
            names += json.loads(value)["partitions"]
        return names

    def discard_stray_parts(self, older_than: float) -> int:
        """Remove the parts that no list record names (their writer was killed before
        naming them, or after replacing or unlisting the record that did) once the last of
        them is `older_than` seconds old: younger, their writer may still be writing the
        record. Returns how many parts went."""
        now = time.time()
        scanned = scan_prefix(self.kv, GRAVELER_PARTITION, MARK_PARTS_PREFIX)
        removed = 0
        for parts_id, group in itertools.groupby(scanned, key=lambda item: item[0].split(b"/")[0]):
            parts = [(key, json.loads(value)) for key, value in group]
            if max(part["written_at"] for _, part in parts) > now - older_than:
                continue
            named = self._parts_named(TO_DELETE_PREFIX + parts[0][1]["mark"].encode())
            if named is not None and named[0] == parts_id.decode():
                continue
            for key, _ in parts:
                self.kv.delete(GRAVELER_PARTITION, MARK_PARTS_PREFIX + key)
            removed += len(parts)
        return removed

    def seize_mark(self, mark: str) -> tuple[bytes, DeletionMark] | None:
        """Stamp the list's record afresh by compare-and-swap, so that a step guarded on the
        value it had (`insert_repository`, `remove_repository`) can no longer
        take effect. Returns the new record and the list it holds; None if the list changed
        or went meanwhile (its writer is at work: a later collection sees it again)."""
        key = TO_DELETE_PREFIX + mark.encode()
        try:
            value, predicate = self.kv.get(GRAVELER_PARTITION, key)
        except NotFound:
            return None
        seized = json.dumps({**json.loads(value), "seized": uuid.uuid4().hex}).encode()
        try:
            self.kv.set_if(GRAVELER_PARTITION, key, seized, predicate)
        except PredicateFailed:
            return None
        listed = self._read_mark(mark.encode(), seized)
        return None if listed is None else (seized, listed)

    def unmark_partitions_if(self, mark: str, record: bytes) -> None:
        """`unmark_partitions`, only while the list's record is still `record`: one
        rewritten since (a delete listing the partition again) stays."""
        key = TO_DELETE_PREFIX + mark.encode()
        try:
            self.kv.delete_if(GRAVELER_PARTITION, key, record)
        except (NotFound, PredicateFailed):
            return
        parts = _parts_of(json.loads(record))
        if parts is not None:
            self._delete_parts(*parts)

    def tokens_in_use(self, guard: BranchGuard) -> set[bytes]:
        """The staging tokens the guard's branch names now (none once it is gone)."""
        try:
            value, _ = self.kv.get(guard.partition, BRANCHES + guard.name.encode())
        except NotFound:
            return set()
        branch = BranchRecord.decode(value)
        return {t.encode() for t in (branch.staging_token, *branch.sealed_tokens)}

    def unmark_partitions(self, mark: str) -> None:
        """Remove the list's record, then its parts: killed in between, the parts are strays
        for `discard_stray_parts`. A token list (`TOKENS_MARK`, one per commit) is not read
        first: it is short, and one in parts is left to that sweep, saving every commit a
        KV read."""
        key = TO_DELETE_PREFIX + mark.encode()
        parts = None if mark.startswith(TOKENS_MARK) else self._parts_named(key)
        self.kv.delete(GRAVELER_PARTITION, key)
        if parts is not None:
            self._delete_parts(*parts)

    # branches

    def get_branch(self, repo: RepositoryRecord, name: str) -> tuple[BranchRecord, bytes]:
        """The branch record and the predicate a later `set_branch_if` must pass."""
        try:
            value, predicate = self.kv.get(*self.branch_address(repo, name))
        except NotFound:
            raise branch_not_found(repo, name) from None
        return BranchRecord.decode(value), predicate

    def branch_address(self, repo: RepositoryRecord, name: str) -> tuple[bytes, bytes]:
        """The branch record's KV (partition, key), to guard a write by (`Store.set_guarded`)."""
        return repo.partition, BRANCHES + name_key(name, "branch name")

    def insert_branch(
        self, repo: RepositoryRecord, branch: BranchRecord, guard: tuple[bytes, bytes] | None = None
    ) -> None:
        """Create the branch record; with `guard` (a key of the repository's partition and
        the value it must hold), only while that key holds it, in one atomic step
        (`PredicateFailed` otherwise). A lost reply is settled by a read: the record
        holding this very value (its staging token is new) was written."""
        key = BRANCHES + branch.name.encode()
        if guard is None:
            try:
                self.kv.set_unique_if(repo.partition, key, branch.encode(), None)
                return
            except PredicateFailed:
                created = False
        else:
            guard_key, expected = guard
            created = self.kv.create_unique_guarded(
                repo.partition, key, branch.encode(), (repo.partition, guard_key), expected
            )
        if not created:
            raise AlreadyExists(
                f"branch {branch.name!r} already exists in repository {repo.name!r}"
            )

    def set_branch_if(
        self, repo: RepositoryRecord, branch: BranchRecord, predicate: bytes
    ) -> bytes:
        """Replace the branch record if unchanged since read; returns the new predicate.

        Only a change of what a staged write validates (its staging token, its protection)
        fences the writes under way (`Store.set_if`); a commit's final swap, a merge's or a
        compaction's that keep the token pass them, so a busy branch's writes and its
        commits' last steps do not wait for each other."""
        value = branch.encode()
        fence = not _keeps_what_writes_validate(predicate, branch)
        address = self.branch_address(repo, branch.name)
        self.kv.set_unique_if(*address, value, predicate, fence=fence)
        return value

    def remove_branch_if(self, repo: RepositoryRecord, name: str, predicate: bytes) -> None:
        """Delete the branch record if unchanged since read (`PredicateFailed` otherwise)."""
        self.remove_branch_in(repo.partition, name, predicate)

    def branches(self, repo: RepositoryRecord, after: str = "") -> Iterator[BranchRecord]:
        """Every branch record named after `after`, by name, from one scan: listing costs no
        read per branch."""
        return (branch for branch, _ in self.branches_in(repo.partition, after))

    def branches_in(
        self, partition: bytes, after: str = ""
    ) -> Iterator[tuple[BranchRecord, bytes]]:
        """`branches` of the repository partition `partition` (its record may be gone),
        each with the predicate a later swap or removal of it must pass."""
        start = name_key(after, "branch name") if after else b""
        for _, value in scan_prefix(self.kv, partition, BRANCHES, start):
            yield BranchRecord.decode(value), value

    def remove_branch_in(self, partition: bytes, name: str, predicate: bytes) -> None:
        """`remove_branch_if` in the repository partition `partition`."""
        self.kv.delete_if(partition, BRANCHES + name_key(name, "branch name"), predicate)

    # commits

    def add_commit(
        self,
        repo: RepositoryRecord,
        parents: Sequence[Commit],
        metarange_id: str,
        message: str,
        metadata: Mapping[str, str] | None = None,
        *,
        committer: str = "",
        creation_date: datetime | None = None,
    ) -> Commit:
        """Record a new commit on `parents` (first parent first). Its generation and id are
        derived here, so every commit gets them the same way."""
        draft = Commit(
            id="",
            message=message,
            metarange_id=metarange_id,
            parents=tuple(parent.id for parent in parents),
            metadata=dict(metadata or {}),
            creation_date=creation_date or self.clock(),
            committer=committer,
            generation=max((parent.generation for parent in parents), default=0) + 1,
        )
        commit = dataclasses.replace(draft, id=commit_id_for(draft))
        self.put_commit(repo, commit)
        return commit

    def put_commit(self, repo: RepositoryRecord, commit: Commit) -> None:
        """Commits are immutable and content-addressed, so a plain `set` is idempotent."""
        self.kv.set(repo.partition, COMMITS + commit.id.encode(), commit.encode())

    def get_commit(self, repo: RepositoryRecord, commit_id: str) -> Commit:
        try:
            value, _ = self.kv.get(repo.partition, COMMITS + name_key(commit_id, "commit id"))
        except NotFound:
            raise NotFound(f"commit {commit_id!r} not found in repository {repo.name!r}") from None
        return Commit.decode(value)

    def list_commits(self, repo: RepositoryRecord) -> Iterator[Commit]:
        for _, value in scan_prefix(self.kv, repo.partition, COMMITS):
            yield Commit.decode(value)

    def find_commit_by_prefix(self, repo: RepositoryRecord, prefix: str) -> str | None:
        """The one commit id starting with `prefix` (git's abbreviated ids), if unambiguous."""
        if len(prefix) < MIN_COMMIT_PREFIX or not all(c in "0123456789abcdef" for c in prefix):
            return None
        matches = []
        for key, _ in scan_prefix(self.kv, repo.partition, COMMITS + prefix.encode()):
            matches.append(prefix + key.decode())
            if len(matches) > 1:
                raise InvalidArgument(f"commit id prefix {prefix!r} is ambiguous in {repo.name!r}")
        return matches[0] if matches else None

    # tags

    def insert_tag(self, repo: RepositoryRecord, tag: Tag) -> None:
        """Create the tag where none has its name (else `AlreadyExists`). A lost reply is
        settled by a read (`Store.set_unique_if`): the tag naming this very commit is the
        outcome this call asked for, whoever wrote it, so it counts as created; a retry
        would only meet its own write as `AlreadyExists`. Any other read stays
        `OutcomeUnknown`."""
        try:
            self.kv.set_unique_if(repo.partition, TAGS + tag.name.encode(), tag.encode(), None)
        except PredicateFailed:
            raise AlreadyExists(
                f"tag {tag.name!r} already exists in repository {repo.name!r}"
            ) from None

    def get_tag(self, repo: RepositoryRecord, name: str) -> Tag:
        try:
            value, _ = self.kv.get(repo.partition, TAGS + name_key(name, "tag name"))
        except NotFound:
            raise NotFound(f"tag {name!r} not found in repository {repo.name!r}") from None
        return Tag.decode(value)

    def remove_tag(self, repo: RepositoryRecord, name: str) -> None:
        self.get_tag(repo, name)
        self.kv.delete(repo.partition, TAGS + name.encode())

    def remove_tag_if(self, repo: RepositoryRecord, tag: Tag) -> None:
        """Delete the tag if it is still `tag` (`PredicateFailed` otherwise)."""
        self.kv.delete_if(repo.partition, TAGS + tag.name.encode(), tag.encode())

    def list_tags(self, repo: RepositoryRecord, after: str = "") -> Iterator[Tag]:
        start = name_key(after, "tag name") if after else b""
        for _, value in scan_prefix(self.kv, repo.partition, TAGS, start):
            yield Tag.decode(value)

    # resolution

    def resolve(self, repo: RepositoryRecord, ref: str) -> ResolvedRef:
        """Resolve a full commit id, a branch, a tag or an abbreviated commit id (in that
        order), with git's `~N` and `^`."""
        name_key(ref, "ref")
        assert isinstance(ref, str)
        base, steps = _split_ancestry(ref)
        resolved = self._resolve_name(repo, base)
        if not steps:
            return resolved
        commit_id = resolved.commit_id
        for _ in range(steps):
            commit = self.get_commit(repo, commit_id)
            if not commit.parents:
                raise NotFound(f"ref {ref!r} goes past the first commit of {repo.name!r}")
            commit_id = commit.parents[0]
        return ResolvedRef(commit_id)

    def _resolve_name(self, repo: RepositoryRecord, name: str) -> ResolvedRef:
        if is_hex_id(name):
            try:
                self.kv.get(repo.partition, COMMITS + name.encode())
                return ResolvedRef(name)
            except NotFound:
                pass
        try:
            value, predicate = self.kv.get(repo.partition, BRANCHES + name.encode())
            branch = BranchRecord.decode(value)
            return ResolvedRef(branch.commit_id, branch, predicate)
        except NotFound:
            pass
        try:
            return ResolvedRef(self.get_tag(repo, name).commit_id)
        except NotFound:
            pass
        found = self.find_commit_by_prefix(repo, name)
        if found:
            return ResolvedRef(found)
        raise NotFound(
            f"ref {_shown(name)} not found in repository {repo.name!r} (no branch, tag or "
            f"commit){_hint(name)}"
        )


def _shown(text: str, most: int = 80) -> str:
    """`text` quoted, cut to `most` characters: a message stays one readable line."""
    return repr(text) if len(text) <= most else f"{text[:most]!r}… ({len(text):,} characters)"


def _hint(name: str) -> str:
    """What a name no ref has may have meant: git syntax resolution does not read, or a
    commit id too short to look up."""
    if "^" in name or "~" in name:
        return "; after a ref, `~N` and `^` step back N and 1 first parents (`^N` is not read)"
    if 0 < len(name) < MIN_COMMIT_PREFIX and all(c in "0123456789abcdef" for c in name):
        return f"; an abbreviated commit id needs at least {MIN_COMMIT_PREFIX} hex digits"
    return ""


_ANCESTRY_STEPS = re.compile(r"[0-9]{0,9}")
"""What may follow `~`: ASCII digits, as git reads them (`str.isdigit` also takes `²` and
other scripts' digits, which `int` then refuses or reads), and few enough to be a count."""


def _split_ancestry(ref: str) -> tuple[str, int]:
    """Split `main~2^` into ("main", 3): first-parent steps back from the named ref."""
    steps = 0
    while ref:
        if ref.endswith("^"):
            ref, steps = ref[:-1], steps + 1
            continue
        tilde = ref.rfind("~")
        if tilde > 0 and _ANCESTRY_STEPS.fullmatch(ref[tilde + 1 :]):
            count = ref[tilde + 1 :]
            ref, steps = ref[:tilde], steps + (int(count) if count else 1)
            continue
        break
    return ref, steps


def _keeps_what_writes_validate(predicate: bytes, branch: BranchRecord) -> bool:
    """Whether the record read (`predicate`) has `branch`'s staging token and protection; a
    predicate that is no record (its swap fails anyway) is taken to change them."""
    try:
        before = BranchRecord.decode(predicate)
    except (ValueError, TypeError, KeyError):
        return False
    return (before.staging_token, before.protection) == (branch.staging_token, branch.protection)


def branch_not_found(repo: RepositoryRecord, name: str) -> NotFound:
    """The one message for a missing branch, whichever read of its record meets it."""
    return NotFound(f"branch {name!r} not found in repository {repo.name!r}")


def _chunked(names: list[str], budget: int) -> list[list[str]]:
    """`names` in runs whose JSON takes at most `budget` bytes (a name longer than that, far
    beyond any key a store takes, alone in its run)."""
    chunks: list[list[str]] = [[]]
    size = 0
    for name in names:
        cost = len(json.dumps(name)) + 2
        if chunks[-1] and size + cost > budget:
            chunks.append([])
            size = 0
        chunks[-1].append(name)
        size += cost
    return chunks


def _part_key(parts_id: str, index: int) -> bytes:
    return MARK_PARTS_PREFIX + b"%s/%08d" % (parts_id.encode(), index)


def _parts_of(document: Mapping[str, object]) -> tuple[str, int] | None:
    """The (id, count) of the parts a list record names; None for a list held whole, the
    only kind written before lists had parts."""
    parts = document.get("parts")
    if not isinstance(parts, list):
        return None
    return str(parts[0]), int(parts[1])


def _namespace_key(location: str) -> bytes:
    """A digest, not the location: a namespace may be longer than a key may be (DynamoDB)."""
    return NAMESPACES_PREFIX + hashlib.sha256(location.encode()).hexdigest().encode()


def _namespace_claim(location: str, repo: RepositoryRecord) -> bytes:
    claim = NamespaceClaim(location, repo.storage_namespace, repo.name, repo.unique_id)
    return json.dumps(dataclasses.asdict(claim), sort_keys=True).encode()
