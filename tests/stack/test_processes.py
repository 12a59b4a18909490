"""Stopping the stack's processes by pid: whole groups, escaped children, never a reused pid."""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from pathlib import Path

from branchwater.stack import processes
from tests.helpers.servers import unique_name

ESCAPE = (
    "import subprocess, sys, time\n"
    "subprocess.Popen(['sleep', '300'], start_new_session=True, env={})\n"
    "time.sleep(300)\n"
)
"""A server that starts a child in a session of its own, without the marker in its environment."""


def start(tmp_path: Path, argv: list[str], stack_id: str) -> processes.Process:
    return processes.spawn(
        argv,
        env={**os.environ, processes.MARKER: stack_id},
        log_path=tmp_path / "log",
        cwd=tmp_path,
    )


def wait_for(count: int, stack_id: str, run_dir: Path) -> list[int]:
    deadline = time.monotonic() + 30
    while len(found := processes.stack_processes(stack_id, run_dir)) < count:
        assert time.monotonic() < deadline, f"only {found} started"
        time.sleep(0.05)
    return found


def test_stop_ends_the_whole_group(tmp_path: Path) -> None:
    stack_id = unique_name("test-")
    server = start(tmp_path, ["sh", "-c", "sleep 300 & sleep 300"], stack_id)
    assert len(wait_for(3, stack_id, tmp_path / "elsewhere")) == 3  # sh and both sleeps
    processes.stop(server, grace=5)
    assert processes.stack_processes(stack_id, tmp_path / "elsewhere") == []


def test_a_child_that_left_the_group_is_found_by_its_working_directory(tmp_path: Path) -> None:
    stack_id = unique_name("test-")
    server = start(tmp_path, [sys.executable, "-c", ESCAPE], stack_id)
    found = wait_for(2, stack_id, tmp_path)
    processes.stop(server, grace=5)
    escaped = processes.stack_processes(stack_id, tmp_path)
    assert len(escaped) == 1 and escaped[0] in found and escaped[0] != server.pid
    processes.kill(escaped[0])
    assert processes.stack_processes(stack_id, tmp_path) == []


def test_a_pid_that_names_another_process_is_left_alone(tmp_path: Path) -> None:
    stack_id = unique_name("test-")
    server = start(tmp_path, ["sleep", "300"], stack_id)
    reused = replace(server, started=server.started - 1)
    processes.stop(reused, grace=0)
    assert processes.running(server)
    processes.stop(server, grace=0)
    assert not processes.running(server)
