"""The local store when its file system fails a write: a full disk, a file-size limit, a
read-only mount, a path whose folder is an object. Each is a typed error naming the key and
what to do, never a bare `OSError`; nothing is left under the final name, and no temporary
file either. Writes reach the disk before they return (`fsync` of the file before its rename,
of its folder after), unless `BRANCHWATER_LOCAL_FSYNC=off`.

The disk-full and read-only cases run in a child process: under a file-size limit
(`RLIMIT_FSIZE`: `EFBIG`), and on a tiny tmpfs mounted in a user and mount namespace of its
own (`unshare -rm`: `ENOSPC`, then `EROFS`), skipped where namespaces are not allowed.
"""

from __future__ import annotations

import errno
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import branchwater
from branchwater.engine.errors import InvalidArgument, Unavailable
from branchwater.engine.objects import local as local_module
from branchwater.engine.objects.local import LocalObjectStore

SRC = str(Path(branchwater.__file__).resolve().parents[1])
LIMIT = 1 << 20
"""The child's file-size limit and tmpfs size: what a write of more bytes fails at."""

CHILD = """
import json, os, sys
from branchwater.engine.objects.local import LocalObjectStore

root, big = sys.argv[1], int(sys.argv[2])
store = LocalObjectStore("file://" + root)
store.put("data/s1/kept", b"kept")

def attempt(name, write):
    try:
        write()
        return {"name": name, "error": None}
    except BaseException as exc:
        return {"name": name, "error": type(exc).__name__, "message": str(exc)}

results = [
    attempt("put_stream", lambda: store.put_stream("data/s1/big", [bytes(1 << 16)] * (big >> 16))),
    attempt("put", lambda: store.put("data/s2/big", bytes(big))),
    attempt("put_if_absent", lambda: store.put_if_absent("_branchwater/r1", lambda: bytes(big))),
]
if len(sys.argv) > 3:  # the mount is made read-only in between
    os.system(sys.argv[3])
    results += [
        attempt("put_small", lambda: store.put("data/s3/small", b"x")),
        attempt("delete", lambda: store.delete(["data/s1/kept"])),
    ]
left = sorted(
    os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs
)
print(json.dumps({"results": results, "left": left}))
"""


def run_child(args: list[str], **options: object) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": SRC}
    done = subprocess.run(
        [*args], capture_output=True, text=True, env=env, timeout=120, check=False, **options
    )  # type: ignore[call-overload]
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def limited_file_size() -> None:
    """In the child, before it runs: writes past `LIMIT` fail with `EFBIG` (no signal)."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT, LIMIT))


def check_failed_writes(outcome: dict[str, object], says: str) -> None:
    results = {r["name"]: r for r in outcome["results"]}  # type: ignore[attr-defined]
    for name in ("put_stream", "put", "put_if_absent"):
        assert results[name]["error"] == "Unavailable", results[name]
        assert says in results[name]["message"]
        assert "free space" in results[name]["message"]
    assert outcome["left"] == ["data/s1/kept"]


def test_a_write_past_a_file_size_limit_is_unavailable_and_leaves_nothing(
    tmp_path: Path,
) -> None:
    """`EFBIG` half-way: the bare `OSError` of a full disk, now `Unavailable`."""
    root = tmp_path / "root"
    outcome = run_child(
        [sys.executable, "-c", CHILD, str(root), str(4 * LIMIT)], preexec_fn=limited_file_size
    )
    check_failed_writes(outcome, "File too large")


@pytest.fixture
def namespaces() -> list[str]:
    """The command that runs a shell as root of a user and mount namespace of its own."""
    unshare = shutil.which("unshare")
    if unshare is None:
        pytest.skip("no unshare command")
    probe = subprocess.run([unshare, "-rm", "true"], capture_output=True, check=False)
    if probe.returncode != 0:
        pytest.skip(f"user namespaces are not allowed here: {probe.stderr.decode().strip()}")
    return [unshare, "-rm", "sh", "-c"]


def test_a_full_disk_then_a_read_only_mount_are_unavailable_and_leave_nothing(
    tmp_path: Path, namespaces: list[str]
) -> None:
    """`ENOSPC` on a full tmpfs, then `EROFS` once it is remounted read-only: bare
    `OSError`s, now `Unavailable` saying what to do; the delete refused is not taken as
    done."""
    root = tmp_path / "mnt"
    root.mkdir()
    script = (
        f"mount -t tmpfs -o size={LIMIT} tmpfs {root} && "
        f'exec "$0" -c "$1" {root} {4 * LIMIT} "mount -o remount,ro {root}"'
    )
    outcome = run_child([*namespaces, script, sys.executable, CHILD])
    check_failed_writes(outcome, "No space left on device")
    results = {r["name"]: r for r in outcome["results"]}  # type: ignore[attr-defined]
    for name in ("put_small", "delete"):
        assert results[name]["error"] == "Unavailable", results[name]
        assert "Read-only file system" in results[name]["message"]
        assert "read-only mount" in results[name]["message"]


@pytest.fixture
def store(tmp_path: Path) -> Iterator[LocalObjectStore]:
    yield LocalObjectStore(f"file://{tmp_path / 'root'}")


def test_a_key_below_an_object_or_over_a_folder_is_an_invalid_argument(
    store: LocalObjectStore,
) -> None:
    """S3 holds `a` and `a/b` at once, a file system cannot: a bare `FileExistsError` or
    `IsADirectoryError`, now `InvalidArgument` naming the key."""
    store.put("a", b"object")
    store.put("d/e", b"object")

    with pytest.raises(InvalidArgument, match=r"'a/b'.*cannot hold both"):
        store.put("a/b", b"x")
    with pytest.raises(InvalidArgument, match=r"'d'.*cannot hold both"):
        store.put("d", b"x")
    with pytest.raises(InvalidArgument, match="'a/b/c'"):
        store.put_if_absent("a/b/c", lambda: b"x")
    assert store.get("a") == b"object"
    assert [info.key for info in store.list_objects()] == ["a", "d/e"]


def test_a_delete_of_a_key_that_is_a_folder_deletes_nothing_and_is_no_error(
    store: LocalObjectStore,
) -> None:
    """A folder is no object, as an absent key is none: it raised `IsADirectoryError`."""
    store.put("d/e", b"object")

    store.delete(["d", "absent"])
    assert store.get("d/e") == b"object"


def test_a_sources_own_error_passes_as_it_is(store: LocalObjectStore) -> None:
    """Only the file system's errors are the store's: an `OSError` from reading the
    source is the caller's, and is not dressed as the store's."""

    def failing() -> Iterator[bytes]:
        yield b"start"
        raise OSError(5, "Input/output error reading the source")

    with pytest.raises(OSError, match="reading the source") as error:
        store.put_stream("k", failing())
    assert type(error.value) is OSError
    assert list(store.root.rglob("*.tmp-*")) == [] and not store.exists("k")


@pytest.fixture
def syncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What each `fsync` synced and each rename or link did, in order."""
    events: list[str] = []
    fsync, replace, link = os.fsync, os.replace, os.link

    def recording_fsync(fd: int) -> None:
        events.append("dir" if os.path.isdir(f"/proc/self/fd/{fd}") else "file")
        fsync(fd)

    def recording(kind: str, call: object) -> object:
        def recorded(*args: object) -> object:
            events.append(kind)
            return call(*args)  # type: ignore[operator]

        return recorded

    monkeypatch.setattr(local_module.os, "fsync", recording_fsync)
    monkeypatch.setattr(local_module.os, "replace", recording("rename", replace))
    monkeypatch.setattr(local_module.os, "link", recording("link", link))
    return events


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
def test_a_write_is_on_disk_before_it_returns(
    tmp_path: Path, syncs: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file's bytes before its rename (else a power cut may leave an empty object under
    its name, which a later `put_if_absent` takes as written), its name after, and the names
    of the folders made for it; a write returned only what the page cache held."""
    monkeypatch.delenv(local_module.SYNC_ENV, raising=False)
    store = LocalObjectStore(f"file://{tmp_path / 'root'}")
    syncs.clear()

    store.put("data/s1/o1", b"x")
    assert syncs == ["file", "rename", "dir", "dir", "dir"]
    syncs.clear()
    store.put("data/s1/o2", b"x")
    assert syncs == ["file", "rename", "dir"]
    syncs.clear()
    assert store.put_if_absent("_branchwater/r1", lambda: b"x")
    assert syncs == ["file", "link", "dir", "dir"]


def test_fsync_can_be_turned_off(
    tmp_path: Path, syncs: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(local_module.SYNC_ENV, "off")
    store = LocalObjectStore(f"file://{tmp_path / 'root'}")

    store.put("data/s1/o1", b"x")
    assert store.put_if_absent("_branchwater/r1", lambda: b"x")
    assert syncs == ["rename", "link"]


def test_a_folder_this_user_cannot_read_is_unavailable_naming_it(
    store: LocalObjectStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A listing or a look-up refused by the file system (`EACCES`: a GC run under another
    user than the writers) is `Unavailable` saying what to do, never a bare `OSError`."""
    store.put("data/s1/a", b"a")
    scandir, stat = os.scandir, Path.stat

    def refused_scandir(path: object) -> object:
        if str(path).endswith("s1"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        return scandir(path)  # type: ignore[arg-type]

    def refused_stat(self: Path, **options: object) -> os.stat_result:
        if self.name == "a":
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return stat(self, **options)  # type: ignore[arg-type]

    monkeypatch.setattr(local_module.os, "scandir", refused_scandir)
    monkeypatch.setattr(Path, "stat", refused_stat)
    for look in (
        lambda: store.list_folder("data/s1"),
        lambda: list(store.list_objects("data/")),
        lambda: store.stat_many(["data/s1/a"]),
    ):
        with pytest.raises(Unavailable, match=r"'data/s1.*let this user read there"):
            look()
