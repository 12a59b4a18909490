"""Refs dump and restore: a repository's commits, branches and tags as one JSON file.

Committed data (ranges, metaranges) stays in the storage namespace; a dump restores into a
repository over the same namespace (or a copy of it), which must still be bare and, as the
namespace's marker names its repository, have the same name. A dump is input like any other,
read and checked whole before anything is written, so a damaged or hostile one is refused,
never half restored: every id's form (a metarange id becomes an object key), every field's
type, each commit's id and generation against its content, no branch or tag twice nor a
branch and a tag of one name, every parent and ref target present, and every metarange in
the namespace.

A restore stopped part-way (a killed process) is finished by restoring the same dump again:
the repository's `RESTORE_KEY` names the dump whose records it may hold besides its own first
commit, and a retry accepts those records, identical, and nothing else.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import stat
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from branchwater.engine.errors import (
    AlreadyExists,
    CorruptedData,
    InvalidArgument,
    NotFound,
    PredicateFailed,
)
from branchwater.engine.graveler import protection
from branchwater.engine.graveler.committed.format import METARANGES_PREFIX, check_id, metarange_key
from branchwater.engine.graveler.fence import claim, claim_again
from branchwater.engine.graveler.graveler import Graveler
from branchwater.engine.graveler.model import (
    BranchRecord,
    Commit,
    RepositoryRecord,
    Tag,
    check_commit_arguments,
)
from branchwater.engine.graveler.names import check_ref_name
from branchwater.engine.graveler.refs import commit_id_for
from branchwater.engine.graveler.staging import new_staging_token
from branchwater.engine.kv import Store

FORMAT = "branchwater-refs/1"
RESTORE_KEY = b"refs-restore"
"""In a repository's partition while a restore writes: its `_Started`. Removed after the last
write, so a finished restore leaves a repository that is not bare, as any other does."""
RESTORED_KEY = b"refs-restored"
"""When the repository's latest restore ended (ISO, the restoring process's clock), written
before `RESTORE_KEY` goes: its records name objects no GC mark made before then saw held
(`restores`)."""


@dataclass(frozen=True)
class Restores:
    """What a GC sweep must know of restores of refs: one under way, or when the latest
    ended. A restore's commits and refs name objects that sat unreferenced in the namespace
    until they were written, so a mark made before them would delete what they hold."""

    under_way: bool
    ended: datetime | None


def restores(kv: Store, repo: RepositoryRecord) -> Restores:
    try:
        kv.get(repo.partition, RESTORE_KEY)
        under_way = True
    except NotFound:
        under_way = False
    try:
        ended: datetime | None = datetime.fromisoformat(
            kv.get(repo.partition, RESTORED_KEY).value.decode()
        )
    except NotFound:
        ended = None
    return Restores(under_way, ended)


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
    try:
        _write(path, json.dumps(document, indent=1))
    except ValueError as exc:  # no file name, a NUL, a lone surrogate
        raise InvalidArgument(f"cannot dump refs to {str(path)!r}: {exc}") from None
    except OSError as exc:
        raise InvalidArgument(f"cannot dump refs to {str(path)!r}: {exc.strerror or exc}") from None
    return len(commits) + len(branches) + len(tags)


def _write(path: Path, text: str) -> None:
    """A regular file is replaced whole (a dump cut short leaves the old one); a link is
    followed, as a shell's `>` follows it, rather than replaced by a file; a pipe or a device
    is written in place, opened by the name given: `/dev/stdout` on a pipe is a link to
    `pipe:[N]`, a name no directory holds; a directory is refused."""
    kind = _kind(path)
    if kind is not None and stat.S_ISDIR(kind):
        raise IsADirectoryError(errno.EISDIR, "it is a directory: name a file")
    if kind is not None and not stat.S_ISREG(kind):
        with open(path, "w") as f:
            f.write(text)
        return
    target = path.resolve() if path.is_symlink() else path
    tmp = target.with_name(target.name + ".tmp")
    try:
        tmp.write_text(text)
        tmp.replace(target)
    finally:
        tmp.unlink(missing_ok=True)


def _kind(path: Path) -> int | None:
    """The mode of what `path` names, links followed; None if nothing (a link to nothing
    too: writing it creates the file it names)."""
    try:
        return os.stat(path).st_mode
    except FileNotFoundError:
        return None


@dataclass(frozen=True)
class _Dump:
    """A refs dump, read and checked whole before anything is written from it."""

    commits: list[Commit]
    tags: list[Tag]
    branches: list[tuple[str, str]]

    def digest(self) -> str:
        """The records' hash, in no particular order: a retry must bring the same records,
        however the file lays them out."""
        records = [
            sorted(commit.encode().decode() for commit in self.commits),
            sorted(tag.encode().decode() for tag in self.tags),
            sorted(self.branches),
        ]
        return hashlib.sha256(json.dumps(records).encode()).hexdigest()


@dataclass(frozen=True)
class _Started:
    """A restore under way: the digest of its dump, and the bare repository's one commit
    (`""` if none), which its default branch may still point at until the restore moves it."""

    dump: str
    base: str

    def encode(self) -> bytes:
        return json.dumps(dataclasses.asdict(self), sort_keys=True).encode()


def restore_refs(
    g: Graveler,
    repo: RepositoryRecord,
    path: Path,
    before_writes: Callable[[], None] = lambda: None,
) -> int:
    """Restore the dump at `path`; `before_writes` runs once the restore is marked under way
    (`RESTORE_KEY`), before its first record: the API's refuses while a GC run holds the
    repository. Marked first, then checked, as a sweep takes its lease and then reads the
    mark: of the two, at least one sees the other. Refused there, a restore that made the
    mark takes it back."""
    dump = _read(path)
    _check_metaranges(g, repo, path, dump.commits)
    _check_default_branch_untagged(repo, path, dump)
    started, predicate = _check_restorable(g, repo, path, dump)
    for name, commit_id in dump.branches:
        _check_may_move(g, repo, name, commit_id)
    _mark_started(g, repo, started, predicate)
    try:
        before_writes()
    except BaseException:
        if predicate is None:
            with contextlib.suppress(NotFound, PredicateFailed):
                g.kv.delete_if(repo.partition, RESTORE_KEY, started.encode())
        raise
    claim(g, repo, *_targets(dump))
    for commit in dump.commits:
        g.refs.put_commit(repo, commit)
    for tag in dump.tags:
        claim_again(g, repo, tag.commit_id)
        _restore_tag(g, repo, tag)
    for name, commit_id in dump.branches:
        claim_again(g, repo, commit_id)
        _restore_branch(g, repo, name, commit_id)
    g.kv.set(repo.partition, RESTORED_KEY, datetime.now(UTC).isoformat().encode())
    g.kv.delete(repo.partition, RESTORE_KEY)
    return len(dump.commits) + len(dump.tags) + len(dump.branches)


def _targets(dump: _Dump) -> list[str]:
    """The commits the restore's branches and tags point at, claimed as every move onto a
    commit is (`fence.claim`): a restore retried after retention expired them, or racing
    a retention run, is `CommitExpired` rather than refs landed on collected data."""
    return sorted({commit_id for _, commit_id in dump.branches} | {t.commit_id for t in dump.tags})


def _read(path: Path) -> _Dump:
    """The dump at `path`, or `CorruptedData` naming what is wrong in it: a damaged dump must
    fail before its first record is written, or the repository is no longer bare and the
    restore cannot be run again."""
    document = _load(path)
    try:
        commits = [_commit(raw) for raw in document["commits"]]
        tags = [Tag(**raw) for raw in document["tags"]]
        branches = [(raw["name"], raw["commit_id"]) for raw in document["branches"]]
        for name, commit_id in branches:
            _check_ref(name, commit_id, "branch")
        for tag in tags:
            _check_ref(tag.name, tag.commit_id, "tag")
        _check_unique("branch", [name for name, _ in branches])
        _check_unique("tag", [tag.name for tag in tags])
    except KeyError as exc:
        raise CorruptedData(f"refs dump {str(path)!r} is damaged: no field {exc}") from None
    except (TypeError, ValueError, AttributeError) as exc:
        raise CorruptedData(f"refs dump {str(path)!r} is damaged: {exc}") from None
    _check_not_shadowing(path, [name for name, _ in branches], [tag.name for tag in tags])
    _check_history(path, commits, [*branches, *((f"tag {t.name}", t.commit_id) for t in tags)])
    return _Dump(commits, tags, branches)


def _commit(raw: object) -> Commit:
    """A commit record whose every field has the type and form a commit made here has."""
    commit = Commit.decode(json.dumps(raw).encode())
    check_id("commit", commit.id)
    if not isinstance(commit.metadata, dict):
        raise InvalidArgument(f"commit {commit.id[:12]}'s metadata must be an object")
    check_commit_arguments(commit.message, commit.metadata, commit.committer, sized=False)
    check_id(f"commit {commit.id[:12]}'s metarange", commit.metarange_id)
    for parent in commit.parents:
        check_id(f"commit {commit.id[:12]}'s parent", parent)
    if not isinstance(commit.generation, int) or isinstance(commit.generation, bool):
        raise InvalidArgument(f"commit {commit.id[:12]}'s generation must be an integer")
    return commit


def _check_ref(name: object, commit_id: object, kind: str) -> None:
    check_ref_name(name, kind)
    check_id(f"{kind} {name}'s commit", commit_id)


def _check_unique(kind: str, names: list[str]) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise InvalidArgument(f"{kind} {name!r} is in it twice")
        seen.add(name)


def _check_not_shadowing(path: Path, branches: list[str], tags: list[str]) -> None:
    """No branch and tag share a name: reads of the name would show one and hide the other,
    which is why creating either is refused (`tags.refuse_shadowing`). A dump taken before
    that rule may hold both."""
    shared = sorted(set(branches) & set(tags))
    if shared:
        raise CorruptedData(
            f"refs dump {str(path)!r} holds a branch and a tag both named {shared[0]!r}, which "
            "a repository refuses (reads of the name would show one and hide the other); "
            "rename or drop one of them in the dump"
        )


def _load(path: Path) -> dict:
    try:
        document = json.loads(path.read_text())
    except FileNotFoundError:
        raise NotFound(f"refs dump {str(path)!r} does not exist") from None
    except (OSError, ValueError, RecursionError) as exc:
        raise CorruptedData(f"refs dump {str(path)!r} cannot be read: {exc}") from exc
    if not isinstance(document, dict) or document.get("format") != FORMAT:
        raise CorruptedData(f"{str(path)!r} is not a Branchwater refs dump ({FORMAT})")
    return document


def _check_history(path: Path, commits: list[Commit], refs: list[tuple[str, str]]) -> None:
    """Every commit's id is its content's, its parents are in the dump, and so is every
    branch's and tag's commit."""
    by_id = {commit.id: commit for commit in commits}
    for commit in commits:
        if commit_id_for(commit) != commit.id:
            raise CorruptedData(
                f"refs dump {str(path)!r} is damaged: commit {commit.id[:12]} does not hold "
                "the content its id was computed from"
            )
        missing = [parent for parent in commit.parents if parent not in by_id]
        if missing:
            raise CorruptedData(
                f"refs dump {str(path)!r} is incomplete: commit {commit.id[:12]}'s parent "
                f"{missing[0][:12]} is not in it"
            )
        generation = max((by_id[p].generation for p in commit.parents), default=0) + 1
        if commit.generation != generation:
            raise CorruptedData(
                f"refs dump {str(path)!r} is damaged: commit {commit.id[:12]} has generation "
                f"{commit.generation}, but its parents make it {generation}"
            )
    for name, commit_id in refs:
        if commit_id not in by_id:
            raise CorruptedData(
                f"refs dump {str(path)!r} is incomplete: {name!r} points at commit "
                f"{str(commit_id)[:12]}, which is not in it"
            )


def _check_metaranges(
    g: Graveler, repo: RepositoryRecord, path: Path, commits: list[Commit]
) -> None:
    """Every commit's metarange is in the namespace (one listing), or reads of it would fail."""
    stored = {
        info.key for info in g.objects(repo.storage_namespace).list_objects(METARANGES_PREFIX)
    }
    for commit in commits:
        if metarange_key(commit.metarange_id) not in stored:
            raise CorruptedData(
                f"refs dump {str(path)!r} does not fit {repo.storage_namespace}: commit "
                f"{commit.id[:12]}'s metarange {commit.metarange_id[:12]} is not there; restore "
                "into a repository over the namespace the dump was taken from, or a copy of it"
            )


def _check_restorable(
    g: Graveler, repo: RepositoryRecord, path: Path, dump: _Dump
) -> tuple[_Started, bytes | None]:
    """The restore to record before the first write, and the predicate to record it under.
    Restoring over history would interleave two histories: only a bare repository takes a
    dump, or one holding besides its first commit records of this very dump, which a stopped
    restore of it wrote. Another dump's mark refuses even where the repository still looks
    bare: its restore may have recorded it and be about to write."""
    started, predicate = _read_started(g, repo)
    if started is not None and started.dump != dump.digest():
        raise InvalidArgument(
            f"repository {repo.name!r} is not bare: it holds part of another refs dump than "
            f"{str(path)!r}, whose restore is under way or stopped part-way; restore into a "
            "newly created repository, or, if that restore stopped, restore its dump again "
            "to finish it"
        )
    base = _bare_commit(g, repo)
    if base is not None:
        return _Started(dump.digest(), base), predicate
    if started is None:
        raise _not_bare(repo)
    _check_only_records_of(g, repo, dump, started.base)
    return started, predicate


def _check_default_branch_untagged(repo: RepositoryRecord, path: Path, dump: _Dump) -> None:
    """The repository's default branch stays whether the dump names it or not (a dump taken
    where another was the default may not): a tag of its name would shadow it."""
    if any(tag.name == repo.default_branch for tag in dump.tags):
        raise CorruptedData(
            f"refs dump {str(path)!r} does not fit repository {repo.name!r}: its tag "
            f"{repo.default_branch!r} is named as the repository's default branch, and a branch "
            "and a tag never share a name; restore into a repository created with another "
            "default branch"
        )


def _read_started(g: Graveler, repo: RepositoryRecord) -> tuple[_Started | None, bytes | None]:
    try:
        value, predicate = g.kv.get(repo.partition, RESTORE_KEY)
    except NotFound:
        return None, None
    return _Started(**json.loads(value)), predicate


def _bare_commit(g: Graveler, repo: RepositoryRecord) -> str | None:
    """The bare repository's one commit (`""` if it has none), or None if it is not bare."""
    commits = list(g.refs.list_commits(repo))
    branches = list(g.refs.branches(repo))
    staged = any(g.has_uncommitted(b) for b in branches)
    if len(commits) > 1 or len(branches) > 1 or staged or any(True for _ in g.refs.list_tags(repo)):
        return None
    return commits[0].id if commits else ""


def _check_only_records_of(g: Graveler, repo: RepositoryRecord, dump: _Dump, base: str) -> None:
    """Every commit, tag and branch is the dump's, identical, or the bare repository's own
    first commit and default branch on it; nothing is staged."""
    commits = {commit.id: commit.encode() for commit in dump.commits}
    tags = {tag.name: tag for tag in dump.tags}
    branches = dict(dump.branches)
    if any(c.id != base and commits.get(c.id) != c.encode() for c in g.refs.list_commits(repo)):
        raise _not_bare(repo)
    if any(tags.get(tag.name) != tag for tag in g.refs.list_tags(repo)):
        raise _not_bare(repo)
    for branch in g.refs.branches(repo):
        allowed = {branches.get(branch.name)}
        if branch.name == repo.default_branch:
            allowed.add(base)
        if branch.commit_id not in allowed or g.has_uncommitted(branch):
            raise _not_bare(repo)


def _not_bare(repo: RepositoryRecord) -> InvalidArgument:
    return InvalidArgument(
        f"repository {repo.name!r} is not bare: restore refs into a newly created repository"
    )


def _mark_started(
    g: Graveler, repo: RepositoryRecord, started: _Started, predicate: bytes | None
) -> None:
    """Record the restore before its first write, so a retry after a kill can tell its
    records from anyone else's; under the predicate read, so of two restores of different
    dumps racing into one bare repository only one goes on: the other finds its mark and is
    refused (`_check_restorable`), or fails here. Two restores of one dump both go on: their
    writes are the same."""
    value = started.encode()
    if predicate == value:
        return
    try:
        g.kv.set_if(repo.partition, RESTORE_KEY, value, predicate)
    except PredicateFailed:
        raise AlreadyExists(
            f"another restore of refs into {repo.name!r} began meanwhile; restore again once "
            "it has ended"
        ) from None


def _check_may_move(g: Graveler, repo: RepositoryRecord, name: str, commit_id: str) -> None:
    """A branch the bare repository has (its default one) moves as a reset would: refused,
    before anything is written, where its protection forbids resets."""
    try:
        branch, _ = g.refs.get_branch(repo, name)
    except NotFound:
        return
    protection.check(repo, branch, "reset", f"restoring refs onto {name!r}", to_commit=commit_id)


def _restore_tag(g: Graveler, repo: RepositoryRecord, tag: Tag) -> None:
    try:
        g.refs.insert_tag(repo, tag)
    except AlreadyExists:
        if g.refs.get_tag(repo, tag.name) != tag:
            raise AlreadyExists(
                f"tag {tag.name!r} was made while restoring refs into {repo.name!r}; delete it "
                "and restore again"
            ) from None


def _restore_branch(g: Graveler, repo: RepositoryRecord, name: str, commit_id: str) -> None:
    try:
        fresh = BranchRecord(name, commit_id, new_staging_token(repo, name))
        protection.insert_new_branch(g, repo, fresh)
        return
    except AlreadyExists:
        pass
    branch, predicate = g.refs.get_branch(repo, name)
    if branch.commit_id == commit_id:
        return
    protection.check(repo, branch, "reset", f"restoring refs onto {name!r}", to_commit=commit_id)
    try:
        g.refs.set_branch_if(repo, dataclasses.replace(branch, commit_id=commit_id), predicate)
    except PredicateFailed:
        raise AlreadyExists(
            f"branch {name!r} changed while restoring refs; restore again"
        ) from None
