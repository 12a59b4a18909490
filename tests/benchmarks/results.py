"""The results file: the latest `BENCH` line of every benchmark on every back end, with when
and on what machine it was measured. `make bench` writes it (`tests/benchmarks/__main__.py`),
the benchmarks page renders it (`tests/benchmarks/page.py`); history lives in git.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.benchmarks.declarations import PREFIX

RESULTS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks" / "results.json"
DEFAULT_BACKEND = "embedded"
BACKEND_ENV = "BENCH_BACKEND"
"""The variable a benchmark module reads its back end from (`backend()`); the runner sets
it from `--backend`."""
BACKENDS = {
    DEFAULT_BACKEND: "SQLite and local files (`make bench`)",
    "stack": "PostgreSQL and SeaweedFS's S3 server, as `make stack` runs them, Spark local "
    "(`make bench BACKEND=stack`)",
}
"""The back ends a benchmark runs on (`tests/benchmarks/backends.py`), as the page names
them."""
FIGURE = re.compile(r"(?:^|\s)([A-Za-z_][\w.]*)=")
NUMBER = re.compile(r"-?\d{1,3}(,\d{3})+(\.\d+)?")


@dataclass(frozen=True)
class Machine:
    """Where a result was measured: cores, memory, and the 1-minute load average when its
    module started (`None` when not recorded), since other work on the machine slows it."""

    cores: int
    memory_gib: float
    load: float | None = None

    @classmethod
    def this(cls) -> Machine:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
        return cls(os.cpu_count() or 1, round(memory, 1), round(os.getloadavg()[0], 2))


@dataclass(frozen=True)
class Result:
    """One benchmark's latest line on one back end. `options` are the arguments its module
    ran with (sizes other than the defaults show there)."""

    name: str
    backend: str
    module: str
    ratio: float
    figures: dict[str, Any]
    date: str
    machine: Machine
    options: list[str] = field(default_factory=list)

    @property
    def key(self) -> tuple[str, str]:
        return self.backend, self.name


def backend() -> str:
    """The back end this benchmark process measures."""
    return os.environ.get(BACKEND_ENV) or DEFAULT_BACKEND


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")


def parse(line: str) -> tuple[str, float, dict[str, Any]] | None:
    """A `BENCH <name> ratio=<r> <key>=<value>…` line's name, ratio and other figures (a
    value is JSON when it parses as such, a number with thousands separators a number, else
    text); `None` for any other line or one without a numeric ratio."""
    if not line.startswith(PREFIX):
        return None
    name, _, rest = line[len(PREFIX) :].strip().partition(" ")
    keys = list(FIGURE.finditer(rest))
    figures: dict[str, Any] = {}
    for key, following in zip(keys, [*keys[1:], None], strict=True):
        end = following.start() if following else len(rest)
        figures[key.group(1)] = value(rest[key.end() : end].strip())
    ratio = figures.pop("ratio", None)
    if not name or not isinstance(ratio, int | float) or isinstance(ratio, bool):
        return None
    return name, float(ratio), figures


def value(text: str) -> Any:
    if NUMBER.fullmatch(text):
        return float(text.replace(",", ""))
    try:
        return json.loads(text)
    except ValueError:
        return text


def load(path: Path = RESULTS) -> list[Result]:
    if not path.exists():
        return []
    rows = json.loads(path.read_text())["results"]
    return [Result(**{**row, "machine": Machine(**row["machine"])}) for row in rows]


def save(results: Iterable[Result], path: Path = RESULTS) -> None:
    """Write `results` one per line, sorted by back end and name, so that a run's diff shows
    only what changed; written to a temporary file and renamed, so a stopped run leaves the
    old one."""
    rows = [json.dumps(asdict(r), ensure_ascii=False) for r in sorted(results, key=lambda r: r.key)]
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(".tmp")
    temporary.write_text('{"results": [\n' + ",\n".join(rows) + "\n]}\n")
    temporary.replace(path)


def merged(old: Iterable[Result], new: Iterable[Result], declared: set[str]) -> list[Result]:
    """`old` with every row `new` measures replaced, and the rows of benchmarks no module
    declares any more dropped; the rest keep their own dates."""
    rows = {r.key: r for r in old}
    rows.update((r.key, r) for r in new)
    return [r for r in rows.values() if r.name in declared]


def update(new: Iterable[Result], declared: set[str], path: Path = RESULTS) -> None:
    """`merged` into the file at `path`, holding an exclusive lock on its folder from the
    read to the rename, so that runs of different modules at once each keep their rows."""
    path.parent.mkdir(parents=True, exist_ok=True)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(folder, fcntl.LOCK_EX)
        save(merged(load(path), new, declared), path)
    finally:
        os.close(folder)
