"""The benchmarks page's tables, rendered from the results file and the modules'
declarations (`scripts/mkdocs_hooks.py` puts them into `docs/benchmarks.md`): per section,
what each benchmark measures against what, its target and its latest ratio on each back end,
a ratio that misses its target marked; then each result's figures, and the runs they come
from. Figures only: what a benchmark measures is its declaration's text."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from tests.benchmarks.declarations import Benchmark, Suite
from tests.benchmarks.results import BACKENDS, DEFAULT_BACKEND, Result

MISSED = "✗"
NONE = "—"


def render(results: list[Result], suites: Mapping[str, Suite]) -> str:
    """The sections' tables, in the modules' order, then the runs' table."""
    latest = {r.key: r for r in results}
    backends = sorted({r.backend for r in results}, key=lambda b: (b != DEFAULT_BACKEND, b))
    sections: dict[str, list[Suite]] = {}
    for module in sorted(suites):
        sections.setdefault(suites[module].section, []).append(suites[module])
    out = [
        f"Each cell is the latest ratio (candidate / reference) on that back end; "
        f"{MISSED} marks one that misses its target. Back ends: "
        + "; ".join(f"`{b}`, {BACKENDS[b]}" for b in backends if b in BACKENDS)
        + ".\n"
    ]
    for section, members in sections.items():
        out.append(f"## {section}\n")
        out += [f"{s.about}\n" for s in members if s.about]
        benchmarks = [b for s in members for b in s.benchmarks]
        out.append(ratios_table(benchmarks, backends, latest))
        out.append(f"### {section}: figures\n")
        out.append(figures_table(benchmarks, backends, latest))
    out.append("## Runs\n")
    out.append(runs_table(results))
    return "\n".join(out)


def ratios_table(
    benchmarks: list[Benchmark], backends: list[str], latest: Mapping[tuple[str, str], Result]
) -> str:
    head = ["benchmark", "what is measured", "reference", "target", *backends]
    rows = [
        [
            f"`{b.name}`",
            cell(b.measures),
            cell(b.reference),
            b.target_text(),
            *(ratio_cell(b, latest.get((backend, b.name))) for backend in backends),
        ]
        for b in benchmarks
    ]
    return table(head, rows)


def ratio_cell(benchmark: Benchmark, result: Result | None) -> str:
    if result is None:
        return NONE
    shown = number(result.ratio)
    missed = benchmark.misses(result.ratio, result.figures)
    if missed:
        return f"**{shown} {MISSED}** ({', '.join(missed)})"
    return shown


def figures_table(
    benchmarks: list[Benchmark], backends: list[str], latest: Mapping[tuple[str, str], Result]
) -> str:
    rows = []
    for b in benchmarks:
        for backend in backends:
            result = latest.get((backend, b.name))
            if result is not None:
                shown = " · ".join(f"{k} {figure(v)}" for k, v in result.figures.items())
                rows.append([f"`{b.name}`", backend, cell(shown) or NONE])
    return table(["benchmark", "back end", "figures"], rows)


def runs_table(results: list[Result]) -> str:
    """One row per module run the page's figures come from: when, where, with what options."""
    runs = sorted(
        {(r.backend, r.module, r.date, r.machine, tuple(r.options)) for r in results},
        key=lambda run: (run[:3], run[4]),
    )
    rows = [
        [
            backend,
            f"`{module}`",
            date,
            str(machine.cores),
            number(machine.memory_gib),
            NONE if machine.load is None else number(machine.load),
            " ".join(f"`{o}`" for o in options) or NONE,
        ]
        for backend, module, date, machine, options in runs
    ]
    head = ["back end", "module", "measured", "cores", "memory (GiB)", "load at start", "options"]
    return table(head, rows)


def table(head: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def number(value: float) -> str:
    if (float(value).is_integer() and abs(value) >= 1) or abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def figure(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float | dict):
        return str(value)
    if isinstance(value, dict):
        return "(" + ", ".join(f"{k} {figure(v)}" for k, v in value.items()) + ")"
    return number(value)
