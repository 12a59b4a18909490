"""A write through `branchwater://` whose writer failed stages nothing, however the file was
opened and closed: `fs.open` in binary or text mode, `fsspec.open` (which closes the file
from `__exit__` without the error) and pandas (which closes it in a `finally`); a file
dropped unclosed, or one whose spool refused a write, neither. A write after an exception
already handled is uploaded, and a process killed while writing stages nothing."""

from __future__ import annotations

import errno
import gc
import os
import signal
from collections.abc import Callable
from typing import Any

import fsspec
import pandas as pd
import pytest

from branchwater.engine import BranchwaterFileSystem, PathExists, ReadOnlyRef
from branchwater.engine.failpoints import ENV
from branchwater.engine.filesystem import PROTOCOL
from tests.filesystem.conftest import FsLake, staged
from tests.helpers.servers import forked_run

PATH = "out/report.csv"
ROWS = 400
"""Rows of 100 bytes: more than a text wrapper holds back, so a failed write has reached the
file before it fails."""


class Unprintable:
    """A cell pandas cannot render: `to_csv` fails on it after writing the rows before."""

    def __str__(self) -> str:
        raise RuntimeError("bad value in the last row")


def lines() -> list[str]:
    return [f"{i:>99}\n" for i in range(ROWS)]


def write_with_fsspec_open(fs_lake: FsLake, mode: str) -> None:
    with fsspec.open(fs_lake.url("main", PATH), mode, **fs_lake.options) as f:
        for line in lines():
            f.write(line if mode == "w" else line.encode())
        raise RuntimeError("the task failed mid-write")


def write_in_text_mode(fs_lake: FsLake) -> None:
    with fs_lake.fs.open(f"sales/main/{PATH}", "w") as f:
        f.writelines(lines())
        raise RuntimeError("the task failed mid-write")


def write_with_pandas(fs_lake: FsLake) -> None:
    frame = pd.DataFrame({"cell": [line.strip() for line in lines()] + [Unprintable()]})
    frame.to_csv(fs_lake.url("main", PATH), storage_options=fs_lake.options, chunksize=50)


FAILED_WRITES: dict[str, Callable[[FsLake], None]] = {
    "fsspec.open wb": lambda fs_lake: write_with_fsspec_open(fs_lake, "wb"),
    "fsspec.open w": lambda fs_lake: write_with_fsspec_open(fs_lake, "w"),
    "fs.open w": write_in_text_mode,
    "pandas to_csv": write_with_pandas,
}


def assert_nothing_written(fs_lake: FsLake) -> None:
    assert staged(fs_lake) == {}
    assert not fs_lake.fs.exists(f"sales/main/{PATH}")


@pytest.mark.parametrize("write", FAILED_WRITES.values(), ids=FAILED_WRITES.keys())
def test_a_writer_that_raises_uploads_nothing(
    fs_lake: FsLake, write: Callable[[FsLake], None]
) -> None:
    with pytest.raises(RuntimeError):
        write(fs_lake)
    assert_nothing_written(fs_lake)


@pytest.mark.parametrize("write", FAILED_WRITES.values(), ids=FAILED_WRITES.keys())
def test_a_writer_that_raises_inside_an_except_block_uploads_nothing(
    fs_lake: FsLake, write: Callable[[FsLake], None]
) -> None:
    """Opened while an exception is handled, the file tells that one from its writer's."""
    with pytest.raises(RuntimeError):
        try:
            raise KeyError("handled before the write")
        except KeyError:
            write(fs_lake)
    assert_nothing_written(fs_lake)


def test_an_exception_handled_when_opened_and_raised_on_uploads_nothing(fs_lake: FsLake) -> None:
    """The same exception, re-raised into the caller's `finally`, is the writer's failure."""
    opened = []

    def write_then_reraise() -> None:
        try:
            raise KeyError("handled, then raised on")
        except KeyError:
            f = fs_lake.fs.open(f"sales/main/{PATH}", "w")
            opened.append(f)
            f.writelines(lines())
            raise

    with pytest.raises(KeyError):
        try:
            write_then_reraise()
        finally:
            opened[0].close()
    assert_nothing_written(fs_lake)


def test_writes_after_a_handled_exception_are_uploaded(fs_lake: FsLake) -> None:
    fs, expected = fs_lake.fs, "".join(lines())
    f = fs.open("sales/main/closed-in-finally.csv", "w")
    try:
        try:
            raise KeyError("a missing key, handled")
        except KeyError:
            f.write(expected)
    finally:
        f.close()
    try:
        raise KeyError("a missing key, handled")
    except KeyError:
        with fsspec.open(fs_lake.url("main", "opened-in-except.csv"), "w", **fs_lake.options) as t:
            t.write(expected)
        with fs.open("sales/main/binary-in-except.csv", "wb") as b:
            b.write(expected.encode())
        pd.DataFrame({"id": [1, 2]}).to_csv(
            fs_lake.url("main", "pandas-in-except.csv"),
            storage_options=fs_lake.options,
            index=False,
        )
    main = fs_lake.repo.branch("main")
    for path in ("closed-in-finally.csv", "opened-in-except.csv", "binary-in-except.csv"):
        assert main.read(path) == expected.encode(), path
    assert main.read("pandas-in-except.csv") == b"id\n1\n2\n"


def test_a_file_closed_in_a_handler_that_swallows_its_exception_says_it_uploaded_nothing(
    fs_lake: FsLake, caplog: pytest.LogCaptureFixture
) -> None:
    """The documented limit: the close cannot tell a swallowed exception from the write's
    own failure, so it uploads nothing, and the log says how to write it instead."""
    f = fs_lake.fs.open(f"sales/main/{PATH}", "w")
    f.write("id\n1\n")
    try:
        raise ValueError("a bad row, skipped")
    except ValueError:
        f.close()
    assert_nothing_written(fs_lake)
    assert f"{PATH} was not uploaded" in caplog.text
    assert "close it after the except block" in caplog.text


@pytest.mark.parametrize("mode", ["wb", "w"])
def test_a_file_dropped_unclosed_uploads_nothing(fs_lake: FsLake, mode: str) -> None:
    f = fs_lake.fs.open(f"sales/main/{PATH}", mode)
    f.write("half" if mode == "w" else b"half")
    del f
    gc.collect()
    assert_nothing_written(fs_lake)


def test_a_write_the_spool_refuses_uploads_nothing(
    fs_lake: FsLake, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A text wrapper's final flush failing (a full disk) is not in sight when it closes the
    file, and a writer may swallow the error: the failed write itself marks the content
    incomplete. Data refused for its type wrote nothing, so it does not."""
    f = fs_lake.fs.open(f"sales/main/{PATH}", "w")
    f.write("held back by the text wrapper until it closes")

    def disk_full(data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(f.buffer._spool, "write", disk_full)
    with pytest.raises(OSError, match="No space left"):
        f.close()
    with fs_lake.fs.open(f"sales/main/{PATH}", "wb") as b:
        monkeypatch.setattr(b._spool, "write", disk_full)
        with pytest.raises(OSError, match="No space left"):
            b.write(b"lost")
    assert_nothing_written(fs_lake)
    with fs_lake.fs.open(f"sales/main/{PATH}", "wb") as b:
        with pytest.raises(TypeError):
            b.write("text, refused before any of it is written")
        b.write(b"bytes")
    assert fs_lake.repo.branch("main").read(PATH) == b"bytes"


def test_an_exclusive_open_is_refused_when_opened(fs_lake: FsLake) -> None:
    """`"xb"` on a path the branch shows raises `PathExists` (still a `FileExistsError`) when
    opened; at a tag it is `ReadOnlyRef`, whether or not the tag shows the path."""
    fs, main = fs_lake.fs, fs_lake.repo.branch("main")
    main.upload("lock", b"taken")
    main.upload("folder/inside", b"x")
    fs_lake.repo.tag("v1", main.commit("lock").id)
    for mode in ("xb", "x"):
        with pytest.raises(PathExists, match="sales/main/lock exists") as raised:
            fs.open("sales/main/lock", mode)
        assert isinstance(raised.value, FileExistsError)
    for path in ("sales/v1/lock", "sales/v1/free"):
        with pytest.raises(ReadOnlyRef, match="'v1' of repository 'sales' is not a branch"):
            fs.open(path, "xb")
    with fs.open("sales/main/folder", "xb") as f:
        f.write(b"an object beside the folder")
    with fs.transaction, pytest.raises(PathExists):
        fs.pipe("sales/main/written-inside", b"x")
        fs.open("sales/main/written-inside", "xb")
    assert staged(fs_lake) == {"folder": "added"}
    assert main.read("lock") == b"taken" and main.read("written-inside") == b"x"


def write_in_another_process(options: dict[str, Any], when: str) -> None:
    """Write a report through a filesystem of this process's own; SIGKILLed mid-write when
    `when` says so."""
    if PROTOCOL not in fsspec.available_protocols():
        fsspec.register_implementation(PROTOCOL, BranchwaterFileSystem)
    with fsspec.open("branchwater://sales/main/out/report.csv", "w", **options) as f:
        f.write("id\n1\n" * 10_000)
        if when == "mid-write":
            os.kill(os.getpid(), signal.SIGKILL)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("when", "failpoints", "objects_left"),
    [("mid-write", "", 0), ("before-stage", "write.before_stage=kill", 1)],
)
def test_a_process_killed_while_writing_stages_nothing(
    fs_lake: FsLake, when: str, failpoints: str, objects_left: int
) -> None:
    """Killed while writing, nothing reached the store; killed uploading at close, the object
    is written and nothing stages it: GC's to collect once old."""
    store = fs_lake.lake.graveler.objects(fs_lake.repo.storage_namespace)
    before = {info.key for info in store.list_objects()}
    child = forked_run(write_in_another_process, fs_lake.options, when, env={ENV: failpoints})
    assert child.code == -signal.SIGKILL, child
    assert_nothing_written(fs_lake)
    after = {info.key for info in store.list_objects()}
    assert len(after - before) == objects_left and before <= after, (before, after)
