"""`branchwater://REPO/REF/PATH`: the lake as an fsspec filesystem, over the public API.

pandas, Polars, pyarrow datasets and DuckDB read any ref through it (REF: a branch, a tag, a
commit id, `main~2`; in a branch's name `/` is written `%2F` and `%` is written `%25`); reads
at a branch see its uncommitted changes, and on a branch `open(…, "wb")`, `pipe`, `put`,
`rm` and `cp` stage changes. Every read goes from the KV store straight to the physical
object (`Ref.open`: ranged reads, no copy), so it costs what reading that object costs.

`fs.transaction` opens a `Branch.transaction` per branch it writes to: the writes go to a
branch of its own made from that branch's HEAD, and on success land as one commit; on
failure nothing lands and its branch is deleted. The filesystem is safe to call from any thread,
native reader threads included: it keeps no per-thread state of its own, and the KV store's
connections outlive the thread states that used them (see `branchwater.engine.kv.sql`).
"""

from __future__ import annotations

import errno
import io
import logging
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass, replace
from datetime import datetime
from glob import has_magic
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO
from urllib.parse import quote, unquote

from fsspec.callbacks import DEFAULT_CALLBACK
from fsspec.implementations.local import LocalFileSystem, make_path_posix, trailing_sep
from fsspec.spec import AbstractFileSystem
from fsspec.transaction import Transaction as FsspecTransaction
from fsspec.utils import check_contained, other_paths, tokenize

from branchwater.engine.api import DEFAULT_KV_URL, Branch, Lake, Ref, Repository, Transaction
from branchwater.engine.errors import (
    CommitExpired,
    ConfigurationError,
    InvalidArgument,
    InvalidName,
    LakeNotFound,
    NotFound,
    PathExists,
    ReadOnlyRef,
)
from branchwater.engine.graveler.model import Commit, Entry, check_flag
from branchwater.engine.graveler.names import is_hex_id
from branchwater.engine.graveler.reads import open_object
from branchwater.engine.lru import LRU
from branchwater.engine.objects import check_s3_options
from branchwater.engine.per_process import ChildSafeLock

log = logging.getLogger(__name__)

PROTOCOL = "branchwater"
KV_URL_ENV = "BRANCHWATER_KV_URL"
SPOOL_BYTES = 8 << 20
"""What a file written through `open(…, "wb")` holds in memory before spilling to a
temporary file; it is uploaded, streamed, when closed."""
IMMUTABLE_ENTRIES = 100_000
"""Entries at commit ids a filesystem remembers (least recently used dropped first): a
commit never changes, so a dataset listed once is opened without looking each file up."""
RESOLVED_COMMITS = 1024
"""Commit ids a filesystem remembers resolved (least recently used dropped first): reads at
one are then free of KV calls, and a long-lived filesystem reading at many stays bounded."""
KNOWN_REPOSITORIES = 1024
"""Repository names whose partition a filesystem remembers (for `_known_commit`)."""
REPOSITORY_SECONDS = 2.0
"""How long a read at a commit id trusts the repository a name was last resolved to: a
commit already resolved there is then read with no KV call (one round trip per file on
PostgreSQL otherwise), and a repository deleted and created again under its name is seen
within this time."""
LAST = "\U0010ffff"
"""The greatest character a path can hold: listing after `dir/` + LAST skips every key in
`dir/` but those whose next character is LAST (`_past_folder`)."""

Info = dict[str, Any]


@dataclass(frozen=True)
class Location:
    """A `REPO/REF/PATH` split: `ref` as the path spells it (quoted), `key` the object path."""

    repository: str
    ref: str = ""
    key: str = ""

    @property
    def ref_name(self) -> str:
        return unquote(self.ref)

    def name(self, key: str) -> str:
        return "/".join(part for part in (self.repository, self.ref, key) if part)


def parse(path: str) -> Location:
    """`REPO[/REF[/PATH]]` (protocol already stripped) into its parts."""
    repository, _, rest = path.strip("/").partition("/")
    ref, _, key = rest.partition("/")
    return Location(repository, ref, key)


_LAKES: dict[tuple[int, str, str], Lake] = {}
_LAKES_LOCK = ChildSafeLock()


def shared_lake(
    kv_url: str, s3_options: Mapping[str, str | None] | None, named_by: str | None = None
) -> Lake:
    """One lake per KV URL and S3 options in a process: fsspec caches a filesystem per thread,
    and each must not open connections of its own. The lake must be there (`_no_lake`);
    `named_by` says where the URL came from (None: the default)."""
    key = (os.getpid(), kv_url, tokenize(check_s3_options(s3_options or {})))
    with _LAKES_LOCK:
        lake = _LAKES.get(key)
        if lake is None:
            try:
                lake = Lake.connect(kv_url, s3_options=s3_options, create=False)
            except LakeNotFound as exc:
                raise _no_lake(exc, named_by) from exc
            _LAKES[key] = lake
        return lake


def _no_lake(missing: LakeNotFound, named_by: str | None) -> ConfigurationError:
    """A filesystem reads and writes repositories a lake already holds, so a mistyped URL
    (or none set) is reported rather than opened as a new empty lake (in the working
    directory, for the default)."""
    if named_by is None:
        return ConfigurationError(
            f"no lake at {missing.where} (the default): {missing.missing}; pass kv_url= "
            f"(storage_options={{'kv_url': ...}}) or set ${KV_URL_ENV} to the lake's KV URL"
        )
    return ConfigurationError(
        f"no lake at {missing.where} (from {named_by}): {missing.missing}; check the URL"
    )


class BranchwaterFileSystem(AbstractFileSystem):
    """fsspec's filesystem for `branchwater://REPO/REF/PATH`.

    `kv_url` (default `$BRANCHWATER_KV_URL`, else the CLI's default lake) and `s3_options`
    open a lake shared by every filesystem with the same ones in the process; `lake=` uses an
    open `Lake` instead. Missing paths raise `FileNotFoundError`; writes to a ref that is not
    a branch raise `ReadOnlyRef` (a `PermissionError`).
    """

    protocol = PROTOCOL
    root_marker = ""

    def __init__(
        self,
        kv_url: str | None = None,
        *,
        lake: Lake | None = None,
        s3_options: Mapping[str, str | None] | None = None,
        **storage_options: Any,
    ) -> None:
        super().__init__(**storage_options)
        if lake is not None and (kv_url is not None or s3_options is not None):
            raise InvalidArgument("pass either lake= or kv_url=/s3_options=, not both")
        if lake is not None and not isinstance(lake, Lake):
            raise InvalidArgument(f"lake= takes an open Lake, not {type(lake).__name__}")
        if lake is None:
            named_by = (
                "kv_url=" if kv_url else f"${KV_URL_ENV}" if os.environ.get(KV_URL_ENV) else None
            )
            url = kv_url or os.environ.get(KV_URL_ENV) or DEFAULT_KV_URL
            lake = shared_lake(url, s3_options, named_by)
        self.lake = lake
        self._commits: LRU[tuple[bytes, str], Ref] = LRU(RESOLVED_COMMITS)
        self._entries: LRU[tuple[bytes, str, str], Entry] = LRU(IMMUTABLE_ENTRIES)
        self._partitions: LRU[str, tuple[float, bytes]] = LRU(KNOWN_REPOSITORIES)

    @classmethod
    def _strip_protocol(cls, path: Any) -> Any:
        """fsspec's, for a path that is text (a list of paths: each), path-like included;
        anything else is `InvalidArgument` rather than an `AttributeError` from inside."""
        if not isinstance(path, list | str | os.PathLike):
            raise InvalidArgument(
                f"a branchwater path is text such as 'REPO/REF/PATH', not {type(path).__name__}"
            )
        return super()._strip_protocol(path)

    @classmethod
    def clear_instance_cache(cls) -> None:
        """Forget the cached filesystems and close the lakes they share (`kv_url=` ones; a
        `lake=` passed in stays its owner's to close)."""
        super().clear_instance_cache()
        with _LAKES_LOCK:
            lakes = list(_LAKES.values())
            _LAKES.clear()
        for lake in lakes:
            lake.close()

    @property
    def fsid(self) -> str:
        return f"{PROTOCOL}-{self._fs_token}"

    # Resolving paths

    def _repository(self, name: str) -> Repository:
        """The repository read now; its partition is noted for `_known_commit`."""
        try:
            repo = self.lake.repository(name)
        except (NotFound, InvalidName) as exc:
            raise _missing(name, exc) from exc
        self._partitions.put(name, (time.monotonic(), repo.record.partition))
        return repo

    def _ref(self, loc: Location) -> Ref:
        """The ref a location reads at; inside a transaction, a branch it wrote to is read at
        the transaction's branch, so its writes are visible to it. A commit id is resolved
        once per repository (keyed by the record's partition, which tells a repository
        re-created under the same name from the one deleted): no branch can be named like
        one, and a commit never changes."""
        if is_hex_id(loc.ref):
            known = self._known_commit(loc)
            if known is not None:
                return known
        repo = self._repository(loc.repository)
        name = self._transaction_branch(repo.name, loc.ref_name) or loc.ref_name
        if not is_hex_id(name) and not any(c in name for c in "~^"):
            with suppress(NotFound, InvalidName):
                return repo.branch(name)
        try:
            ref = repo.ref(name)
        except (NotFound, InvalidName) as exc:
            raise _missing(loc.name(""), exc) from exc
        if is_hex_id(name):
            self._commits.put((repo.record.partition, name), ref)
        return ref

    def _known_commit(self, loc: Location) -> Ref | None:
        """The commit id's ref resolved in the repository its name was resolved to less than
        `REPOSITORY_SECONDS` ago, with no KV call."""
        seen = self._partitions.get(loc.repository)
        if seen is None or time.monotonic() - seen[0] >= REPOSITORY_SECONDS:
            return None
        return self._commits.get((seen[1], loc.ref))

    def _stat(self, loc: Location, ref: Ref, path: str) -> Entry:
        """`ref.stat(path)`, remembered at a commit id (`NotFound` if absent)."""
        if not is_hex_id(loc.ref):
            return ref.stat(path)
        entry = self._entries.get((ref.repository.record.partition, loc.ref, path))
        if entry is not None:
            return entry
        entry = ref.stat(path)
        self._remember(loc, ref, [entry])
        return entry

    def _remember(self, loc: Location, ref: Ref, entries: list[Entry]) -> None:
        if not is_hex_id(loc.ref):
            return
        partition = ref.repository.record.partition
        for entry in entries:
            self._entries.put((partition, loc.ref, entry.path), entry)

    def _branch(self, path: str) -> tuple[Branch, str]:
        """The branch a write stages on (inside a transaction, its own) and the object path."""
        loc = self._object_location(path, writing=True)
        if not loc.key:
            raise InvalidArgument(f"{PROTOCOL}://{loc.name('')} is not an object path")
        repo = self._repository(loc.repository)
        try:
            branch = repo.branch(loc.ref_name)
        except (NotFound, InvalidName):
            self._ref(loc)
            raise ReadOnlyRef(
                f"{loc.ref_name!r} of repository {repo.name!r} is not a branch: tags, commit "
                "ids and ref~N are read-only; write to a branch"
            ) from None
        if self._intrans and isinstance(self.transaction, BranchwaterTransaction):
            branch = self.transaction.branch_for(branch)
        return branch, loc.key

    def _transaction_branch(self, repository: str, branch: str) -> str | None:
        tx = self._transaction
        if not self._intrans or not isinstance(tx, BranchwaterTransaction):
            return None
        return tx.started.get((repository, branch))

    def _location(self, path: Any) -> Location:
        """`parse` of the path, keeping the trailing `/` fsspec strips: the engine stores `x`
        and `x/` as two objects, and a path ending in `/` names the folder, neither of them."""
        loc = parse(self._strip_protocol(path))
        if loc.key and os.fspath(path).endswith("/"):
            return replace(loc, key=loc.key + "/")
        return loc

    def _object_location(self, path: Any, *, writing: bool) -> Location:
        """The location of the object a path names, refusing one ending in `/` (a folder)."""
        loc = self._location(path)
        if loc.key.endswith("/"):
            raise _folder(loc, writing=writing)
        return loc

    def _entry(self, path: str) -> tuple[Location, Ref, Entry]:
        loc = self._object_location(path, writing=False)
        if not loc.key:
            raise IsADirectoryError(f"{PROTOCOL}://{loc.name('')} is a directory")
        ref = self._ref(loc)
        try:
            return loc, ref, self._stat(loc, ref, loc.key)
        except NotFound as exc:
            missing = exc
        if not isinstance(missing, CommitExpired):
            with suppress(NotFound):
                if next(_children(ref, loc.key + "/", loc), None) is not None:
                    raise IsADirectoryError(
                        errno.EISDIR,
                        "a folder, not an object: open an object in it, or list it (ls)",
                        f"{PROTOCOL}://{loc.name(loc.key)}",
                    )
        raise _missing_at(loc, loc.key, missing) from missing

    def _read(self, loc: Location, ref: Ref, entry: Entry) -> BinaryIO:
        """The entry's object opened, its data gone a `FileNotFoundError`; at a commit id this
        filesystem remembered, the commit is resolved again first, so a repository deleted
        (or created again) since is told as resolving it tells it, not as data lost."""
        try:
            return _open_entry(ref, entry, loc)
        except NotFound as exc:
            if is_hex_id(loc.ref) and not isinstance(exc, CommitExpired):
                self._commits.discard((ref.repository.record.partition, loc.ref))
                self._ref(loc)
            raise _missing_at(loc, entry.path, exc) from exc

    # Reading

    def info(self, path: str, **kwargs: Any) -> Info:
        """The object the path names, else the folder (a path ending in `/`: the folder)."""
        loc = self._location(path)
        if not loc.repository:
            return _directory("")
        if not loc.ref:
            return _directory(self._repository(loc.repository).name)
        ref = self._ref(loc)
        if not loc.key:
            return _directory(loc.name(""))
        folder = loc.key.rstrip("/")
        if folder == loc.key:
            with suppress(NotFound):
                return _file_info(loc, self._stat(loc, ref, loc.key))
        try:
            inside = next(_children(ref, folder + "/", loc), None)
        except NotFound as exc:
            raise _missing_at(loc, folder, exc) from exc
        if inside is not None:
            return _directory(loc.name(folder))
        raise _missing(loc.name(loc.key), "no such object or folder")

    def ls(self, path: str, detail: bool = True, **kwargs: Any) -> list[Info] | list[str]:
        """One level; objects whose keys have an empty part (`/x`, `x//y`, `x/`) are left
        out, since no fsspec name tells them from another, and a folder named like an object
        is listed as the object, as `info` describes it."""
        loc = self._location(path)
        try:
            infos = self._ls(loc)
        except NotFound as exc:
            raise _missing_at(loc, loc.key.rstrip("/"), exc) from exc
        infos.sort(key=lambda info: info["name"])
        return infos if detail else [info["name"] for info in infos]

    def _ls(self, loc: Location) -> list[Info]:
        if not loc.repository:
            return [_directory(r.name) for r in self.lake.repositories()]
        if not loc.ref:
            repo = self._repository(loc.repository)
            refs = [b.name for b in repo.branches()] + [t.name for t in repo.tags()]
            return [_directory(f"{repo.name}/{quote(name, safe='~^')}") for name in set(refs)]
        ref = self._ref(loc)
        folder = loc.key.rstrip("/")
        if folder and folder == loc.key:
            with suppress(NotFound):
                return [_file_info(loc, ref.stat(folder))]
        children = list(_children(ref, folder + "/" if folder else "", loc))
        if not children and folder:
            raise _missing(loc.name(folder), "no such object or folder")
        return children

    def find(
        self,
        path: str,
        maxdepth: int | None = None,
        withdirs: bool = False,
        detail: bool = False,
        **kwargs: Any,
    ) -> list[str] | dict[str, Info]:
        """Every object under `path` from one flat listing (folders derived from it), left out
        as `ls` leaves them out. A missing repository or ref finds nothing, as a missing path
        does: DuckDB's glob then says "No files found" rather than a traceback."""
        if maxdepth is not None and maxdepth < 1:
            raise ValueError("maxdepth must be at least 1")
        loc = self._location(path)
        if not loc.ref:
            return super().find(path, maxdepth, withdirs, detail, **kwargs)
        try:
            ref = self._ref(loc)
        except FileNotFoundError:
            return {} if detail else []
        folder = loc.key.rstrip("/")
        found: dict[str, Info] = {}
        if folder and folder == loc.key:
            with suppress(NotFound):
                entry = ref.stat(folder)
                found[loc.name(folder)] = _file_info(loc, entry)
        prefix = folder + "/" if folder else ""
        try:
            entries = list(ref.list(prefix))
        except NotFound as exc:
            raise _missing_at(loc, folder, exc) from exc
        self._remember(loc, ref, entries)
        for entry in entries:
            if not _listable(entry.path):
                continue
            rest = entry.path[len(prefix) :].split("/")
            if maxdepth is not None and len(rest) > maxdepth:
                if withdirs:
                    rest = rest[:maxdepth]
                    _add_folders(found, loc, prefix, rest, len(rest))
                continue
            if withdirs:
                _add_folders(found, loc, prefix, rest, len(rest) - 1)
            found[loc.name(entry.path)] = _file_info(loc, entry)
        if withdirs and folder and found and loc.name(folder) not in found:
            found[loc.name(folder)] = _directory(loc.name(folder))
        names = sorted(found)
        if detail:
            return {name: found[name] for name in names}
        return names

    def _open(
        self,
        path: str,
        mode: str = "rb",
        block_size: int | None = None,
        autocommit: bool = True,
        cache_options: dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> Any:
        if mode == "rb":
            loc, ref, entry = self._entry(path)
            return self._read(loc, ref, entry)
        if mode in ("wb", "xb"):
            exclusive = mode == "xb"
            branch, key = self._branch(path)
            name = self._strip_protocol(path)
            if exclusive:
                _refuse_shown(branch, key, name)
            return WriteFile(branch, key, name, exclusive=exclusive)
        raise InvalidArgument(f"mode {mode!r} is not supported: use 'rb', 'wb' or 'xb'")

    def open(self, path: Any, mode: str = "rb", *args: Any, **kwargs: Any) -> Any:
        """fsspec's, refusing a path ending in `/` first: fsspec strips it before `_open`."""
        self._object_location(path, writing="r" not in mode)
        return super().open(path, mode, *args, **kwargs)

    def pipe(self, path: Any, value: bytes | None = None, **kwargs: Any) -> None:
        """fsspec's, refusing a path ending in `/` first: fsspec strips it before `pipe_file`."""
        for name in path if isinstance(path, dict) else [path]:
            self._object_location(name, writing=True)
        super().pipe(path, value, **kwargs)

    def cat(self, path: Any, recursive: bool = False, **kwargs: Any) -> Any:
        """fsspec's; one path ending in `/` is a folder, not the object fsspec strips it to."""
        if isinstance(path, str) and not recursive and not has_magic(path):
            self._object_location(path, writing=False)
        return super().cat(path, recursive=recursive, **kwargs)

    def cat_file(
        self, path: str, start: int | None = None, end: int | None = None, **kwargs: Any
    ) -> bytes:
        loc, ref, entry = self._entry(path)
        begin, stop = _bounds(start, end, entry.size)
        with self._read(loc, ref, entry) as f:
            f.seek(begin)
            return f.read(max(0, stop - begin))

    def checksum(self, path: str) -> int:
        """The content identity (size, SHA-256, metadata): equal for equal objects."""
        return int(self.ukey(path), 16)

    def ukey(self, path: str) -> str:
        """A key that changes exactly when the object's content or metadata does; at a commit
        id it never changes, so a cache keyed on it (fsspec's `filecache::`) stays valid."""
        _, _, entry = self._entry(path)
        return tokenize(*entry.identity())

    def modified(self, path: str) -> datetime:
        return self._entry(path)[2].mtime

    # Writing (on branches)

    def pipe_file(self, path: str, value: bytes, mode: str = "overwrite", **kwargs: Any) -> None:
        branch, key = self._branch(path)
        branch.upload(key, value, if_absent=_exclusive(mode))

    def put_file(
        self, lpath: str, rpath: str, callback: Any = None, mode: str = "overwrite", **kwargs: Any
    ) -> None:
        if os.path.isdir(lpath):
            return
        branch, key = self._branch(rpath)
        branch.upload(key, Path(lpath), if_absent=_exclusive(mode))

    def cp_file(self, path1: str, path2: str, **kwargs: Any) -> None:
        """Within one branch a copy of the entry (`Branch.copy`); from another ref or
        repository, the object streamed to a new one."""
        src = self._object_location(path1, writing=False)
        dst = parse(self._strip_protocol(path2))
        branch, key = self._branch(path2)
        if src.repository == dst.repository and src.ref == dst.ref:
            try:
                branch.copy(src.key, key)
                return
            except NotFound as exc:
                raise _missing(src.name(src.key), exc) from exc
        _, ref, entry = self._entry(path1)
        with self._read(src, ref, entry) as f:
            branch.upload(key, f, metadata=entry.metadata)

    def copy(
        self,
        path1: Any,
        path2: Any,
        recursive: bool = False,
        maxdepth: int | None = None,
        on_error: str | None = None,
        **kwargs: Any,
    ) -> None:
        """fsspec's (`cp`, and `mv` through it); a source named as spelled (`expand_path`)
        is copied to where fsspec copies a name with no glob characters."""
        if isinstance(path1, str) and isinstance(path2, str) and self._literal(path1, recursive):
            into = trailing_sep(path2) or self.isdir(path2)
            path1, path2 = self._copies(path1, path2, recursive, maxdepth, into, **kwargs)
        super().copy(path1, path2, recursive, maxdepth, on_error, **kwargs)

    def get(
        self,
        rpath: Any,
        lpath: Any,
        recursive: bool = False,
        callback: Any = DEFAULT_CALLBACK,
        maxdepth: int | None = None,
        **kwargs: Any,
    ) -> None:
        """fsspec's; a source named as spelled (`expand_path`) is copied to where fsspec
        copies a name with no glob characters."""
        if isinstance(rpath, str) and isinstance(lpath, str) and self._literal(rpath, recursive):
            root = make_path_posix(lpath)
            into = trailing_sep(root) or LocalFileSystem().isdir(root)
            rpath, lpath = self._copies(rpath, root, recursive, maxdepth, into, **kwargs)
            check_contained(root, lpath)
        super().get(rpath, lpath, recursive, callback, maxdepth, **kwargs)

    def _copies(
        self,
        source: str,
        target: str,
        recursive: bool,
        maxdepth: int | None,
        into: bool,
        **kwargs: Any,
    ) -> tuple[list[str], list[str]]:
        """The sources a copy of `source` expands to and their targets, as fsspec's `copy`
        and `get` pair them for a source with no glob characters; `into`: `target` is a
        folder. fsspec pairs those of a pattern differently: its one match goes inside
        `target`, which would make `cp('lit[1].csv', 'b.csv')` write `b.csv/lit[1].csv`."""
        sources = self.expand_path(source, recursive, maxdepth, assume_literal=True, **kwargs)
        if not recursive or maxdepth is not None:
            sources = [p for p in sources if not self.isdir(p)]
        inside = into and not trailing_sep(source)
        return sources, other_paths(sources, target, exists=inside) if sources else []

    def rm_file(self, path: str) -> None:
        branch, key = self._branch(path)
        try:
            branch.delete(key)
        except NotFound as exc:
            raise _missing(self._strip_protocol(path), exc) from exc

    def rm(self, path: Any, recursive: bool = False, maxdepth: int | None = None) -> None:
        """Stage a delete of every object `path` expands to (`expand_path`: a name that exists
        as spelled is that one, not a pattern); folders are implicit."""
        check_flag("recursive", recursive)
        paths = path if isinstance(path, list) else [path]
        for name in paths:
            loc = self._location(name)
            if not recursive and loc.key.endswith("/"):
                raise _folder(loc, writing=True)
        for name in self.expand_path(paths, recursive, maxdepth):
            if self.info(name)["type"] == "file":
                self.rm_file(name)

    def expand_path(
        self,
        path: Any,
        recursive: bool = False,
        maxdepth: int | None = None,
        assume_literal: bool = False,
        **kwargs: Any,
    ) -> list[str]:
        """fsspec's, except that a path that exists as spelled (an object; a folder, when
        `recursive`) is that one, not a pattern: `*`, `?` and `[` are characters of real
        names, which `open` and `cat_file` read literally, so `cat`, `cp`, `get`, `mv`,
        `rm` act on `lit[1].csv` itself, never on `lit1.csv`. A path naming nothing is
        still a pattern."""
        exact: list[Any] = []
        patterns: list[Any] = []
        for name in [path] if isinstance(path, str | os.PathLike) else path:
            spelled = (
                assume_literal or not has_magic(os.fspath(name)) or self._literal(name, recursive)
            )
            (exact if spelled else patterns).append(name)
        found: set[str] = set()
        for group, literal in ((exact, True), (patterns, False)):
            if group:
                with suppress(FileNotFoundError):
                    found.update(super().expand_path(group, recursive, maxdepth, literal, **kwargs))
        if not found:
            raise FileNotFoundError(path)
        return sorted(found)

    def _literal(self, path: Any, folder: bool) -> bool:
        """Whether a path with glob characters names an object as spelled (or a folder, if
        `folder`): `expand_path` takes it as that name, not as a pattern."""
        if not has_magic(os.fspath(path)):
            return False
        try:
            kind = self.info(path)["type"]
        except FileNotFoundError:
            return False
        return kind == "file" or folder

    def mkdir(self, path: str, create_parents: bool = True, **kwargs: Any) -> None:
        """Folders exist through the objects under them: nothing to do."""

    def makedirs(self, path: str, exist_ok: bool = False) -> None:
        """Folders exist through the objects under them: nothing to do."""

    def rmdir(self, path: str) -> None:
        """Folders vanish with their last object: nothing to do."""


def _open_entry(ref: Ref, entry: Entry, loc: Location) -> BinaryIO:
    """`Ref.open` of an entry already looked up: verified as it is, without a second lookup,
    and told the ref and commit it was read at, so data missing names them (or the expiry),
    as fsspec's `FileNotFoundError` once the file is open. The engine's file is the read
    handle, with the attributes fsspec readers look for (`path`, `size`)."""
    f: Any = open_object(
        ref.repository.lake.graveler,
        ref.repository.record,
        entry,
        ref=ref.name,
        commit_id=None if isinstance(ref, Branch) else ref.commit_id,
        missing=lambda exc: _missing_at(loc, entry.path, exc),
    )
    f.path, f.size = loc.name(entry.path), entry.size
    return f


def _refuse_shown(branch: Branch, key: str, name: str) -> None:
    """`"xb"` fails when opened where the branch already shows the path, as its upload would
    when closed, so a writer learns before writing anything."""
    with suppress(NotFound):
        branch.stat(key)
        raise PathExists(
            f"{PROTOCOL}://{name} exists: an exclusive creation ('xb') writes only a path "
            "the branch does not show"
        )


def _exclusive(mode: object) -> bool:
    """fsspec's write `mode`: "create" is an exclusive creation, "overwrite" is not; another
    mode is refused rather than taken for an overwrite."""
    if mode not in ("overwrite", "create"):
        raise InvalidArgument(f"mode {mode!r} is not supported: use 'overwrite' or 'create'")
    return mode == "create"


def _bounds(start: object, end: object, size: int) -> tuple[int, int]:
    """fsspec's byte range: `end` exclusive, negative values from the end, clipped."""
    first, last = _offset("start", start), _offset("end", end)
    begin = 0 if first is None else (max(0, size + first) if first < 0 else first)
    stop = size if last is None else (max(0, size + last) if last < 0 else min(last, size))
    return min(begin, size), stop


def _offset(name: str, value: object) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise InvalidArgument(f"{name} must be a byte offset, not {value!r}")
    return value


def _directory(name: str) -> Info:
    return {"name": name, "size": 0, "type": "directory"}


def _file_info(loc: Location, entry: Entry) -> Info:
    return {
        "name": loc.name(entry.path),
        "size": entry.size,
        "type": "file",
        "checksum": entry.checksum,
        "mtime": entry.mtime,
        "LastModified": entry.mtime,
        "metadata": dict(entry.metadata),
    }


def _children(ref: Ref, prefix: str, loc: Location) -> Iterator[Info]:
    """The objects and folders right under `prefix`, as `ls` lists them: the listing skips
    over each folder (`_past_folder`: a restart inside a folder follows one already listed);
    an object sorts before the keys of its namesake folder."""
    after = ""
    files: set[str] = set()
    while True:
        for entry in ref.list(prefix, after=after):
            if not _listable(entry.path):
                continue
            head, slash, _ = entry.path[len(prefix) :].partition("/")
            if not slash:
                files.add(entry.path)
                yield _file_info(loc, entry)
                continue
            folder = prefix + head
            if folder not in files and not after.startswith(folder + "/"):
                yield _directory(loc.name(folder))
            after = _past_folder(folder + "/", entry.path)
            break
        else:
            return


def _past_folder(folder: str, key: str) -> str:
    """Where a listing that met `key` in `folder` (ending in `/`) restarts to skip the rest
    of the folder: after `folder` + LAST, past every key in it but those whose next
    character is LAST itself, and at least past `key`, so each restart moves on and a
    folder ends however its keys are named. The exact end (`folder` with its `/` made a
    `0`) cannot be used: listings start strictly after their start, so `dir0` would be
    skipped."""
    return max(folder + LAST, key)


def _listable(key: str) -> bool:
    """A key with an empty part (`/x`, `x//y`, `x/`) has no fsspec name of its own: listed,
    it reads as its folder, another object or the listed folder itself."""
    return "" not in key.split("/")


def _add_folders(
    found: dict[str, Info], loc: Location, prefix: str, parts: list[str], n: int
) -> None:
    for depth in range(1, n + 1):
        folder = loc.name(prefix + "/".join(parts[:depth]))
        if folder not in found:
            found[folder] = _directory(folder)


ExceptionState = tuple[BaseException | None, TracebackType | None]
"""The exception being handled (`sys.exception()`) and its traceback at the time."""


def _exception_state() -> ExceptionState:
    exc = sys.exception()
    return exc, None if exc is None else exc.__traceback__


def _raised_since(before: ExceptionState) -> bool:
    """Whether an exception raised since `before` is being handled: a new one, or the one
    handled then that has since propagated on (its traceback grew a frame)."""
    exc, traceback = _exception_state()
    return exc is not None and (exc is not before[0] or traceback is not before[1])


class WriteFile(io.RawIOBase):
    """A file written to a branch: spooled (memory, then a temporary file) and uploaded,
    streamed, when closed. A write cut short uploads nothing: an error inside its `with`, a
    close while an exception raised since it was opened is handled (see `close`), a failed
    `write`, a file dropped unclosed. An `exclusive` one (mode `"xb"`) is uploaded only where
    the branch shows nothing at its path when it is closed, else `PathExists` (a
    `FileExistsError`)."""

    def __init__(self, branch: Branch, key: str, name: str, *, exclusive: bool = False) -> None:
        super().__init__()
        self.branch = branch
        self.key = key
        self.exclusive = exclusive
        self.path = name
        self.entry: Entry | None = None
        self._opened_amid = _exception_state()
        self._cut_short = False
        self._spool = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)  # noqa: SIM115

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        """A write that fails (a full disk under the spool) leaves the content incomplete,
        even where the error is not in sight at `close` (a text wrapper's final flush)."""
        try:
            return self._spool.write(data)
        except TypeError:
            raise  # data that is not bytes is refused before any of it is written
        except BaseException:
            self._cut_short = True
            raise

    def tell(self) -> int:
        return self._spool.tell()

    def close(self) -> None:
        """Upload what was written, unless an exception raised since the file was opened is
        being handled: fsspec's `OpenFile`, text wrappers and pandas close the file from
        `__exit__` or `finally` without passing their error on. One already handled when
        the file was opened does not count, unless it has propagated on since.

        Limits: closed inside an `except` (or `finally`) for an exception raised after it
        was opened, it uploads nothing even if that exception is then swallowed; a text or
        `fsspec.open` `with`, opened in an `except` block and ended by a bare `raise` of
        that block's exception in the same function, uploads. A discard says so in the log,
        for the file closed in a handler that then swallows its exception."""
        if self.closed:
            return
        failed = _raised_since(self._opened_amid)
        if failed:
            log.warning(
                "%s was not uploaded: it was closed while handling %r, raised after it was "
                "opened (a write cut short); close it after the except block to upload it",
                self.path,
                sys.exception(),
            )
        self._finish(failed=failed)

    def _finish(self, *, failed: bool) -> None:
        if failed or self._cut_short:
            self.discard()
        else:
            self._upload()

    def _upload(self) -> None:
        try:
            self._spool.seek(0)
            self.entry = self.branch.upload(
                self.key,
                self._spool,  # type: ignore[arg-type]
                if_absent=self.exclusive,
            )
        finally:
            self.discard()

    def discard(self) -> None:
        """Close without uploading."""
        self._opened_amid = (None, None)
        self._spool.close()
        super().close()

    def commit(self) -> None:
        """Uploaded when closed; fsspec's transaction calls this afterwards (and refuses to
        land while the file is open: `BranchwaterTransaction`)."""

    def __exit__(self, exc_type: object, *rest: object) -> None:
        if not self.closed:
            self._finish(failed=exc_type is not None)

    def _dealloc_warn(self, source: object) -> None:
        """A text or buffered wrapper dropped unclosed calls this from its finalizer just
        before it closes this file: a write cut short, like this file dropped unclosed."""
        self._cut_short = True

    def __del__(self) -> None:
        """A file dropped unclosed uploads nothing (a write cut short by an error)."""
        if not self.closed:
            self.discard()


@dataclass
class Landed:
    """What a transaction did to one branch: the commit it landed there."""

    repository: str
    branch: str
    commit: Commit


class _Discarded(Exception):
    """Ends a transaction's branch contexts without landing them (fsspec's discard)."""


@dataclass
class _Started:
    repository: str
    context: AbstractContextManager[Transaction]
    branch: Transaction


class BranchwaterTransaction(FsspecTransaction):
    """`with fs.transaction as tx:`: each branch it writes to gets a `Branch.transaction`
    when first written (one mechanism: `graveler/transactions.py`), so its writes go to a
    `tx/<hex>` branch made from that HEAD, and reads inside see them. On success each lands
    as one commit on its branch (`tx.message`, `tx.metadata`; `tx.landed` lists them), in
    the order first written; a conflict fails it and ends the rest unlanded. On failure,
    or with a file still open for writing when it ends (`InvalidArgument`), none lands and
    the transactions' branches are deleted."""

    def __init__(self, fs: BranchwaterFileSystem, **kwargs: Any) -> None:
        super().__init__(fs, **kwargs)
        self.message = "fsspec transaction"
        self.metadata: dict[str, str] = {}
        self.landed: list[Landed] = []
        self._branches: dict[tuple[str, str], _Started] = {}
        self._lock = threading.Lock()

    @property
    def started(self) -> dict[tuple[str, str], str]:
        """Read under the lock: a filesystem is shared by threads (pyarrow's, DuckDB's)
        while one of them starts a branch."""
        with self._lock:
            return {key: s.branch.name for key, s in self._branches.items()}

    def start(self) -> None:
        super().start()
        with self._lock:
            self._branches = {}
        self.landed = []

    def branch_for(self, target: Branch) -> Branch:
        key = (target.repository.name, target.name)
        with self._lock:
            started = self._branches.get(key)
            if started is None:
                context = target.transaction(self.message, self.metadata)
                started = _Started(key[0], context, context.__enter__())
                self._branches[key] = started
            return started.branch

    def complete(self, commit: bool = True) -> None:
        failure: BaseException | None = self._still_open() if commit else _Discarded()
        try:
            super().complete(failure is None)
        finally:
            with self._lock:
                started, self._branches = list(self._branches.values()), {}
        for s in started:
            if failure is None:
                try:
                    s.branch.message, s.branch.metadata = self.message, self.metadata
                except BaseException as exc:
                    failure = exc
            if failure is not None:
                s.context.__exit__(type(failure), failure, None)
                continue
            try:
                s.context.__exit__(None, None, None)
            except BaseException as exc:
                failure = exc
                continue
            if s.branch.landed is not None:
                self.landed.append(Landed(s.repository, s.branch.target, s.branch.landed))
        if commit and failure is not None:
            raise failure

    def _still_open(self) -> InvalidArgument | None:
        """A file still open for writing when the transaction ends fails it: fsspec would
        land what it holds so far, but a text or compression wrapper around it may hold
        more, unseen, so that content may be cut short. Its close later does nothing (fsspec
        discards it); one closed in time was uploaded then."""
        names = [f"{PROTOCOL}://{f.path}" for f in self.files if not f.closed]
        if not names:
            return None
        return InvalidArgument(
            f"the transaction ended with {len(names)} file(s) still open for writing "
            f"({', '.join(names)}), so nothing landed: close every file opened inside "
            "`with fs.transaction` (or write it in a `with fs.open(...)` block) before the "
            "transaction ends"
        )


BranchwaterFileSystem.transaction_type = BranchwaterTransaction


def _missing_at(loc: Location, key: str, exc: NotFound) -> FileNotFoundError:
    """`_missing` for an engine's `NotFound`; an expired commit names the ref, as resolving
    one does."""
    return _missing(loc.name("" if isinstance(exc, CommitExpired) else key), exc)


def _folder(loc: Location, *, writing: bool) -> IsADirectoryError:
    """A path ending in `/` used as an object's: fsspec strips the `/`, which would make it
    another object (`x` for `x/`)."""
    api = "Branch.upload or Branch.delete" if writing else "Ref.read or Ref.open"
    why = (
        "a path ending in '/' names a folder: an object path may not end in '/' through the "
        f"filesystem; use the Python API ({api}) for such a key"
    )
    return IsADirectoryError(errno.EISDIR, why, f"{PROTOCOL}://{loc.name(loc.key)}")


def _missing(name: str, why: object) -> FileNotFoundError:
    """As the OS raises it: `filename` set, and shown quoted, so a path with a line break or
    a NUL prints as one line."""
    return FileNotFoundError(errno.ENOENT, str(why), f"{PROTOCOL}://{name}")
