"""Named points inside multi-step operations, where tests force the worst interleaving.

A test arms a point with a callable (`armed`), or a process is started with
`BRANCHWATER_FAILPOINTS=copy.after_record=sleep(500),commit.after_seal=kill`: `kill` is
SIGKILL of the process itself, `raise` raises `FailpointHit`, `sleep(MS)` widens a race.
Unarmed, a point costs one lookup in an empty dict. Every point is declared in `POINTS`, so
a typo in a test or in the variable fails instead of arming nothing. With
`BRANCHWATER_FAILPOINT_LOG=<dir>` set when a point is armed, each firing appends its name to
a file of that directory first (the test suite's check that every point is hit by some test).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from branchwater.engine.errors import InvalidArgument
from branchwater.engine.per_process import ChildSafeLock

ENV = "BRANCHWATER_FAILPOINTS"
LOG_ENV = "BRANCHWATER_FAILPOINT_LOG"

POINTS = frozenset(
    {
        "branch.before_delete",
        "branch.before_insert",
        "commit.after_ranges",
        "commit.after_seal",
        "commit.after_set",
        "commit.awaiting",
        "commit.before_set",
        "compaction.after_ranges",
        "compaction.before_install",
        "copy.after_read",
        "copy.after_record",
        "copy.before_stage",
        "gc.fence.after_claim",
        "gc.mark.before_gate",
        "gc.prune.before_mark",
        "gc.retention.before_recheck",
        "gc.retention.before_sweep",
        "gc.sweep.after_delete",
        "gc.sweep.before_delete",
        "import.after_batch",
        "import.after_record",
        "link.before_stage",
        "merge.after_ranges",
        "merge.after_seal",
        "merge.before_set",
        "prepare.branch_scan",
        "protect.before_fence",
        "publish.before_set",
        "repository.after_claim",
        "repository.before_claim",
        "repository.before_drop",
        "repository.before_insert",
        "repository.before_mark",
        "repository.before_release",
        "repository.before_remove",
        "restore.before_stage",
        "source.after_check",
        "transaction.before_commit",
        "transaction.before_merge",
        "write.awaiting_commit",
        "write.before_create",
        "write.before_stage",
        "write.before_validate",
    }
)
"""Every named point, by operation: `<operation>.<where>`."""

_armed: dict[str, Callable[[], None]] = {}


class FailpointHit(Exception):
    """Raised by a point armed with `raise`: not a BranchwaterError, so nothing handles it."""


def hit(name: str) -> None:
    action = _armed.get(name)
    if action is not None:
        action()


_layers: dict[str, list[Callable[[], None]]] = {}
"""Per point, the actions armed on it, the latest last (the one `hit` runs): blocks of two
threads may arm one point and end in any order, each taking off only its own."""
_arming = ChildSafeLock()


@contextmanager
def armed(name: str, action: Callable[[], None]) -> Iterator[None]:
    """Run `action` whenever this process reaches `name`, inside the block."""
    _check(name)
    layer = _logged(name, action)
    with _arming:
        layers = _layers.setdefault(name, [_armed[name]] if name in _armed else [])
        layers.append(layer)
        _armed[name] = layer
    try:
        yield
    finally:
        with _arming:
            layers = _layers[name]
            layers.remove(layer)
            if layers:
                _armed[name] = layers[-1]
            else:
                _armed.pop(name, None)
                del _layers[name]


def arm_from_env(value: str | None = None) -> None:
    """Arm the points `BRANCHWATER_FAILPOINTS` names (done once, when the module loads)."""
    spec = os.environ.get(ENV, "") if value is None else value
    for item in filter(None, (part.strip() for part in spec.split(","))):
        name, _, action = item.partition("=")
        _check(name)
        _armed[name] = _logged(name, _action(name, action))


def _logged(name: str, action: Callable[[], None]) -> Callable[[], None]:
    """`action`, first appending `name` to this process's file in `LOG_ENV`'s directory."""
    directory = os.environ.get(LOG_ENV)
    if not directory:
        return action
    path = os.path.join(directory, f"{os.getpid()}.log")

    def logged() -> None:
        with open(path, "a", encoding="utf-8") as log:
            log.write(name + "\n")
        action()

    return logged


def hit_names(directory: str) -> set[str]:
    """The names of the points that fired in any process logging to `directory`."""
    names: set[str] = set()
    for entry in os.scandir(directory):
        if entry.name.endswith(".log"):
            with open(entry.path, encoding="utf-8") as log:
                names.update(filter(None, log.read().split()))
    return names


def _check(name: str) -> None:
    if name not in POINTS:
        raise InvalidArgument(f"unknown failpoint {name!r}; known: {', '.join(sorted(POINTS))}")


def _action(name: str, spec: str) -> Callable[[], None]:
    if spec == "kill":
        return lambda: os.kill(os.getpid(), signal.SIGKILL)
    if spec == "raise":

        def fail() -> None:
            raise FailpointHit(f"failpoint {name} fired")

        return fail
    if spec.startswith("sleep(") and spec.endswith(")") and spec[6:-1].isdigit():
        seconds = int(spec[6:-1]) / 1000
        return lambda: time.sleep(seconds)
    raise InvalidArgument(
        f"failpoint {name!r}: unknown action {spec!r}; use kill, raise or sleep(MS)"
    )


arm_from_env()
