"""Opening a lake gives Arrow a pool that keeps freed pages, unless the process chose one.

Each case runs in a fresh interpreter: the default pool is process-wide, and this one's is
whatever the tests before it left.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = """
import sys
import pyarrow as pa
from branchwater.engine import Lake
before = pa.default_memory_pool().backend_name
Lake.connect(f"sqlite:///{sys.argv[1]}", range_cache_dir=sys.argv[2]).close()
print(before, pa.default_memory_pool().backend_name)
"""


def pools(tmp_path: Path, chosen: str | None) -> tuple[str, str]:
    """The default pool's backend before and after opening a lake in a new process."""
    env = {k: v for k, v in os.environ.items() if k != "ARROW_DEFAULT_MEMORY_POOL"}
    if chosen is not None:
        env["ARROW_DEFAULT_MEMORY_POOL"] = chosen
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path / "lake.db"), str(tmp_path / "cache")],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return out[0], out[1]


def test_a_lake_moves_arrow_off_mimalloc(tmp_path: Path) -> None:
    before, after = pools(tmp_path, None)
    assert before == "mimalloc"
    assert after == "jemalloc"


@pytest.mark.parametrize("chosen", ["mimalloc", "system"])
def test_a_pool_chosen_in_the_environment_is_kept(tmp_path: Path, chosen: str) -> None:
    assert pools(tmp_path, chosen) == (chosen, chosen)
