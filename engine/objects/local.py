"""Local-filesystem `ObjectStore` (`file:///root`), the embedded default.

Writes stream to a hidden temporary file in the target directory and are renamed into
place, so a reader never sees a half-written object and a failed write leaves none. A write
returns only once the file and its name are on disk (`fsync` of the file, then of its
folder): the KV store (SQLite syncs every commit by default) records objects once written,
and after a power cut a record must not name a file that is gone or empty (`SYNC_ENV` turns
this off where files are thrown away anyway: a test suite, a benchmark). A file system's
error (a full disk, a read-only mount, a path whose folder is an object) is a typed error
naming the key, never a bare `OSError`; a temporary file it could not remove is left for
`discard_abandoned_writes`.
"""

from __future__ import annotations

import contextlib
import errno
import os
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from pathlib import Path
from stat import S_ISREG
from typing import BinaryIO
from urllib.parse import unquote, urlsplit

from branchwater.engine.errors import (
    BranchwaterError,
    ConfigurationError,
    InvalidArgument,
    NotFound,
    Unavailable,
)
from branchwater.engine.objects.native_exit import drain_native_readers_at_exit
from branchwater.engine.objects.store import (
    Discarded,
    Listing,
    ObjectInfo,
    ObjectStore,
    Stats,
    StreamSource,
    check_folder,
    check_moment,
    check_object_key,
    iter_chunks,
)
from branchwater.engine.units import epoch_micros, from_epoch_micros
from branchwater.engine.urls import redact_url

_TMP_PREFIX = ".tmp-"
SYNC_ENV = "BRANCHWATER_LOCAL_FSYNC"
"""`off` (or `0`, `false`, `no`) skips the `fsync`s: writes stay atomic, but a power cut
may lose the last ones while the KV store keeps their records. Read when a store opens."""
_OFF = frozenset({"off", "0", "false", "no"})
_NO_SPACE = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
_REFUSED = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})
_NO_HARD_LINKS = frozenset({errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS})
"""What `link` says on a file system without hard links (FAT, some network mounts)."""
_NO_FOLDER_SYNC = frozenset({errno.EINVAL, errno.EBADF, errno.EOPNOTSUPP, errno.ENOTSUP})


class LocalObjectStore(ObjectStore):
    def __init__(self, url: str) -> None:
        try:
            parts = urlsplit(url)
        except ValueError:
            parts = None
        if (
            parts is None
            or parts.scheme != "file"
            or parts.netloc not in ("", "localhost")
            or not parts.path
        ):
            raise ConfigurationError(
                f"local object store URL {redact_url(url)!r} must look like file:///absolute/path"
            )
        self.root = Path(unquote(parts.path))
        self.url = f"file://{self.root.as_posix()}"
        self.sync = os.environ.get(SYNC_ENV, "on").strip().lower() not in _OFF
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise Unavailable(
                f"cannot create object store root {self.url}: {exc.strerror}"
            ) from exc
        try:
            self._name_max = os.pathconf(self.root, "PC_NAME_MAX")
        except (OSError, ValueError):
            self._name_max = 255

    def _path(self, key: str) -> Path:
        """The file of `key`; a key this store cannot hold as a file is refused, saying why."""
        if "\x00" in check_object_key(key):
            raise InvalidArgument(
                f"object key {key!r} holds a NUL, which no file name in the local object store "
                f"{self.url} can"
            )
        for part in key.split("/"):
            if len(os.fsencode(part)) > self._name_max:
                raise InvalidArgument(
                    f"object key {key!r} has a part longer than the {self._name_max} bytes a "
                    f"file name holds in the local object store {self.url}; shorten it"
                )
        return self.root / key

    def put_stream(self, key: str, source: StreamSource, size: int | None = None) -> ObjectInfo:
        path = self._writable(key)
        tmp, made = self._written(path, key, source)
        try:
            self._publish(tmp, path, key)
        except BaseException:
            _remove(tmp)
            raise
        with self._os_errors("write", key):
            self._sync_names(path, made)
            return self._info(key, path.stat())

    def _publish(self, tmp: Path, path: Path, key: str) -> None:
        try:
            os.replace(tmp, path)
        except FileNotFoundError:
            raise self._discarded(key) from None
        except OSError as exc:
            raise self._failed("write", key, exc) from exc

    def _discarded(self, key: str) -> Unavailable:
        """The error of a write whose temporary file a sweep took before it was in place."""
        return Unavailable(
            f"the write of {key!r} to {self.url} was discarded before it finished: a GC "
            "sweep takes a write that has not moved for a day as abandoned; write it again"
        )

    def put_if_absent(self, key: str, encode: Callable[[], bytes]) -> bool:
        """The finished file is linked into place, which fails if the name is taken: one of
        two racing writers writes. A file system without hard links gets the rename, as
        `put` does."""
        path = self._writable(key)
        with self._os_errors("write", key):
            if path.is_file():
                return False
        tmp, made = self._written(path, key, [encode()])
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        except FileNotFoundError:
            raise self._discarded(key) from None
        except OSError as exc:
            if exc.errno not in _NO_HARD_LINKS:
                raise self._failed("write", key, exc) from exc
            self._publish(tmp, path, key)
        finally:
            _remove(tmp)
        with self._os_errors("write", key):
            self._sync_names(path, made)
        return True

    def _writable(self, key: str) -> Path:
        """The file of `key`, refusing keys with a `.tmp-` part: listings leave those out as
        writes in progress, so the object would be written yet never listed."""
        path = self._path(key)
        if any(part.startswith(_TMP_PREFIX) for part in key.split("/")):
            raise InvalidArgument(
                f"object key {key!r} has a part starting with {_TMP_PREFIX!r}, which the "
                f"local object store {self.url} reserves for writes in progress; rename it"
            )
        return path

    def _written(self, path: Path, key: str, source: StreamSource) -> tuple[Path, list[Path]]:
        """`source` in a new file beside `path`, named as a write in progress and synced to
        disk, and the folders made for it; nothing is left behind if writing fails. The
        source's own errors pass as they are, the file system's are typed (`_failed`)."""
        tmp = path.with_name(f"{_TMP_PREFIX}{uuid.uuid4().hex}")
        with self._os_errors("write", key):
            made = _made_folders(path.parent)
            f = open(tmp, "xb")  # noqa: SIM115 - closed below: a failed close must not hide why
        try:
            for chunk in iter_chunks(source):
                with self._os_errors("write", key):
                    f.write(chunk)
            with self._os_errors("write", key):
                f.flush()
                if self.sync:
                    os.fsync(f.fileno())
                f.close()
        except BaseException:
            with contextlib.suppress(OSError):
                f.close()
            _remove(tmp)
            raise
        return tmp, made

    def _sync_names(self, path: Path, made: list[Path]) -> None:
        """Put the new name of `path` on disk, and those of the folders made for it."""
        if not self.sync:
            return
        _sync_folder(path.parent)
        for folder in made:
            _sync_folder(folder.parent)

    @contextlib.contextmanager
    def _os_errors(self, doing: str, key: str, noun: str = "object") -> Iterator[None]:
        try:
            yield
        except OSError as exc:
            raise self._failed(doing, key, exc, noun) from exc

    def _failed(self, doing: str, key: str, exc: OSError, noun: str = "object") -> BranchwaterError:
        """The typed error of a file-system call that failed on `key`, saying what to do."""
        what = f"cannot {doing} {noun} {key!r} in the local object store {self.url}"
        if isinstance(exc, NotADirectoryError | IsADirectoryError | FileExistsError):
            return InvalidArgument(
                f"{what}: a folder of the path is an object, or the key is a folder "
                f"({exc.strerror}); a file system cannot hold both under one name"
            )
        if exc.errno in _NO_SPACE:
            return Unavailable(
                f"{what}: {exc.strerror}; nothing was written: free space on its file system "
                "(or raise the quota or file-size limit there), then write again"
            )
        if exc.errno in _REFUSED:
            access = "read" if doing in ("read", "list") else "write"
            return Unavailable(
                f"{what}: {exc.strerror}; let this user {access} there (permissions, a "
                "read-only mount), then try again"
            )
        return Unavailable(f"{what}: {exc.strerror or exc}")

    def discard_abandoned_writes(self, folder: str, before: datetime) -> Discarded:
        """Delete the `.tmp-` files under `folder` last modified before `before`. A live
        write touches its file with every chunk, so only a stopped one (its process killed)
        leaves a file that old; a write stalled that long loses its file and fails at its
        rename (`FileNotFoundError`), never publishing a partial object."""
        check_folder(folder)
        cutoff_ns = epoch_micros(check_moment(before, "before")) * 1000
        discarded = Discarded()
        try:
            for path, st in _temporary_files(self.root / folder if folder else self.root):
                if st.st_mtime_ns >= cutoff_ns:
                    continue
                try:
                    path.unlink()
                except (FileNotFoundError, NotADirectoryError):
                    continue  # renamed into place or removed meanwhile: nothing to discard
                discarded += Discarded(1, st.st_size)
        except OSError as exc:
            raise Unavailable(
                f"cannot discard abandoned writes in {self.url}: {exc.strerror}"
            ) from exc
        return discarded

    def open(self, key: str, *, etag: str | None = None) -> BinaryIO:
        """The file itself, buffered: the OS reads only what is asked (and its read-ahead).
        A file has no ETag, so `etag` pins nothing (`sources` checks a file's version)."""
        path = self._path(key)
        drain_native_readers_at_exit()
        try:
            return open(path, "rb")
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise NotFound(f"object {key!r} not found in {self.url}") from None
        except OSError as exc:
            raise self._failed("read", key, exc) from exc

    def stat(self, key: str) -> ObjectInfo:
        path = self._path(key)
        try:
            st = path.stat()
        except (FileNotFoundError, NotADirectoryError):
            raise NotFound(f"object {key!r} not found in {self.url}") from None
        except OSError as exc:
            raise self._failed("read", key, exc) from exc
        if not path.is_file():
            raise NotFound(f"object {key!r} not found in {self.url} (it is a directory)")
        return self._info(key, st)

    def delete(self, keys: Iterable[str]) -> None:
        """A key that names a folder names no object: like an absent one, not an error. The
        first other failure ends it, typed (`Unavailable`): the keys after it are not
        deleted, and no caller may count them as deleted."""
        for key in keys:
            path = self._path(key)
            try:
                path.unlink()
            except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
                continue
            except OSError as exc:
                if exc.errno == errno.EPERM and path.is_dir():
                    continue  # unlink of a folder, on systems that say EPERM (macOS)
                raise self._failed("delete", key, exc) from exc

    def list_objects(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """A prefix whose folder has an empty, `.` or `..` part matches no key: the file
        system would read `a//` as `a/`, and list `a/b` as `a//b`."""
        if not isinstance(prefix, str):
            raise InvalidArgument(f"list prefix must be a string, not {type(prefix).__name__}")
        base = prefix.rsplit("/", 1)[0] if "/" in prefix else ""
        if base:
            try:
                check_folder(base)
            except InvalidArgument:
                return iter(())
        start = self.root / base if base else self.root
        if not start.is_dir():
            return iter(())
        return self._walk(start, base, prefix)

    def list_folder(self, folder: str, *, metadata: bool = True) -> Listing:
        """One `os.scandir`: an entry's type is known without a `stat` on the usual file
        systems, so only `metadata` costs a call per file."""
        check_folder(folder)
        names: list[str] = []
        sizes: list[int] = []
        mtimes: list[int] = []
        directories: list[str] = []
        try:
            entries = os.scandir(self.root / folder if folder else self.root)
        except (FileNotFoundError, NotADirectoryError):
            return Listing(names, sizes if metadata else None, mtimes if metadata else None, [])
        except OSError as exc:
            raise self._failed("list", folder, exc, "folder") from exc
        with entries, self._os_errors("list", folder, "folder"):
            for entry in entries:
                if entry.name.startswith(_TMP_PREFIX):
                    continue
                if entry.is_dir(follow_symlinks=False):
                    directories.append(entry.name)
                elif entry.is_file():
                    if metadata:
                        try:
                            info = entry.stat()
                        except FileNotFoundError:
                            continue
                        sizes.append(info.st_size)
                        mtimes.append(info.st_mtime_ns)
                    names.append(entry.name)
        if not metadata:
            return Listing(names, None, None, directories)
        return Listing(names, sizes, mtimes, directories)

    def stat_many(self, keys: Sequence[str]) -> Stats:
        sizes: list[int | None] = []
        mtimes: list[int | None] = []
        for key in keys:
            try:
                info: os.stat_result | None = self._path(key).stat()
            except (FileNotFoundError, NotADirectoryError):
                info = None
            except OSError as exc:
                raise self._failed("read", key, exc) from exc
            if info is None or not S_ISREG(info.st_mode):
                sizes.append(None)
                mtimes.append(None)
            else:
                sizes.append(info.st_size)
                mtimes.append(info.st_mtime_ns)
        return Stats(sizes, mtimes)

    def _walk(self, directory: Path, dir_key: str, prefix: str) -> Iterator[ObjectInfo]:
        """Yield in key order: sorting a directory's entries as `name/` makes that exact."""
        try:
            entries = list(os.scandir(directory))
        except FileNotFoundError:
            return
        except OSError as exc:
            raise self._failed("list", dir_key, exc, "folder") from exc
        keyed = sorted(
            ((e.name + "/" if e.is_dir(follow_symlinks=False) else e.name), e)
            for e in entries
            if not e.name.startswith(_TMP_PREFIX)
        )
        for sort_name, entry in keyed:
            key = f"{dir_key}/{entry.name}" if dir_key else entry.name
            if sort_name.endswith("/"):
                if key.startswith(prefix) or prefix.startswith(key + "/"):
                    yield from self._walk(Path(entry.path), key, prefix)
            elif key.startswith(prefix):
                try:
                    yield self._info(key, entry.stat())
                except FileNotFoundError:
                    continue

    @staticmethod
    def _info(key: str, st: os.stat_result) -> ObjectInfo:
        """The file's mtime to the microsecond, truncated as an import's listing reads it
        (`st_mtime_ns // 1000`): the float `st_mtime` rounds, and may land a microsecond
        off the version an import recorded."""
        return ObjectInfo(key, st.st_size, from_epoch_micros(st.st_mtime_ns // 1000))


def _temporary_files(directory: Path) -> Iterator[tuple[Path, os.stat_result]]:
    """Every write-in-progress file below `directory` with its `stat`, symbolic links not
    followed (a link could lead out of the store)."""
    try:
        entries = list(os.scandir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return
    for entry in entries:
        if entry.is_dir(follow_symlinks=False):
            yield from _temporary_files(Path(entry.path))
        elif entry.name.startswith(_TMP_PREFIX) and entry.is_file(follow_symlinks=False):
            try:
                st = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # renamed into place since the directory was read
            yield Path(entry.path), st


def _made_folders(folder: Path) -> list[Path]:
    """Make `folder` and its missing parents; those this call made, the deepest first."""
    missing: list[Path] = []
    while not folder.is_dir():
        missing.append(folder)
        folder = folder.parent
    made: list[Path] = []
    for path in reversed(missing):
        try:
            os.mkdir(path)
        except FileExistsError:
            if not path.is_dir():
                raise
            continue
        made.append(path)
    return made[::-1]


def _sync_folder(folder: Path) -> None:
    """`fsync` a folder, so the names made or renamed in it survive a power cut. A file
    system that cannot sync a folder (some network and FUSE mounts) says so, as PostgreSQL
    found, and is let be: a write must not fail for it."""
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in _NO_FOLDER_SYNC:
            raise
    finally:
        os.close(fd)


def _remove(tmp: Path) -> None:
    """Remove a temporary file of a write that failed; one that cannot be removed (a
    read-only mount) stays for `discard_abandoned_writes`, whose names it has."""
    with contextlib.suppress(OSError):
        tmp.unlink()
