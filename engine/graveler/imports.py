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
reads the objects' bytes: the checksum is no content hash, so reads check the size and
the version (`sources.open_source`: an object rewritten at its source, before or while it
is read, is `CorruptedData`, not the commit's content), and the same bytes uploaded are a
different object.

**Keys S3 holds that no store key can be.** An object whose key ends in `/` is a folder
marker (the S3 console, Hadoop and others write them to show a folder), empty or not: it
is passed over and counted (`ImportResult.folder_markers`), as lakeFS's import and S3 tools
skip such keys, and as a local import finds no object for a folder. A path is a file or a
folder's prefix here, never both, so such bytes have no path to live at, and SeaweedFS
keeps none (it stores `a/` as a folder, listed empty). Any other key that is no plain
relative path (`a//b`, `a/../b`: AWS holds them verbatim, while obstore cannot address them
and directory-backed servers such as SeaweedFS rewrite or refuse them) could not be read
back as that key, so the import refuses the source (`InvalidImportSource`, naming them)
once it is listed, with nothing committed or staged. Local files have no such names. On a
server that keeps keys verbatim (AWS) the store lists an import's keys with boto3: obstore
lists a non-empty `a/` as an object `a`, and only the raw keys tell them apart.

**Flow.** The listing, as Arrow tables in key order (S3's pages, from the store's
`list_tables`; or a walk of local folders, each listed natively with its `stat`s and sorted
as keys sort, the next few listed in threads ahead of the walk), is cut into batches of
`BATCH` rows and turned into change rows in Arrow (no Python object per object), in a
thread a batch or two ahead (`read_ahead`), and streamed into `CommittedStore.apply_rows`
onto the branch's HEAD, which writes ranges as a commit does from staged rows; the commit
is then landed on the branch through the merge's retry loop (`merge.land`): a lost race
applies what the import brought in onto the new HEAD where that HEAD changed nothing under
the destination prefix, and lists the source again onto it where it did (so a listed value
wins as in an import started later), and the branch's uncommitted changes stay staged
above it. Nothing reaches the KV store before that one commit, so an import
that fails or is killed part way leaves the branch as it was (and unreferenced ranges, as a
failed commit does). Ranges are content-addressed: running the import again lists the same
objects, writes the same ranges and lands the same tree, or finds HEAD already holds it
(`commit` is then `None`).
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from typing import TypeVar, cast
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyarrow.fs import FileSelector, FileType, LocalFileSystem

from branchwater.engine import failpoints
from branchwater.engine.errors import (
    InvalidArgument,
    InvalidImportSource,
    NoChanges,
    NotFound,
    Unavailable,
    too_many_tries,
)
from branchwater.engine.graveler.checksums import CHECKSUM_MAX_LENGTH, IMPORTED_PREFIX, held
from branchwater.engine.graveler.committed.format import CHANGE_SCHEMA, UTC_MICROS
from branchwater.engine.graveler.external import FILE_SCHEME, S3_SCHEME
from branchwater.engine.graveler.graveler import Graveler
from branchwater.engine.graveler.merge import Attempt, land
from branchwater.engine.graveler.model import Commit, RepositoryRecord, check_commit_arguments
from branchwater.engine.graveler.names import MAX_PATH_BYTES, check_new_path, check_path
from branchwater.engine.graveler.namespaces import as_folder, location_of, overlap
from branchwater.engine.objects.s3 import LIST_SCHEMA, S3ObjectStore

BATCH = 10_000
"""Objects listed, checked and handed to the range writer at once."""
SOURCE_KEY = "branchwater.import.source"
"""Import commit metadata: the source prefix, as a URI ending in `/`."""
PREFIX_KEY = "branchwater.import.prefix"
"""Import commit metadata: the path prefix the objects were imported under."""
CHECKSUM_PATTERN = rf"[0-9A-Za-z+/=._:-]{{1,{CHECKSUM_MAX_LENGTH}}}"
"""What `checksums.check_checksum` accepts, for Arrow's regular expressions."""

NAMED = 10
"""Keys an import's refusal names at most (it counts the rest)."""
FIRST_BATCH = 1_000
"""The first batch's objects: later ones double up to `BATCH` (`rebatched`)."""
BATCHES_AHEAD = 2
"""Batches listed and made change rows ahead of the range writing, in a thread."""
FOLDERS_AHEAD = 4
"""Local folders listed ahead of the walk, at once (`list_local`)."""
_LOCAL = LocalFileSystem()

T = TypeVar("T")
Progress = Callable[[int], None]
"""Called after each batch with the number of objects listed so far."""


@dataclass(frozen=True)
class ImportResult:
    """What an import listed (`count` objects, `bytes` in all) and the commit holding them;
    `commit` is None when the branch already held every one as imported (a re-run).
    `folder_markers` counts the S3 objects whose key ends in `/` that it passed over:
    other tools write them to show a folder, and a folder is its paths' prefix here."""

    count: int
    bytes: int
    commit: Commit | None
    folder_markers: int = 0


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


def parse_source(uri: object) -> Source:
    """`s3://bucket[/prefix]` or `file:///absolute/dir` as a prefix: a trailing `/` is
    implied, a local directory resolved through symbolic links and checked to exist."""
    if not isinstance(uri, str):
        raise InvalidImportSource(f"an import source must be a string, not {type(uri).__name__}")
    if uri.startswith(S3_SCHEME):
        bucket, _, prefix = uri[len(S3_SCHEME) :].partition("/")
        if not bucket or "\x00" in prefix:
            raise InvalidImportSource(f"import source {uri!r} must look like s3://bucket/prefix/")
        return Source(S3_SCHEME, f"{S3_SCHEME}{bucket}", as_folder(prefix))
    path = unquote(uri[len(FILE_SCHEME) :])
    if uri.startswith(FILE_SCHEME + "/") and "\x00" not in path:
        directory = os.path.realpath(path)
        if not os.path.isdir(directory):
            raise NotFound(f"import source {uri!r} is not a directory")
        return Source(FILE_SCHEME, f"{FILE_SCHEME}/", as_folder(directory.lstrip("/")))
    raise InvalidImportSource(
        f"import source {uri!r} must be an s3://bucket/prefix/ or file:///absolute/dir/ URI"
    )


def check_outside_namespaces(g: Graveler, source: Source) -> None:
    """`InvalidImportSource` when the source and any repository's namespace overlap: one
    holds the other, so some repository's GC could delete an imported object (or the import
    would take in a repository's own data and ranges)."""
    for repo in g.refs.list_repositories():
        if overlap(source.uri, location_of(repo.storage_namespace)):
            raise InvalidImportSource(
                f"import source {source.uri!r} overlaps the storage namespace "
                f"{repo.storage_namespace!r} of repository {repo.name!r}: import only objects "
                "outside every namespace, which GC never deletes"
            )


def destination_prefix(prefix: object) -> str:
    """The path prefix objects are imported under, as a folder (`raw` is `raw/`)."""
    return as_folder(check_path(prefix, "import prefix", empty=True))


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
    return ImportResult(listing.count, listing.bytes, commit, listing.folder_markers)


def list_local(directory: str, key_prefix: str, fenced: Sequence[str] = ()) -> Iterator[pa.Table]:
    """Regular files under `directory` (whose key below the root is `key_prefix`) as
    `LIST_SCHEMA` tables in key order: a folder is one native listing with a `stat` per
    entry (`pyarrow.fs`), its files sorted as columns and its subfolders walked where their
    names sort with a `/` after them, as a stack of folders (any depth). The next
    `FOLDERS_AHEAD` subfolders of each folder being walked are listed in threads while the
    caller works on what came before. A file gone before its `stat`, or that is no regular
    file (a socket, a link to a folder), is left out; a name that is no UTF-8 text raises
    `_NotText`; a link to a file inside a location of `fenced` (the storage namespaces)
    raises `InvalidImportSource` (`_refuse_links_into`)."""
    pool = ThreadPoolExecutor(FOLDERS_AHEAD, thread_name_prefix="bw-import")
    folder = partial(_folder, fenced=tuple(fenced))
    try:
        stack = [_Level(pool, folder(directory, key_prefix), folder)]
        while stack:
            item = stack[-1].next()
            if item is None:
                stack.pop()
            elif isinstance(item, pa.Table):
                yield item
            else:
                stack.append(_Level(pool, item.result(), folder))
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


Folder = list[pa.Table | tuple[str, str]]
"""A folder's files as sorted runs and its subfolders (folder, key prefix), in key order."""


class _Level:
    """A folder being walked: its items in order, the listings of its next subfolders
    started."""

    def __init__(
        self, pool: ThreadPoolExecutor, items: Folder, folder: Callable[[str, str], Folder]
    ) -> None:
        self._pool = pool
        self._folder = folder
        self._items: list[pa.Table | tuple[str, str] | Future[Folder] | None] = list(items)
        self._at = 0
        self._ahead = 0
        for _ in range(FOLDERS_AHEAD):
            self._start_next()

    def next(self) -> pa.Table | Future[Folder] | None:
        """The next run of files or subfolder's listing; None at the end."""
        if self._at == len(self._items):
            return None
        item, self._items[self._at] = self._items[self._at], None
        self._at += 1
        self._start_next()
        return self._pool.submit(self._folder, *item) if isinstance(item, tuple) else item

    def _start_next(self) -> None:
        """Start listing the first subfolder not started yet."""
        self._ahead = max(self._ahead, self._at)
        while self._ahead < len(self._items):
            item = self._items[self._ahead]
            self._ahead += 1
            if isinstance(item, tuple):
                self._items[self._ahead - 1] = self._pool.submit(self._folder, *item)
                return


class _NotText(Exception):
    """A local file name that is no UTF-8 text, as the key it would have."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _folder(directory: str, key_prefix: str, fenced: tuple[str, ...] = ()) -> Folder:
    """One folder's `Folder`, its files cut into runs around its subfolders; a folder gone
    (or no longer one) is empty."""
    try:
        infos = _LOCAL.get_file_info(FileSelector(directory, allow_not_found=True))
        names = [info.base_name for info in infos]
        if fenced:
            _refuse_links_into(directory, key_prefix, fenced)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except UnicodeDecodeError:
        raise _NotText(key_prefix + _not_text(directory)) from None
    sizes = pa.array([info.size for info in infos], pa.int64())
    mtimes_us = np.array([info.mtime_ns for info in infos], np.int64) // 1000
    table = pa.table(
        {
            "key": pc.binary_join_element_wise(key_prefix, pa.array(names, pa.string()), ""),
            "size": sizes,
            "mtime": pa.array(mtimes_us, UTC_MICROS),
            "etag": pa.nulls(len(infos), pa.string()),
        }
    )
    folders = sorted(
        (key_prefix + names[row] + "/", infos[row].path)
        for row in pc.indices_nonzero(sizes.is_null()).to_pylist()
        if infos[row].type == FileType.Directory and not os.path.islink(infos[row].path)
    )
    files = table.filter(sizes.is_valid()).cast(LIST_SCHEMA).sort_by("key")
    cuts = [0]
    if folders:
        keys = files["key"].to_pylist()
        cuts += [bisect_left(keys, prefix) for prefix, _ in folders]
    cuts.append(len(files))
    out: Folder = [files.slice(cuts[0], cuts[1] - cuts[0])]
    for folder, start, end in zip(folders, cuts[1:-1], cuts[2:], strict=True):
        out += [(folder[1], folder[0]), files.slice(start, end - start)]
    return out


def _refuse_links_into(directory: str, key_prefix: str, fenced: tuple[str, ...]) -> None:
    """Refuse a link to a file inside a storage namespace, as a source inside one is
    (`check_outside_namespaces`): its entry's address is the link, so that namespace's GC,
    which sees no entry of its own there, could delete what the entry reads. One directory
    read per folder (`scandir` knows links without a `stat`)."""
    with os.scandir(directory) as entries:
        for entry in entries:
            if not entry.is_symlink() or not entry.is_file():
                continue
            target = FILE_SCHEME + os.path.realpath(entry.path)
            if any(overlap(target, there) for there in fenced):
                raise InvalidImportSource(
                    f"import source holds the link /{key_prefix}{entry.name} to {target}, "
                    "inside a storage namespace: GC of that namespace could delete what it "
                    "reads; import the file itself from outside every namespace"
                )


def _not_text(directory: str) -> str:
    """The first name in `directory` that is no UTF-8 text (with surrogates)."""
    for name in sorted(os.listdir(directory)):
        try:
            name.encode()
        except UnicodeEncodeError:
            return name
    return "?"


def read_ahead(items: Iterator[T], depth: int) -> Generator[T, None, None]:
    """`items`, each drawn in a thread of their own up to `depth` ahead of the caller: the
    listing's requests and rows overlap with the ranges written of those before. An error
    drawing one is raised here, in order; once this ends, no further one is drawn."""
    end = object()
    pool = ThreadPoolExecutor(1, thread_name_prefix="bw-import")
    try:
        pending = deque(pool.submit(next, items, end) for _ in range(depth))
        while (item := pending.popleft().result()) is not end:
            pending.append(pool.submit(next, items, end))
            yield cast(T, item)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def rebatched(
    tables: Iterable[pa.Table], rows: int, first: int | None = None
) -> Iterator[pa.Table]:
    """`tables`' rows again, `rows` a table (the last fewer); with `first`, the first table
    has that many and each next one twice the one before until `rows`, so the range writing
    starts after a folder or two is listed rather than ten."""
    held: list[pa.Table] = []
    count = 0
    size = min(rows, first or rows)
    for table in tables:
        held.append(table)
        count += len(table)
        while count >= size:
            joined = pa.concat_tables(held)
            yield joined.slice(0, size)
            held = [joined.slice(size)]
            count -= size
            size = min(rows, size * 2)
    if count:
        yield pa.concat_tables(held)


@dataclass
class _Listing:
    """The source's objects as change rows, batch by batch, counted as they go."""

    g: Graveler
    source: Source
    dest: str
    progress: Progress | None
    count: int = 0
    bytes: int = 0
    folder_markers: int = 0
    _last: str = field(default="", repr=False)
    _unreadable: list[str] = field(default_factory=list, repr=False)

    def changes(self) -> Iterator[pa.Table]:
        """The source's objects as change rows (`_rows`), `BATCH` at a time in key order,
        listed and made rows `BATCHES_AHEAD` ahead of the caller in a thread."""
        listed: Iterator[pa.Table]
        if self.source.scheme == FILE_SCHEME:
            fenced = [location_of(r.storage_namespace) for r in self.g.refs.list_repositories()]
            listed = list_local("/" + self.source.key_prefix, self.source.key_prefix, fenced)
        else:
            store = self.g.objects(self.source.store_url)
            assert isinstance(store, S3ObjectStore)
            listed = store.list_tables(self.source.key_prefix, skipped=self._skipped)
        batches = rebatched(listed, BATCH, FIRST_BATCH)
        return read_ahead(map(self._rows, batches), BATCHES_AHEAD)

    def batches(self) -> Iterator[pa.Table]:
        """The change rows to apply; `InvalidImportSource` once the whole source is listed
        if it holds keys no entry can point at (`_skipped`), with no row of the batches
        after the first of them handed on."""
        self.count = self.bytes = self.folder_markers = 0
        self._last = ""
        self._unreadable = []
        try:
            for rows in self.changes():
                self._check_paths(rows)
                if self._unreadable:
                    continue
                yield rows
                self.count += len(rows)
                self.bytes += pc.sum(rows["size"]).as_py() or 0
                if self.progress is not None:
                    self.progress(self.count)
                failpoints.hit("import.after_batch")
        except _NotText as exc:
            self._check(self._path_of(exc.key), exc.key)
            raise
        if self._unreadable:
            raise self._refusal()
        if not self.count:
            raise NotFound(f"no objects to import under {self.source.uri!r}")

    def _skipped(self, key: str, size: int) -> None:
        """A key the S3 listing left out: one ending in `/` is a folder marker, passed over
        and counted whatever its size; any other is an object no store key can address
        (`a//b`, `a/../b`), which the import refuses (`_refusal`)."""
        if key.endswith("/"):
            self.folder_markers += 1
        else:
            self._unreadable.append(key)

    def _refusal(self) -> InvalidImportSource:
        named = ", ".join(repr(self.source.root + key) for key in self._unreadable[:NAMED])
        more = len(self._unreadable) - NAMED
        return InvalidImportSource(
            f"{len(self._unreadable)} object(s) under {self.source.uri!r} cannot be imported: "
            f"{named}{f' and {more} more' if more > 0 else ''}. Their keys have empty, '.' or "
            "'..' parts (like a//b), which S3 holds verbatim but "
            "Branchwater's object layer cannot read back as the same key; nothing was "
            "committed or staged. Rename them at the source (aws s3 mv) or import prefixes "
            "that leave them out."
        )

    def _rows(self, objects: pa.Table) -> pa.Table:
        """Change rows of listed objects, built in Arrow: the path below the destination
        prefix, the object's URI as address, and the checksum."""
        keys = objects["key"].combine_chunks()
        below = pc.utf8_slice_codeunits(keys, len(self.source.key_prefix))
        rows = len(objects)
        arrays = [
            pc.binary_join_element_wise(self.dest, below, ""),
            pc.binary_join_element_wise(self.source.root, keys, ""),
            objects["size"].combine_chunks(),
            _checksums(objects, etags=self.source.scheme == S3_SCHEME),
            objects["mtime"].combine_chunks(),
            pa.repeat(pa.scalar("", pa.string()), rows),
            pa.repeat(pa.scalar(False), rows),
        ]
        return pa.Table.from_arrays(arrays, schema=CHANGE_SCHEMA)

    def _path_of(self, key: str) -> str:
        return self.dest + key[len(self.source.key_prefix) :]

    def _check_paths(self, rows: pa.Table) -> None:
        """Paths that can be keys, in key order after the previous batch's last."""
        paths = rows["path"].combine_chunks()
        addresses = rows["address"]
        odd = pc.or_(
            pc.match_substring(paths, "\x00"), pc.greater(pc.binary_length(paths), MAX_PATH_BYTES)
        )
        if pc.any(odd).as_py():
            for address in addresses.to_pylist():
                key = address[len(self.source.root) :]
                self._check(self._path_of(key), key)
        before = [self._last] if self._last else []
        compared = pa.concat_arrays([pa.array(before, pa.string()), paths])
        out_of_order = pc.less_equal(compared[1:], compared[:-1])
        if pc.any(out_of_order).as_py():
            row = pc.index(out_of_order, True).as_py() + (0 if before else 1)
            raise Unavailable(
                f"the listing of {self.source.uri!r} is not in key order at "
                f"{addresses[row].as_py()!r}; nothing was committed"
            )
        if len(paths):
            self._last = paths[-1].as_py()

    def _check(self, path: str, key: str) -> None:
        try:
            check_new_path(path)
        except InvalidArgument as exc:
            raise InvalidArgument(
                f"object {self.source.root + key!r} cannot be imported ({exc}); nothing "
                "was committed: import a prefix without it"
            ) from None


def _checksums(objects: pa.Table, *, etags: bool) -> pa.Array:
    """`etag:` and each object's ETag, or for a local file (no ETag) its modification time in
    microseconds and size, in hex, as web servers make ETags. ETags are checked in Arrow; one
    no record could hold (`check_checksum`) is itself hex-encoded."""
    if not etags:
        mtimes_us = objects["mtime"].combine_chunks().cast(pa.int64())
        sizes = objects["size"].combine_chunks()
        if (pc.min(mtimes_us).as_py() or 0) < 0:
            pairs = zip(mtimes_us.to_pylist(), sizes.to_pylist(), strict=True)
            return pa.array(list(map(f"{IMPORTED_PREFIX}%x-%x".__mod__, pairs)), pa.string())
        return pc.binary_join_element_wise(IMPORTED_PREFIX, _hex(mtimes_us), "-", _hex(sizes), "")
    checksums = pc.binary_join_element_wise(
        IMPORTED_PREFIX, pc.fill_null(objects["etag"].combine_chunks(), ""), ""
    )
    if not pc.all(pc.match_substring_regex(checksums, f"^{CHECKSUM_PATTERN}$")).as_py():
        checksums = pa.array([held(text) for text in checksums.to_pylist()], pa.string())
    return checksums


_HEX_DIGITS = np.frombuffer(b"0123456789abcdef", np.uint8)


def _hex(values: pa.Array) -> pa.Array:
    """Non-negative integers as `%x` writes them (lower case, no leading zeros), in numpy
    and Arrow: each value's 8 big-endian bytes as 16 digits, then leading zeros trimmed
    (keeping one). A Python `%` per object cost more than listing the object."""
    big_endian = np.ascontiguousarray(values.to_numpy(), dtype=">u8").view(np.uint8)
    nibbles = np.empty((len(values), 16), np.uint8)
    nibbles[:, 0::2] = big_endian.reshape(-1, 8) >> 4
    nibbles[:, 1::2] = big_endian.reshape(-1, 8) & 15
    digits = pa.py_buffer(np.take(_HEX_DIGITS, nibbles))
    fixed = pa.FixedSizeBinaryArray.from_buffers(pa.binary(16), len(values), [None, digits])
    text = pc.utf8_ltrim(fixed.cast(pa.binary()).cast(pa.string()), "0")
    return pc.if_else(pc.equal(text, ""), "0", text)


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

    def reuses_exactly(
        self, g: Graveler, repo: RepositoryRecord, head: Commit, previous: Attempt
    ) -> bool:
        """Whether `previous` merged onto `head` from the HEAD it was applied to is the
        listing applied to `head`: it is when `head` changed no path under the destination
        prefix, as every listed path is there (outside it, both take `head`'s entries;
        inside it, `head` is the old HEAD). Else the source is listed again onto `head`:
        a reuse would take `head`'s entry at a listed path the old HEAD already held with
        the listed value, and call a conflict what a fresh import overwrites."""
        onto = g.refs.get_commit(repo, previous.onto_commit_id).metarange_id
        moved = g.committed(repo).diff(onto, head.metarange_id)
        return not any(change.path.startswith(self.listing.dest) for change in moved)

    def record(self, g: Graveler, repo: RepositoryRecord, head: Commit, at: Attempt) -> Commit:
        if at.metarange_id == head.metarange_id:
            raise NoChanges(f"{self.sides[1]!r} already holds every object of {self.sides[0]!r}")
        commit = g.refs.add_commit(
            repo, (head,), at.metarange_id, self.message, self.metadata, committer=self.committer
        )
        failpoints.hit("import.after_record")
        return commit

    def gave_up(
        self, g: Graveler, repo: RepositoryRecord, attempts: int, last: Attempt | None
    ) -> Exception:
        what = f"import of {self.sides[0]!r} into {self.sides[1]!r} of {repo.name!r}"
        return too_many_tries(what, attempts)
