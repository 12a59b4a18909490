"""`python -m tests.benchmarks [NAME ...]`: run every `bench_*.py` (or the named ones).

Each module exposes `main(argv: list[str]) -> None` and prints its own `BENCH` lines.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys

import tests.benchmarks as package


def main(argv: list[str]) -> None:
    wanted = {name.removeprefix("bench_") for name in argv if not name.startswith("-")}
    options = [arg for arg in argv if arg.startswith("-")]
    for module in sorted(m.name for m in pkgutil.iter_modules(package.__path__)):
        if not module.startswith("bench_") or (
            wanted and module.removeprefix("bench_") not in wanted
        ):
            continue
        print(f"== {module}", flush=True)
        importlib.import_module(f"tests.benchmarks.{module}").main(options)


if __name__ == "__main__":
    main(sys.argv[1:])
