"""Fixtures of the uncommitted-GC tests (helpers: `tests.helpers`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from branchwater.engine import Lake
from branchwater.engine.api import Repository
from branchwater.engine.graveler.committed import RangePolicy


@pytest.fixture
def lake() -> Iterator[Lake]:
    with Lake.connect(
        "memory://", range_policy=RangePolicy(target_entries=8, max_entries=32)
    ) as lake:
        yield lake


@pytest.fixture
def repo(lake: Lake, tmp_path: Path) -> Repository:
    return lake.create_repository("sales", storage_namespace=f"file://{tmp_path}/sales")
