"""`python -m tests.benchmarks [NAME ...] [--backend B] [--no-record] [OPTIONS]`: run every
`bench_*.py`, or the named ones, and record their `BENCH` lines in the results file.

Each module runs in a process of its own (`python -m tests.benchmarks.bench_x OPTIONS`),
takes the options it knows (sizes) and ignores the rest, and prints its own `BENCH` lines;
this runner passes its output through and, after each module, writes the lines it printed
to `docs/benchmarks/results.json` (see `results`), replacing those benchmarks' rows on that
back end and keeping every other row. A module that fails keeps the lines it printed
before failing; the runner goes on to the next and exits non-zero at the end.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from tests.benchmarks import declarations, results

ROOT = Path(__file__).resolve().parents[2]


def run_module(module: str, options: list[str], backend: str) -> tuple[list[results.Result], int]:
    """Run one module, echoing its output, and return the results it printed and its exit
    status."""
    machine = results.Machine.this()
    env = {**os.environ, results.BACKEND_ENV: backend}
    command = [sys.executable, "-m", f"{declarations.PACKAGE}.{module}", *options]
    found = []
    with subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True, bufsize=1
    ) as child:
        assert child.stdout is not None
        for line in child.stdout:
            print(line, end="", flush=True)
            parsed = results.parse(line)
            if parsed is not None:
                name, ratio, figures = parsed
                found.append(
                    results.Result(
                        name, backend, module, ratio, figures, results.now(), machine, options
                    )
                )
    return found, child.returncode


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks", add_help=False)
    parser.add_argument("--backend", default=results.backend())
    parser.add_argument("--no-record", action="store_true")
    parser.add_argument("--results", type=Path, default=results.RESULTS)
    args, rest = parser.parse_known_args(argv)
    modules = declarations.modules()
    names = {module.removeprefix("bench_") for module in modules}
    wanted = {arg.removeprefix("bench_") for arg in rest if arg.removeprefix("bench_") in names}
    options = [arg for arg in rest if arg.removeprefix("bench_") not in names]
    declared = {b.name for s in declarations.suites().values() for b in s.benchmarks}
    failed = []
    for module in modules:
        if wanted and module.removeprefix("bench_") not in wanted:
            continue
        print(f"== {module}", flush=True)
        found, status = run_module(module, options, args.backend)
        if status:
            failed.append(module)
        undeclared = sorted({r.name for r in found} - declared)
        if undeclared:
            print(f"== not recorded, declared by no module: {', '.join(undeclared)}", flush=True)
        if found and not args.no_record:
            results.save(results.merged(results.load(args.results), found, declared), args.results)
    for problem in declarations.problems():
        print(f"== {problem}", file=sys.stderr)
    if failed:
        print(f"== failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
