"""`python -m tests.benchmarks [NAME ...] [--backend B] [--no-record] [OPTIONS]`: run every
`bench_*.py`, or the named ones, and record their `BENCH` lines in the results file.

Each module runs in a process of its own (`python -m tests.benchmarks.bench_x OPTIONS`),
takes the options it knows (sizes) and ignores the rest, and prints its own `BENCH` lines;
this runner passes its output through and writes each line as it is printed to
`docs/benchmarks/results.json` (see `results`), replacing that benchmark's row on that back
end (the line's `backend=<name>`, see `backends`: a line that names none is not recorded, as
its module may not have run on the back end asked for) and keeping every other row, so a run
stopped or failing part way keeps what it measured. After a module fails the runner goes on
to the next and exits non-zero at the end.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from tests.benchmarks import declarations, results

ROOT = Path(__file__).resolve().parents[2]


def run_module(
    module: str, options: list[str], backend: str, record: Callable[[results.Result], None]
) -> int:
    """Run one module, echoing its output and passing each result it prints to `record` as
    soon as it is printed; its exit status."""
    machine = results.Machine.this()
    env = {**os.environ, results.BACKEND_ENV: backend}
    command = [sys.executable, "-m", f"{declarations.PACKAGE}.{module}", *options]
    with subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True, bufsize=1
    ) as child:
        assert child.stdout is not None
        for line in child.stdout:
            print(line, end="", flush=True)
            parsed = results.parse(line)
            if parsed is not None:
                name, ratio, figures = parsed
                measured_on = figures.pop("backend", None)
                if measured_on is None:
                    print(f"not recorded: {name} does not name its back end", file=sys.stderr)
                    continue
                when = results.now()
                record(
                    results.Result(
                        name, str(measured_on), module, ratio, figures, when, machine, options
                    )
                )
    return child.returncode


def _split_names(args: list[str], names: set[str]) -> tuple[set[str], list[str]]:
    """The benchmark names that lead `args`, and the options after them: a name only counts
    before the first option, so an option's value that is also a module's name (`--operations
    gc`) stays the option's."""
    wanted: set[str] = set()
    for index, arg in enumerate(args):
        if arg.startswith("-") or arg.removeprefix("bench_") not in names:
            return wanted, args[index:]
        wanted.add(arg.removeprefix("bench_"))
    return wanted, []


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.benchmarks", add_help=False)
    parser.add_argument("--backend", default=results.backend(), choices=results.BACKENDS)
    parser.add_argument("--no-record", action="store_true")
    parser.add_argument("--results", type=Path, default=results.RESULTS)
    args, rest = parser.parse_known_args(argv)
    modules = declarations.modules()
    names = {module.removeprefix("bench_") for module in modules}
    wanted, options = _split_names(rest, names)
    declared = {b.name for s in declarations.suites().values() for b in s.benchmarks}

    def record(result: results.Result) -> None:
        if result.name not in declared:
            print(f"== not recorded, declared by no module: {result.name}", flush=True)
        elif not args.no_record:
            results.update([result], declared, args.results)

    failed = []
    for module in modules:
        if wanted and module.removeprefix("bench_") not in wanted:
            continue
        print(f"== {module}", flush=True)
        if run_module(module, options, args.backend, record):
            failed.append(module)
    for problem in declarations.problems():
        print(f"== {problem}", file=sys.stderr)
    if failed:
        print(f"== failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
