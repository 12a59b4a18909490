"""Start a server in its own process group, and stop it by its pid.

Every process is started in a new session, so its pid is also its process group id and
stopping the group stops whatever it forked (Airflow's task processes, Spark's executors).
Each carries a marker variable in its environment that its children inherit; a stop checks
the marker before signalling a pid from a file, so a pid the system reused for another
program is never touched, and `marked_processes` finds any descendant that left the group.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

MARKER = "BRANCHWATER_STACK_ID"
"""The environment variable naming the stack a process belongs to."""
STOP_GRACE = 20.0
"""Seconds a process group gets to exit on SIGTERM before it is killed."""


def spawn(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    log_path: Path,
    cwd: Path,
) -> int:
    """Start `argv` detached in its own session, output to `log_path`; returns its pid."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            list(argv),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=dict(env),
            start_new_session=True,
        )
    return process.pid


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie child of ours is reaped and counts as gone)."""
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def stack_of(pid: int) -> str | None:
    """The marker in `pid`'s environment: the stack it belongs to, if any."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    prefix = f"{MARKER}=".encode()
    for item in environ.split(b"\0"):
        if item.startswith(prefix):
            return item[len(prefix) :].decode(errors="replace")
    return None


def marked_processes(stack_id: str) -> list[int]:
    """Every running process that carries `stack_id`'s marker, whatever its group."""
    found = []
    for entry in Path("/proc").iterdir():
        if (
            entry.name.isdigit()
            and stack_of(int(entry.name)) == stack_id
            and alive(int(entry.name))
        ):
            found.append(int(entry.name))
    return found


def stop(pid: int, stack_id: str, grace: float = STOP_GRACE) -> None:
    """SIGTERM `pid`'s process group, SIGKILL it after `grace` seconds; a no-op for a pid
    that is gone or now belongs to something else."""
    if not alive(pid) or stack_of(pid) != stack_id:
        return
    _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    _signal_group(pid, signal.SIGKILL)
    while alive(pid):
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
