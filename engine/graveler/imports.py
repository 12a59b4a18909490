"""Zero-copy import: objects under an existing `s3://` or `file://` prefix become entries
that point at them where they are, in one commit.

**Addresses.** An imported entry's address is the object's full URI (`external`); reads
open it there. The source must lie outside every repository's namespace in the lake: GC
lists and deletes only `<namespace>/data/`, so it can never collect an imported object,
and no other repository's GC can either (`InvalidImportSource` otherwise).

**Identity.** An imported entry's checksum is `etag:<ETag>`: S3's ETag from the listing, or
for a local file its modification time and size in hex, as web servers make their ETags.
Identity is (size, checksum, metadata), so importing an unchanged object again is no change,
and an object rewritten at the source is a change once imported again. An import never
reads the objects' bytes: the checksum is no content hash, so reads check the size only
(`recomputable_hash` takes such checksums on trust), and the same bytes uploaded are a
different object.

**Flow.** The listing (in key order: S3's, or a walk of local folders that sorts each as
keys sort) streams as columns, a batch at a time, into `CommittedStore.apply_rows` onto the
branch's HEAD, which writes ranges as a commit does from staged rows; the commit is then
landed on the branch through the merge's retry loop (`merge.land`): a lost race applies
what the import brought in onto the new HEAD, and the branch's uncommitted changes stay
staged above it. Nothing reaches the KV store
before that one commit, so an import that fails or is killed part way leaves the branch as
it was (and unreferenced ranges, as a failed commit does). Ranges are content-addressed:
running the import again lists the same objects, writes the same ranges and lands the same
tree, or finds HEAD already holds it (`commit` is then `None`).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from itertools import islice
from operator import itemgetter
from stat import S_ISREG
from urllib.parse import unquote, urlsplit

import pyarrow as pa
import pyarrow.compute as pc

from branchwater.engine import failpoints
from branchwater.engine.errors import (
    InvalidArgument,
    InvalidImportSource,
    NoChanges,
    NotFound,
    Unavailable,
    too_many_tries,
)
from branchwater.engine.graveler.checksums import CHECKSUM_MAX_LENGTH, check_checksum
from branchwater.engine.graveler.committed.format import CHANGE_SCHEMA, UTC_MICROS
from branchwater.engine.graveler.external import FILE_SCHEME, S3_SCHEME
from branchwater.engine.graveler.graveler import Graveler
from branchwater.engine.graveler.merge import Attempt, land
from branchwater.engine.graveler.model import Commit, RepositoryRecord, check_commit_arguments
from branchwater.engine.graveler.names import check_path
from branchwater.engine.objects import ObjectInfo

BATCH = 10_000
"""Objects listed, checked and handed to the range writer at once."""
SOURCE_KEY = "branchwater.import.source"
"""Import commit metadata: the source prefix, as a URI ending in `/`."""
PREFIX_KEY = "branchwater.import.prefix"
"""Import commit metadata: the path prefix the objects were imported under."""
CHECKSUM_PREFIX = "etag:"
CHECKSUM_PATTERN = rf"[0-9A-Za-z+/=._:-]{{1,{CHECKSUM_MAX_LENGTH}}}"
"""What `checksums.check_checksum` accepts, for Arrow's regular expressions."""

Progress = Callable[[int], None]
"""Called after each batch with the number of objects listed so far."""


@dataclass(frozen=True)
class ImportResult:
    """What an import listed (`count` objects, `bytes` in all) and the commit holding them;
    `commit` is None when the branch already held every one as imported (a re-run)."""

    count: int
    bytes: int
    commit: Commit | None


@dataclass(frozen=True)
class Source:
    """An import source: the store its objects are read through (a bucket, or the file
    system's root), the key prefix under it, and its canonical URI."""

    scheme: str
    store_url: str
    key_prefix: str

    @property
    def root(self) -> str:
        """The store's URL ending in `/`: an object's address is this and its key."""
        return self.store_url if self.store_url.endswith("/") else self.store_url + "/"

    @property
    def uri(self) -> str:
        return self.root + self.key_prefix

    @property
    def location(self) -> str:
        """What overlap is judged on: the bucket and prefix, or the real directory."""
        return self.uri[len(self.scheme) :]


def parse_source(uri: object) -> Source:
    """`s3://bucket[/prefix]` or `file:///absolute/dir` as a prefix: a trailing `/` is
    implied, a local directory resolved through symbolic links and checked to exist."""
    if not isinstance(uri, str):
        raise InvalidImportSource(f"an import source must be a string, not {type(uri).__name__}")
    if uri.startswith(S3_SCHEME):
        bucket, _, prefix = uri[len(S3_SCHEME) :].partition("/")
        if not bucket or "\x00" in prefix:
            raise InvalidImportSource(f"import source {uri!r} must look like s3://bucket/prefix/")
        return Source(S3_SCHEME, f"{S3_SCHEME}{bucket}", _as_folder(prefix))
    if uri.startswith(FILE_SCHEME + "/") and "\x00" not in uri:
        directory = os.path.realpath(unquote(uri[len(FILE_SCHEME) :]))
        if not os.path.isdir(directory):
            raise NotFound(f"import source {uri!r} is not a directory")
        return Source(FILE_SCHEME, f"{FILE_SCHEME}/", _as_folder(directory.lstrip("/")))
    raise InvalidImportSource(
        f"import source {uri!r} must be an s3://bucket/prefix/ or file:///absolute/dir/ URI"
    )


def _as_folder(prefix: str) -> str:
    return prefix if not prefix or prefix.endswith("/") else prefix + "/"


def namespace_location(namespace: str) -> tuple[str, str] | None:
    """(scheme, location) of a storage namespace, comparable with `Source.location`."""
    try:
        parts = urlsplit(namespace)
    except ValueError:
        return None
    if parts.scheme == "s3":
        return S3_SCHEME, _as_folder(f"{parts.netloc}/{parts.path.strip('/')}".rstrip("/"))
    if parts.scheme == "file":
        return FILE_SCHEME, _as_folder(os.path.realpath(unquote(parts.path)))
    return None


def check_outside_namespaces(g: Graveler, source: Source) -> None:
    """`InvalidImportSource` when the source and any repository's namespace overlap: one
    holds the other, so some repository's GC could delete an imported object (or the import
    would take in a repository's own data and ranges)."""
    here = source.location
    for repo in g.refs.list_repositories():
        found = namespace_location(repo.storage_namespace)
        if found is None or found[0] != source.scheme:
            continue
        there = found[1]
        if here.startswith(there) or there.startswith(here):
            raise InvalidImportSource(
                f"import source {source.uri!r} overlaps the storage namespace "
                f"{repo.storage_namespace!r} of repository {repo.name!r}: import only objects "
                "outside every namespace, which GC never deletes"
            )


def destination_prefix(prefix: object) -> str:
    """The path prefix objects are imported under, as a folder (`raw` is `raw/`)."""
    return _as_folder(check_path(prefix, "import prefix", empty=True))


def import_objects(
    g: Graveler,
    repo: RepositoryRecord,
    branch: str,
    source_uri: str,
    prefix: str = "",
    *,
    message: str | None = None,
    metadata: Mapping[str, str] | None = None,
    committer: str = "",
    progress: Progress | None = None,
) -> ImportResult:
    """Import every object under `source_uri` as `prefix` + its key below the source, in
    one commit on `branch` (see the module docstring)."""
    dest = destination_prefix(prefix)
    source = parse_source(source_uri)
    meta = check_commit_arguments(message or "", metadata, committer)
    meta.update({SOURCE_KEY: source.uri, PREFIX_KEY: dest})
    check_outside_namespaces(g, source)
    g.refs.get_branch(repo, branch)
    listing = _Listing(g, source, dest, progress)
    plan = _ImportPlan(
        (source.uri, branch),
        listing,
        message or f"Import {source.uri} into {dest or '/'}",
        meta,
        committer,
    )
    try:
        commit: Commit | None = land(g, repo, branch, plan).commit
    except NoChanges:
        commit = None
    return ImportResult(listing.count, listing.bytes, commit)


@dataclass
class Objects:
    """A batch of listed objects as columns: keys below the store's root, sizes,
    modification times in microseconds since the epoch, and ETags where the store has them."""

    keys: list[str]
    sizes: list[int]
    mtimes_us: list[int]
    etags: list[str] | None = None

    @classmethod
    def of(cls, infos: list[ObjectInfo]) -> Objects:
        return cls(
            [info.key for info in infos],
            [info.size for info in infos],
            [_micros(info.mtime) for info in infos],
            [info.etag or "" for info in infos],
        )


def _micros(moment: datetime) -> int:
    return int(moment.timestamp()) * 1_000_000 + moment.microsecond


def list_local(directory: str, key_prefix: str) -> Iterator[Objects]:
    """Regular files under `directory` (whose key below the root is `key_prefix`), in key
    order, `BATCH` at a time, without an object per file: sorting a folder's names with `/`
    after those of folders is key order. A file gone before its `stat`, or that is no regular
    file (a socket, a link to a folder), is left out. Folders are a stack, not recursion (any
    depth), and a folder's files one plain loop, so a file costs little beyond its `stat`."""
    keys: list[str] = []
    sizes: list[int] = []
    mtimes_us: list[int] = []
    add_key, add_size, add_mtime = keys.append, sizes.append, mtimes_us.append
    stack = [(iter(_sorted_folder(directory)), key_prefix)]
    while stack:
        items, prefix = stack[-1]
        for name, entry in items:
            if name[-1] == "/":
                stack.append((iter(_sorted_folder(entry.path)), prefix + name))
                break
            try:
                st = entry.stat()
            except (FileNotFoundError, NotADirectoryError):
                continue
            if not S_ISREG(st.st_mode):
                continue
            add_key(prefix + name)
            add_size(st.st_size)
            add_mtime(st.st_mtime_ns // 1000)
            if len(keys) >= BATCH:
                yield Objects(keys, sizes, mtimes_us)
                keys, sizes, mtimes_us = [], [], []
                add_key, add_size, add_mtime = keys.append, sizes.append, mtimes_us.append
        else:
            stack.pop()
    if keys:
        yield Objects(keys, sizes, mtimes_us)


def _sorted_folder(directory: str) -> list[tuple[str, os.DirEntry[str]]]:
    try:
        with os.scandir(directory) as entries:
            named = [
                (e.name + "/" if e.is_dir(follow_symlinks=False) else e.name, e) for e in entries
            ]
    except (FileNotFoundError, NotADirectoryError):
        return []
    named.sort(key=itemgetter(0))
    return named


@dataclass
class _Listing:
    """The source's objects as change rows, batch by batch, counted as they go."""

    g: Graveler
    source: Source
    dest: str
    progress: Progress | None
    count: int = 0
    bytes: int = 0
    _last: str = field(default="", repr=False)

    def objects(self) -> Iterator[Objects]:
        if self.source.scheme == FILE_SCHEME:
            return list_local("/" + self.source.key_prefix, self.source.key_prefix)
        store = self.g.objects(self.source.store_url)
        infos = iter(store.list_objects(self.source.key_prefix))
        return (Objects.of(chunk) for chunk in iter(lambda: list(islice(infos, BATCH)), []))

    def batches(self) -> Iterator[pa.Table]:
        self.count = self.bytes = 0
        self._last = ""
        for objects in self.objects():
            yield self._rows(objects)
            self.count += len(objects.keys)
            self.bytes += sum(objects.sizes)
            if self.progress is not None:
                self.progress(self.count)
            failpoints.hit("import.after_batch")
        if not self.count:
            raise NotFound(f"no objects to import under {self.source.uri!r}")

    def _rows(self, objects: Objects) -> pa.Table:
        """Change rows of a batch, built and checked in Arrow: paths that can be keys, in key
        order (after the previous batch's last), checksums a record can hold."""
        keys = self._keys(objects.keys)
        below = pc.utf8_slice_codeunits(keys, len(self.source.key_prefix))
        paths = self._paths(pc.binary_join_element_wise(self.dest, below, ""), objects.keys)
        rows = len(objects.keys)
        arrays = [
            paths,
            pc.binary_join_element_wise(self.source.root, keys, ""),
            pa.array(objects.sizes, pa.int64()),
            _checksums(objects),
            pa.array(objects.mtimes_us, UTC_MICROS),
            pa.repeat(pa.scalar("", pa.string()), rows),
            pa.repeat(pa.scalar(False), rows),
        ]
        return pa.Table.from_arrays(arrays, schema=CHANGE_SCHEMA)

    def _keys(self, keys: list[str]) -> pa.Array:
        """The keys as text; a key UTF-8 cannot hold (a local file name that is no text) is
        refused naming it."""
        try:
            return pa.array(keys, pa.string())
        except (UnicodeEncodeError, pa.ArrowException):
            for key in keys:
                self._check(self._path_of(key), key)
        raise InvalidArgument(f"paths under {self.source.uri!r} cannot be stored as text")

    def _path_of(self, key: str) -> str:
        return self.dest + key[len(self.source.key_prefix) :]

    def _paths(self, paths: pa.Array, keys: list[str]) -> pa.Array:
        if pc.any(pc.match_substring(paths, "\x00")).as_py():
            for key in keys:
                self._check(self._path_of(key), key)
        before = [self._last] if self._last else []
        compared = pa.concat_arrays([pa.array(before, pa.string()), paths])
        out_of_order = pc.less_equal(compared[1:], compared[:-1])
        if pc.any(out_of_order).as_py():
            row = pc.index(out_of_order, True).as_py() + (0 if before else 1)
            raise Unavailable(
                f"the listing of {self.source.uri!r} is not in key order at "
                f"{self.source.root + keys[row]!r}; nothing was committed"
            )
        if len(paths):
            self._last = paths[-1].as_py()
        return paths

    def _check(self, path: str, key: str) -> None:
        try:
            check_path(path)
        except InvalidArgument as exc:
            raise InvalidArgument(
                f"object {self.source.root + key!r} cannot be imported ({exc}); nothing "
                "was committed: import a prefix without it"
            ) from None


def _checksums(objects: Objects) -> pa.Array:
    """`etag:` and each object's ETag, or for a local file (no ETag) its modification time in
    microseconds and size, in hex, as web servers make ETags. ETags are checked in Arrow; one
    no record could hold (`check_checksum`) is itself hex-encoded."""
    if objects.etags is None:
        pairs = zip(objects.mtimes_us, objects.sizes, strict=True)
        return pa.array(list(map(f"{CHECKSUM_PREFIX}%x-%x".__mod__, pairs)), pa.string())
    texts = [CHECKSUM_PREFIX + etag for etag in objects.etags]
    checksums = pa.array(texts, pa.string())
    if not pc.all(pc.match_substring_regex(checksums, f"^{CHECKSUM_PATTERN}$")).as_py():
        texts = [_held(text) for text in texts]
        checksums = pa.array(texts, pa.string())
    return checksums


def _held(checksum: str) -> str:
    try:
        return check_checksum(checksum)
    except InvalidArgument:
        return CHECKSUM_PREFIX + checksum.removeprefix(CHECKSUM_PREFIX).encode().hex()[:100]


@dataclass(frozen=True)
class _ImportPlan:
    """An import for `merge.land`: the listing applied onto HEAD, a commit on HEAD alone;
    uncommitted changes stay staged above it."""

    sides: tuple[str, str]
    listing: _Listing
    message: str
    metadata: dict[str, str]
    committer: str
    strategy: str | None = None
    allow_dirty: bool = True
    verb: str = "importing into it"

    def first(self, g: Graveler, repo: RepositoryRecord, head: Commit) -> Attempt:
        rows: Iterable[pa.Table] = self.listing.batches()
        merged = g.committed(repo).apply_rows(head.metarange_id, rows, head.metarange_id)
        return Attempt(merged, head.id, ())

    def record(self, g: Graveler, repo: RepositoryRecord, head: Commit, at: Attempt) -> Commit:
        if at.metarange_id == head.metarange_id:
            raise NoChanges(f"{self.sides[1]!r} already holds every object of {self.sides[0]!r}")
        commit = g.refs.add_commit(
            repo, (head,), at.metarange_id, self.message, self.metadata, committer=self.committer
        )
        failpoints.hit("import.after_record")
        return commit

    def gave_up(self, repo: RepositoryRecord, attempts: int, last: Attempt | None) -> Exception:
        what = f"import of {self.sides[0]!r} into {self.sides[1]!r} of {repo.name!r}"
        return too_many_tries(what, attempts)
