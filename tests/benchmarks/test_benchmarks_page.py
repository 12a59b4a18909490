"""The benchmarks page's machinery: every `BENCH` line a module prints is declared (and every
declaration printed), `make bench`'s runner records the lines a run prints and keeps the
rest, and the page renders a results file as per-back-end tables with misses marked."""

from __future__ import annotations

import json
import multiprocessing
import shutil
from pathlib import Path

from tests.benchmarks import declarations, page, results
from tests.benchmarks.__main__ import _split_names, run_module
from tests.benchmarks.__main__ import main as run_benchmarks
from tests.benchmarks.declarations import Benchmark, Suite

FIXTURE = Path(__file__).parent / "fixtures" / "results.json"


def test_every_benchmark_printed_is_declared_and_every_declared_one_printed() -> None:
    found = declarations.problems()
    assert not found, "\n".join(found)


def test_printed_names_are_read_from_plain_and_formatted_strings() -> None:
    source = """
print(f"BENCH gc-clean ratio={1:.2f} x=1")
print(f"BENCH kv-{driver}-{op} ratio={r}")
print(f"BENCH gc-prepare{'-rowid' if rowid else ''} ratio={r}")
print("BENCH plain ratio=1")
print(f"not BENCH {x}")
"""
    printed = declarations.printed_names(source)
    assert sorted(printed) == sorted(
        [("gc-clean",), ("kv-", "-", ""), ("gc-prepare", ""), ("plain",)]
    )
    assert declarations.matches(("kv-", "-", ""), "kv-sqlite-set_if")
    assert not declarations.matches(("kv-", "-", ""), "kvx-sqlite-get")
    assert declarations.matches(("gc-prepare", ""), "gc-prepare")
    assert declarations.matches(("gc-prepare", ""), "gc-prepare-rowid")
    assert not declarations.matches(("gc-clean",), "gc-clean-mark")


def test_a_bench_line_parses_with_json_and_separated_figures() -> None:
    line = (
        "BENCH gc-clean ratio=1.63 clean_s=2.9 entries_per_s=1,234,567 built_ratio=n/a "
        'phases={"prepare": 0.09, "mark": 1.82} table=rowid s_at_0.25=15.3\n'
    )
    assert results.parse(line) == (
        "gc-clean",
        1.63,
        {
            "clean_s": 2.9,
            "entries_per_s": 1234567.0,
            "built_ratio": "n/a",
            "phases": {"prepare": 0.09, "mark": 1.82},
            "table": "rowid",
            "s_at_0.25": 15.3,
        },
    )
    assert results.parse("== bench_gc\n") is None
    assert results.parse("BENCH broken ratio=n/a\n") is None


SUITES = {
    "bench_a": Suite(
        section="Alpha",
        about="Shared data of alpha.",
        benchmarks=(
            Benchmark("fast", measures="the candidate", reference="the floor", target=1),
            Benchmark(
                "merged",
                measures="merges",
                reference="naive merges",
                target=0.7,
                limits={"built_ratio": 0.5},
            ),
        ),
    ),
    "bench_b": Suite(
        section="Beta",
        benchmarks=(Benchmark("plain", measures="a | b", reference="c"),),
    ),
}


def test_the_page_renders_one_column_per_back_end_and_marks_misses() -> None:
    text = page.render(results.load(FIXTURE), SUITES)
    lines = text.splitlines()
    assert "## Alpha" in lines and "## Beta" in lines and "Shared data of alpha." in lines
    assert "| benchmark | what is measured | reference | target | embedded | stack |" in lines
    assert "| `fast` | the candidate | the floor | ≤ 1 | 0.5 | **1.5 ✗** (ratio > 1) |" in lines
    assert (
        "| `merged` | merges | naive merges | ≤ 0.7, built_ratio ≤ 0.5 "
        "| **0.6 ✗** (built_ratio > 0.5) | — |"
    ) in lines
    assert "| `plain` | a \\| b | c |  | 1,234,567 | — |" in lines
    assert page.number(19888.9) == "19,889" and page.number(0.00051) == "0.00051"
    assert "| `fast` | embedded | ours_s 1.25 · floor_s 2.5 · phases (mark 0.75) |" in lines
    assert "| `fast` | stack | ours_s 3 · floor_s 2 |" in lines
    assert "| stack | `bench_a` | 2026-11-27 09:30 UTC | 8 | 64 | 0.25 | `--quick` |" in lines
    assert "| embedded | `bench_b` | 2026-11 | 2 | 24 | — | — |" in lines
    assert text.index("## Alpha") < text.index("## Beta") < text.index("## Runs")


def test_a_run_of_one_module_updates_only_its_rows(tmp_path: Path) -> None:
    """`make bench BENCH_ARGS=kv` on SQLite at a smoke size: its rows replaced, dated and
    with their options; another module's row and another back end's kept as they were."""
    path = tmp_path / "results.json"
    shutil.copy(FIXTURE, path)
    kept = json.loads(FIXTURE.read_text())["results"]
    older = {**kept[3], "name": "kv-sqlite-get", "module": "bench_kv", "date": "2026-11"}
    other = {**older, "name": "kv-postgres-get"}
    on_stack = {**older, "backend": "stack"}
    gc = {**kept[0], "name": "gc-clean", "module": "bench_gc"}
    path.write_text(json.dumps({"results": [older, other, on_stack, gc]}))
    options = ["--drivers", "sqlite", "--sqlite-ops", "200", "--scan-keys", "200"]
    status = run_benchmarks(["kv", *options, "--repeats", "1", "--results", str(path)])
    assert status == 0
    rows = {r.key: r for r in results.load(path)}
    ops = ("get", "set", "set_if", "scan")
    assert {name for backend, name in rows if backend == "embedded"} == {
        *(f"kv-sqlite-{op}" for op in ops),
        "kv-postgres-get",
        "gc-clean",
    }
    for op in ops:
        row = rows["embedded", f"kv-sqlite-{op}"]
        assert row.date.endswith("UTC") and row.module == "bench_kv" and row.ratio > 0
        assert {"ours_us", "raw_us"} <= set(row.figures)
        assert row.options[:2] == ["--drivers", "sqlite"]
        assert row.machine.cores >= 1 and row.machine.load is not None
    assert rows["embedded", "kv-postgres-get"].date == "2026-11"
    assert rows["embedded", "gc-clean"].figures == gc["figures"]
    assert rows["stack", "kv-sqlite-get"].date == "2026-11"


def test_a_line_is_recorded_under_the_back_end_it_names_and_one_naming_none_is_not() -> None:
    """A module that ignores `--backend` measures its own back end: the runner takes the
    line's word for it, and records nothing it cannot attribute."""
    recorded: list[results.Result] = []
    status = run_module("fixtures.lines", [], "stack", recorded.append)
    assert status == 0
    assert [(r.name, r.backend) for r in recorded] == [("labeled", "embedded")]


def test_a_name_is_a_module_only_before_the_first_option() -> None:
    """`--operations gc` passes `gc` to the module as the option's value; it does not also
    select `bench_gc`."""
    names = {"gc", "gc_s3", "kv"}
    assert _split_names(["gc", "bench_kv", "--operations", "gc"], names) == (
        {"gc", "kv"},
        ["--operations", "gc"],
    )
    assert _split_names(["--operations", "gc"], names) == (set(), ["--operations", "gc"])
    assert _split_names(["gc_s3"], names) == ({"gc_s3"}, [])


UPDATES = 40


def update_rows(path: str, writer: str) -> None:
    """One writer's rows, one update each, as a runner records its module's lines."""
    row = results.load(FIXTURE)[0]
    names = {f"{w}-{i}" for w in ("a", "b") for i in range(UPDATES)}
    for i in range(UPDATES):
        new = results.Result(**{**row.__dict__, "name": f"{writer}-{i}"})
        results.update([new], names, Path(path))


def test_runs_recording_at_once_keep_each_others_rows(tmp_path: Path) -> None:
    path = tmp_path / "results.json"
    spawn = multiprocessing.get_context("spawn")
    writers = [spawn.Process(target=update_rows, args=(str(path), w)) for w in ("a", "b")]
    for writer in writers:
        writer.start()
    for writer in writers:
        writer.join(timeout=120)
        assert writer.exitcode == 0, writer.exitcode
    names = {r.name for r in results.load(path)}
    assert names == {f"{w}-{i}" for w in ("a", "b") for i in range(UPDATES)}
