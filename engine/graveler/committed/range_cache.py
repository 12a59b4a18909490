"""A machine-wide cache of verified ranges on local disk, shared by every process.

Reading a range from the object store costs a Parquet decode and a full re-hash against its
id. Without this cache each new process (a CLI call, an Airflow task, a merge contender) pays
that for every range it touches, even when another process on the machine has just read or
written the same range. lakeFS keeps a local tier of range files
for the same reason.

Files are Arrow IPC under the range id, memory-mapped on a hit: no decode, no copy, and the
processes share the pages. Range ids name content, so one cache serves every lake and
namespace on the machine. Only ranges whose id was verified against their content (read) or
computed from it (written) go in. A file is written under a temporary name and renamed, so a
reader sees a whole file or none, and a file that does not open or names another range is
dropped and read from storage instead. The cache is trimmed to `max_bytes`, oldest use
first, each time a process has added an eighth of that. Between trims each process can add
up to that eighth, so the bound is soft.

A hit is trusted by the id stored in the file, without hashing its content again, only when
the directory is private: owned by this process's user and writable by nobody else (it is
created with mode 0700; files are 0600). Whoever else could plant a file there could change
the process itself. Re-hashing every hit would give back much of what the cache saves
against local storage (a hit is a file read; a hashed hit reads and hashes the range, a
large share of reading it again). In a directory others can write to (a shared
`BRANCHWATER_CACHE_DIR`, an old one made group-writable by a umask of 002), every hit is
hashed against its id instead, and a mismatch dropped.
"""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc

from branchwater.engine.errors import InvalidArgument
from branchwater.engine.graveler.committed.format import RANGE_SCHEMA, check_id
from branchwater.engine.graveler.committed.format import range_id as id_of_range

log = logging.getLogger(__name__)

CACHE_DIR_ENV = "BRANCHWATER_CACHE_DIR"
"""Where the default range cache lives; set it to the empty string to turn the cache off."""
DEFAULT_MAX_BYTES = 1 << 30

_ID_KEY = b"branchwater.range_id"
_TEMP_PREFIX = ".tmp-"
_STALE_TEMP_S = 3600.0
"""A temporary file this old belongs to a writer that died; a trim removes it."""


def default_cache_dir() -> Path | None:
    """`$BRANCHWATER_CACHE_DIR`, else the user's cache directory; None if turned off.

    A process with no home directory (no `$HOME` and no passwd entry, as in some containers)
    runs without the cache rather than failing: the cache only saves work.
    """
    configured = os.environ.get(CACHE_DIR_ENV)
    if configured is not None:
        return Path(configured) if configured else None
    xdg = os.environ.get("XDG_CACHE_HOME")
    if xdg:
        return Path(xdg) / "branchwater" / "ranges"
    try:
        return Path.home() / ".cache" / "branchwater" / "ranges"
    except RuntimeError:
        log.info("no home directory: the range cache is off")
        return None


@dataclass
class RangeCache:
    """Verified range tables by id, in `directory`; see the module docstring."""

    directory: Path
    max_bytes: int = DEFAULT_MAX_BYTES
    _added: int = field(default=0, init=False, repr=False)
    _disabled: bool = field(default=False, init=False, repr=False)
    _private: bool | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.max_bytes, int) or isinstance(self.max_bytes, bool):
            raise InvalidArgument(f"range cache max_bytes must be an int, not {self.max_bytes!r}")
        if self.max_bytes < 1:
            raise InvalidArgument(f"range cache max_bytes must be >= 1, not {self.max_bytes}")
        self.directory = Path(self.directory)

    def get(self, range_id: str) -> pa.Table | None:
        """The cached range, or None. A damaged or misnamed file is removed."""
        path = self._path(range_id)
        try:
            with pa.memory_map(str(path)) as source:
                table = ipc.open_file(source).read_all()
        except FileNotFoundError:
            return None
        except (OSError, pa.ArrowException) as exc:
            log.warning("dropping unreadable cached range %s: %s", path, exc)
            _unlink(path)
            return None
        metadata = table.schema.metadata or {}
        if metadata.get(_ID_KEY) != range_id.encode() or not table.schema.equals(RANGE_SCHEMA):
            log.warning("dropping cached range %s: it holds another range", path)
            _unlink(path)
            return None
        table = table.replace_schema_metadata(RANGE_SCHEMA.metadata)
        if not self._is_private() and id_of_range(table) != range_id:
            log.warning("dropping cached range %s: its content is not that range's", path)
            _unlink(path)
            return None
        _touch(path)
        return table

    def put(self, range_id: str, table: pa.Table) -> None:
        """Keep a range whose id is known to match `table`. Failures only log: a cache that
        cannot write (a full disk, a read-only directory) must not fail the operation."""
        path = self._path(range_id)
        if self._disabled or path.exists():
            return
        try:
            self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            named = {**RANGE_SCHEMA.metadata, _ID_KEY: range_id.encode()}
            size = _write_atomically(path, table.replace_schema_metadata(named))
        except OSError as exc:
            log.warning("range cache %s is not writable, not caching: %s", self.directory, exc)
            self._disabled = True
            return
        self._added += size
        if self._added * 8 >= self.max_bytes:
            self.trim()

    def trim(self) -> None:
        """Remove the least recently used ranges until the cache holds at most `max_bytes`,
        and temporary files their writers left behind."""
        self._added = 0
        now = time.time()
        files: list[tuple[float, int, Path]] = []
        try:
            entries = list(os.scandir(self.directory))
        except FileNotFoundError:
            return
        for entry in entries:
            try:
                stat = entry.stat()
            except FileNotFoundError:
                continue
            if entry.name.startswith(_TEMP_PREFIX):
                if now - stat.st_mtime > _STALE_TEMP_S:
                    _unlink(Path(entry.path))
                continue
            files.append((stat.st_mtime, stat.st_size, Path(entry.path)))
        total = sum(size for _, size, _ in files)
        for _, size, path in sorted(files):
            if total <= self.max_bytes:
                break
            _unlink(path)
            total -= size

    def _is_private(self) -> bool:
        """Whether only this process's user can write to the directory (see the module
        docstring); asked once per cache, at its first hit."""
        if self._private is None:
            try:
                st = os.stat(self.directory)
            except OSError:
                return False
            self._private = st.st_uid == os.getuid() and not st.st_mode & 0o022
            if not self._private:
                log.info("range cache %s is writable by others: hashing every hit", self.directory)
        return self._private

    def _path(self, range_id: str) -> Path:
        return self.directory / check_id("range", range_id)


def _write_atomically(path: Path, table: pa.Table) -> int:
    fd, temp = tempfile.mkstemp(dir=path.parent, prefix=_TEMP_PREFIX)
    try:
        with os.fdopen(fd, "wb") as sink, ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        size = os.path.getsize(temp)
        os.replace(temp, path)
    except BaseException:
        _unlink(Path(temp))
        raise
    return size


def _touch(path: Path) -> None:
    """Mark a hit, so a trim removes it last; a read-only cache still serves."""
    with contextlib.suppress(OSError):
        os.utime(path)


def _unlink(path: Path) -> None:
    """Remove a cache file; another process may have removed it first. Readers that mapped
    it keep their pages."""
    try:
        path.unlink()
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("cannot remove cached range %s: %s", path, exc)
