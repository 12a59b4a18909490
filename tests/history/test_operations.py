"""A worker's plan is drawn from its seed alone, hostile input included: a worker started
again after a kill, or a run reproducing a printed seed, draws the same operations."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

from branchwater.engine.graveler.names import check_path
from tests.history.operations import PATHS, Plan, Task, paths

ROOT = Path(__file__).resolve().parents[2]


def steps(seed: int) -> list[tuple[str, dict[str, Any], str | None, list[str]]]:
    """Worker 1's steps of a long plan, but the `repr` of their hostile values (an
    `object()` names its address)."""
    task = Task("sqlite://", None, "repo", seed=seed, worker=1, operations=60, log_path="-")
    return [
        (s.kind, {k: v for k, v in s.args.items() if k != "hostile"}, s.fault, sorted(s.hostile))
        for s in Plan.draw(task).steps
    ]


def test_a_plan_is_its_seeds_in_a_fresh_process() -> None:
    """Hypothesis mixes the constants of the loaded modules' source into what it draws; a
    fresh process (a restarted worker) has loaded other modules than this one."""
    seeds = range(5)
    code = (
        "from tests.history.test_operations import steps\n"
        f"print(repr([steps(seed) for seed in {list(seeds)!r}]))\n"
    )
    fresh = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    here = [steps(seed) for seed in seeds]
    assert fresh.stdout.strip() == repr(here)
    assert any(args.get("expect") == "InvalidName" for plan in here for _, args, _, _ in plan)
    assert any(args.get("expect") == "InvalidArgument" for plan in here for _, args, _, _ in plan)


def test_each_history_adds_odd_valid_paths() -> None:
    for seed in range(5):
        found = paths(seed)
        assert found[: len(PATHS)] == PATHS and len(set(found)) == len(PATHS) + 2
        assert all(check_path(path) == path for path in found)
