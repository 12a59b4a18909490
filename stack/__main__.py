"""`python -m branchwater.stack up|down|init|env`: what `make stack` and `make stack-down` run.

`up` starts the stack and prints where everything is; `down` stops it; `init` creates the
databases and bucket the Airflow environment names (the stack's first step, natively and in
compose); `env` prints fresh secrets as a compose `.env` file.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import asdict
from pathlib import Path

from branchwater.engine import BranchwaterError
from branchwater.stack import backends
from branchwater.stack.config import SECRET_VARIABLES, Secrets
from branchwater.stack.native import STATE_DIR, start, stop_state_dir


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m branchwater.stack", description=__doc__)
    parser.add_argument("command", choices=["up", "down", "init", "env"])
    parser.add_argument("--state-dir", type=Path, default=STATE_DIR)
    args = parser.parse_args(argv)
    try:
        return run(args.command, args.state_dir)
    except BranchwaterError as exc:
        print(f"branchwater stack: {exc}", file=sys.stderr)
        return 1


def run(command: str, state_dir: Path) -> int:
    if command == "up":
        handle = start(state_dir=state_dir, progress=lambda line: print(f"... {line}", flush=True))
        print(handle.summary())
        print("Stop it with `make stack-down`.")
    elif command == "down":
        stopped = stop_state_dir(state_dir)
        print("stack stopped" if stopped else f"no stack runs from {state_dir}")
    elif command == "init":
        for line in backends.init(os.environ):
            print(line)
    else:
        secrets = Secrets.generate(postgres_password=Secrets.generate().jwt_secret)
        for name, value in asdict(secrets).items():
            print(f"{SECRET_VARIABLES[name]}={value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
