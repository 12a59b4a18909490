"""`python -m tests.benchmarks [NAME ...] [OPTIONS]`: run every `bench_*.py`, or the named ones.

Each module exposes `main(argv: list[str]) -> None`, takes the options it knows (sizes) and
ignores the rest, and prints its own `BENCH` lines.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import tests.benchmarks as package


def main(argv: list[str]) -> None:
    modules = sorted(
        m.name for m in pkgutil.iter_modules(package.__path__) if m.name.startswith("bench_")
    )
    names = {module.removeprefix("bench_") for module in modules}
    wanted = {arg.removeprefix("bench_") for arg in argv if arg.removeprefix("bench_") in names}
    options = [arg for arg in argv if arg.removeprefix("bench_") not in names]
    for module in modules:
        if wanted and module.removeprefix("bench_") not in wanted:
            continue
        print(f"== {module}", flush=True)
        importlib.import_module(f"tests.benchmarks.{module}").main(options)


if __name__ == "__main__":
    main(sys.argv[1:])
