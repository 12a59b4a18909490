"""Start a server in its own process group, and stop it by its pid.

Every process is started in a new session, so its pid is also its process group id and
stopping the group stops whatever it forked (Airflow's task processes, Spark's executors).
A started process is recorded with its kernel start time: a pid read back from a file is
signalled only while that pid still names the same process, never one the system reused.
Processes that left the group are found by what they inherit: the stack's marker variable,
or a working directory inside the stack's own run folder (Airflow's servers rewrite their
environment's memory for their process titles, so the marker alone would miss them).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

MARKER = "BRANCHWATER_STACK_ID"
"""The environment variable naming the stack a process belongs to."""
STOP_GRACE = 20.0
"""Seconds a process group gets to exit on SIGTERM before it is killed."""
LOG_TAIL_LINES = 40


@dataclass(frozen=True)
class Process:
    """A process we started: its pid and its start time in clock ticks since boot."""

    pid: int
    started: int


def spawn(argv: Sequence[str], *, env: Mapping[str, str], log_path: Path, cwd: Path) -> Process:
    """Start `argv` detached in its own session, output appended to `log_path`."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        child = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=dict(env),
            start_new_session=True,
        )
    return Process(child.pid, start_time(child.pid) or 0)


def _stat(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name; [] when the pid is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def start_time(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[19]) if len(fields) > 19 else None


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie child of ours is reaped and counts as gone)."""
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return False
    fields = _stat(pid)
    return bool(fields) and fields[0] not in ("Z", "X")


def running(process: Process) -> bool:
    """Whether `process` still runs under its pid (not another program that reused it)."""
    return alive(process.pid) and start_time(process.pid) == process.started


def belongs(pid: int, stack_id: str, run_dir: Path) -> bool:
    """Whether `pid` carries the stack's marker or works inside its run folder."""
    with contextlib.suppress(OSError):
        prefix = f"{MARKER}=".encode()
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        if prefix + stack_id.encode() in environ:
            return True
    with contextlib.suppress(OSError):
        cwd = Path(os.readlink(f"/proc/{pid}/cwd"))
        return cwd.is_relative_to(run_dir.resolve())
    return False


def _pids() -> list[int]:
    """Every process id the system shows now."""
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def stack_processes(stack_id: str, run_dir: Path) -> list[int]:
    """Every running process of the stack, whatever its group."""
    own = os.getpid()
    return [pid for pid in _pids() if pid != own and belongs(pid, stack_id, run_dir) and alive(pid)]


def _group(pgid: int) -> list[int]:
    """The running processes of process group `pgid`."""
    return [pid for pid in _pids() if _in_group(pid, pgid)]


def _in_group(pid: int, pgid: int) -> bool:
    fields = _stat(pid)
    return len(fields) > 2 and int(fields[2]) == pgid and alive(pid)


def stop(process: Process, grace: float = STOP_GRACE) -> None:
    """SIGTERM `process`'s group, SIGKILL it after `grace` seconds, and return once no process
    of the group runs (the leader may exit before its children have); a no-op when the
    process is gone or its pid now names another one."""
    if not running(process):
        return
    _signal_group(process.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while (running(process) or _group(process.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    _signal_group(process.pid, signal.SIGKILL)
    while running(process) or _group(process.pid):
        time.sleep(0.05)


def kill(pid: int) -> None:
    """SIGKILL one process (a straggler outside the groups), waiting until it is gone."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    while alive(pid):
        time.sleep(0.05)


def _signal_group(pgid: int, signum: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def log_tail(log_path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last lines of a process's log, for an error message."""
    try:
        return "\n".join(log_path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
