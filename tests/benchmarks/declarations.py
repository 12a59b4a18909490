"""What each benchmark measures, declared once next to its code, and the check that every
`BENCH` line a module prints has a declaration (and every declaration a line).

Each `bench_*.py` module holds `BENCHMARKS = Suite(...)`: the benchmarks page
(`docs/benchmarks.md`, rendered by `tests/benchmarks/page.py`) takes its text from there and
its figures from the results file `make bench` writes (`tests/benchmarks/results.py`).
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

from tests.helpers.source import parse

HERE = Path(__file__).resolve().parent
PACKAGE = "tests.benchmarks"
PREFIX = "BENCH "


@dataclass(frozen=True)
class Benchmark:
    """One `BENCH <name>` line: what its candidate is, what its reference is, and the
    targets it should meet (`target` bounds `ratio`; `limits` bound other figures of the
    line by name). Lower is better for every bound."""

    name: str
    measures: str
    reference: str
    target: float | None = None
    limits: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))

    def misses(self, ratio: float, figures: Mapping[str, object]) -> list[str]:
        """The bounds these figures exceed, as `name > bound`; a figure not printed (or not
        a number) misses nothing."""
        bounds = {"ratio": self.target, **self.limits}
        values = {**figures, "ratio": ratio}
        missed = []
        for name, bound in bounds.items():
            value = values.get(name)
            if bound is not None and isinstance(value, int | float) and value > bound:
                missed.append(f"{name} > {bound:g}")
        return missed

    def target_text(self) -> str:
        parts = [f"≤ {self.target:g}"] if self.target is not None else []
        parts += [f"{name} ≤ {bound:g}" for name, bound in self.limits.items()]
        return ", ".join(parts)


@dataclass(frozen=True)
class Suite:
    """A module's benchmarks, in the order the page lists them, under `section`; `about`
    says what data they share (sizes, repetitions), in words that stay true."""

    section: str
    benchmarks: tuple[Benchmark, ...]
    about: str = ""


def modules() -> list[str]:
    """The benchmark modules' names (`bench_*`), sorted."""
    return sorted(m.name for m in pkgutil.iter_modules([str(HERE)]) if m.name.startswith("bench_"))


def suite(module: str) -> Suite | None:
    found = getattr(importlib.import_module(f"{PACKAGE}.{module}"), "BENCHMARKS", None)
    return found if isinstance(found, Suite) else None


def suites() -> dict[str, Suite]:
    """Every module's declared suite, by module name (modules that declare none left out)."""
    declared = {module: suite(module) for module in modules()}
    return {module: found for module, found in declared.items() if found is not None}


def printed_names(source: str) -> list[tuple[str, ...]]:
    """The benchmark names a module's source prints: every string (or f-string) starting
    `BENCH `, up to its first space, as its literal pieces around the formatted parts."""
    tree = parse(source)
    inner = {id(v) for n in ast.walk(tree) if isinstance(n, ast.JoinedStr) for v in n.values}
    names = []
    for node in ast.walk(tree):
        parts: list[str | None] = []
        if id(node) in inner:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            parts = [node.value]
        elif isinstance(node, ast.JoinedStr):
            parts = [
                v.value if isinstance(v, ast.Constant) and isinstance(v.value, str) else None
                for v in node.values
            ]
        if not parts or not isinstance(parts[0], str) or not parts[0].startswith(PREFIX):
            continue
        parts[0] = parts[0].removeprefix(PREFIX)
        pieces = [""]
        for part in parts:
            if part is None:
                pieces.append("")
                continue
            pieces[-1] += part.split(" ", 1)[0]
            if " " in part:
                break
        names.append(tuple(pieces))
    return names


def shown(pieces: tuple[str, ...]) -> str:
    return "<…>".join(pieces)


def matches(pieces: tuple[str, ...], name: str) -> bool:
    return re.fullmatch(".*".join(map(re.escape, pieces)), name) is not None


def problems() -> list[str]:
    """What is missing between the modules' `BENCH` lines and their declarations, each as an
    instruction naming the file and what to add or remove."""
    found = []
    owner: dict[str, str] = {}
    for module in modules():
        path = f"tests/benchmarks/{module}.py"
        printed = printed_names((HERE / f"{module}.py").read_text())
        declared = suite(module)
        if declared is None:
            if printed:
                found.append(
                    f"{path} prints BENCH lines but declares none: add "
                    f"`BENCHMARKS = Suite(section=..., benchmarks=(Benchmark(name=..., "
                    f"measures=..., reference=..., target=...), ...))` for "
                    f"{', '.join(map(shown, printed))} "
                    f"(from tests.benchmarks.declarations import Benchmark, Suite)"
                )
            continue
        names = [b.name for b in declared.benchmarks]
        for pieces in printed:
            if not any(matches(pieces, name) for name in names):
                found.append(
                    f"{path} prints BENCH {shown(pieces)} but declares no benchmark of that "
                    f'name: add Benchmark(name="{shown(pieces)}", measures=..., reference=..., '
                    f"target=...) to its BENCHMARKS, one per name it prints"
                )
        for name in names:
            if not any(matches(pieces, name) for pieces in printed):
                found.append(
                    f"{path} declares {name} but prints no BENCH {name} line: remove its "
                    f"Benchmark from BENCHMARKS, or print it"
                )
            if name in owner:
                found.append(f"{name} is declared by both {owner[name]} and {path}: keep one")
            owner[name] = path
    return found
