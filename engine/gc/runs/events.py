"""What the job tells whoever launched it, one JSON line per event on stdout.

Events: `phase` (a phase starts or ends, with its seconds), `progress` (entries prepared so
far), `notice` (e.g. an optimized run falling back to a clean one), `summary` (the run's
summary, last) and `error` (a typed failure: its class name and message). No Spark here: the
CLI reads these lines.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

from branchwater.engine.errors import BranchwaterError

EVENT_PREFIX = "BRANCHWATER-GC "

Events = Callable[[dict[str, Any]], None]
"""Whoever hears a run's events: `emit` in a `spark-submit` process, a callback in-process."""


def emit(event: dict[str, Any]) -> None:
    sys.stdout.write(EVENT_PREFIX + json.dumps(event, default=str) + "\n")
    sys.stdout.flush()


def parse(line: str) -> dict[str, Any] | None:
    """The event on a line of the job's output, or None for any other line."""
    if not line.startswith(EVENT_PREFIX):
        return None
    event: dict[str, Any] = json.loads(line[len(EVENT_PREFIX) :])
    return event


def error_class(name: str) -> type[BranchwaterError]:
    """The engine's error class of that name (`BranchwaterError` if there is none)."""
    pending: list[type[BranchwaterError]] = [BranchwaterError]
    while pending:
        cls = pending.pop()
        if cls.__name__ == name:
            return cls
        pending += cls.__subclasses__()
    return BranchwaterError
