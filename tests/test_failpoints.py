"""Failpoints: armed in-process or from the environment, refusing names and actions they do
not know, and doing nothing when unarmed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from branchwater.engine import InvalidArgument, failpoints
from branchwater.engine.failpoints import FailpointHit
from tests.fixtures.failpoints import never_hit


def test_an_armed_point_runs_its_action_inside_the_block_only() -> None:
    calls: list[str] = []
    with failpoints.armed("copy.after_read", lambda: calls.append("hit")):
        failpoints.hit("copy.after_read")
        failpoints.hit("copy.after_record")
    failpoints.hit("copy.after_read")
    assert calls == ["hit"]


def test_blocks_arming_one_point_may_end_in_any_order(  # as blocks of two threads do
) -> None:
    calls: list[str] = []
    first = failpoints.armed("copy.after_read", lambda: calls.append("first"))
    second = failpoints.armed("copy.after_read", lambda: calls.append("second"))
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    failpoints.hit("copy.after_read")
    second.__exit__(None, None, None)
    failpoints.hit("copy.after_read")
    assert calls == ["second"]


def test_unknown_points_and_actions_are_refused() -> None:
    with pytest.raises(InvalidArgument, match="unknown failpoint 'copy\\.aftr_read'"):
        failpoints.arm_from_env("copy.aftr_read=raise")
    with pytest.raises(InvalidArgument, match="unknown action 'explode'"):
        failpoints.arm_from_env("copy.after_read=explode")
    failpoints.hit("copy.after_read")


def test_the_environment_arms_raise_and_kill_in_a_process_of_its_own() -> None:
    script = (
        "from branchwater.engine import failpoints\n"
        "failpoints.hit('copy.after_record')\n"
        "print('survived')\n"
        "failpoints.hit('copy.after_read')\n"
    )
    env = {**os.environ, failpoints.ENV: "copy.after_read=raise,copy.after_record=sleep(1)"}
    raised = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True)
    assert raised.stdout == b"survived\n"
    assert FailpointHit.__name__.encode() in raised.stderr
    env[failpoints.ENV] = "copy.after_read=kill"
    killed = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True)
    assert killed.returncode == -9 and killed.stdout == b"survived\n"


def test_fired_points_are_logged_in_process_and_in_subprocesses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(failpoints.LOG_ENV, str(tmp_path))
    with failpoints.armed("copy.after_read", lambda: None):
        failpoints.hit("copy.after_record")
        failpoints.hit("copy.after_read")
    script = "from branchwater.engine import failpoints\nfailpoints.hit('link.before_stage')\n"
    env = {**os.environ, failpoints.ENV: "link.before_stage=kill"}
    killed = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True)
    assert killed.returncode == -9
    assert failpoints.hit_names(str(tmp_path)) == {"copy.after_read", "link.before_stage"}
    assert "copy.after_read" not in never_hit(str(tmp_path))
    assert "copy.after_record" in never_hit(str(tmp_path))


def test_the_declared_points_are_those_the_code_passes() -> None:
    """The full run's check lists `POINTS`: a point the code passes but never declared could
    not be armed, nor be reported unhit."""
    root = Path(__file__).resolve().parents[1]
    passed: set[str] = set()
    for folder in ("engine", "spark_jobs", "plugin", "stack"):
        for path in (root / folder).rglob("*.py"):
            passed |= set(re.findall(r'\bhit\(\s*"([^"]+)"', path.read_text()))
    assert passed == failpoints.POINTS


def test_the_architecture_table_names_declared_points_and_every_operation() -> None:
    """Stale names fail; a new point of an operation the table has may land before its row."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "design" / "testing.md").read_text()
    table = text.split("### Failpoints", 1)[1].split("\n| ", 1)[1]
    named = set(re.findall(r"`([a-z_]+(?:\.[a-z_]+)+)`", table))
    assert named <= failpoints.POINTS
    operations = {name.split(".")[0] for name in named}
    assert {name for name in failpoints.POINTS if name.split(".")[0] not in operations} == set()


def _inner_pytest(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """A pytest session of its own in `folder`, with the coverage plugin and no log inherited."""
    env = {k: v for k, v in os.environ.items() if k != failpoints.LOG_ENV}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    command = [sys.executable, "-m", "pytest", "-p", "tests.fixtures.failpoints"]
    command += ["-p", "no:cacheprovider", "-q", *args]
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True)


def test_a_full_run_fails_naming_the_points_no_test_fired(tmp_path: Path) -> None:
    (tmp_path / "test_some.py").write_text(
        "from branchwater.engine import failpoints\n"
        "def test_one():\n"
        "    with failpoints.armed('copy.after_read', lambda: None):\n"
        "        failpoints.hit('copy.after_read')\n"
        "def test_all():\n"
        "    for name in failpoints.POINTS - {'copy.after_read', 'link.before_stage'}:\n"
        "        with failpoints.armed(name, lambda: None):\n"
        "            failpoints.hit(name)\n"
    )
    full = _inner_pytest(tmp_path)
    assert full.returncode == 1, full.stdout
    assert "failpoints never hit by any test (1): link.before_stage;" in full.stdout
    assert _inner_pytest(tmp_path, "-k", "one").returncode == 0
    assert _inner_pytest(tmp_path, "test_some.py").returncode == 0
    assert _inner_pytest(tmp_path, "--ignore", "other.py").returncode == 0
