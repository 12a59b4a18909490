"""Contended merges across processes on real databases: nothing merged or committed is lost."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

import pytest

from branchwater.engine import DirtyBranch, Lake, NoChanges
from tests.helpers.servers import forked_pool

FEATURES = 8
FILES_EACH = 5
COMMITTER_ROUNDS = 6


DIRTY_PATIENCE_S = 120.0
"""How long a merge waits out a destination the committer keeps dirty: the committer's
rounds, not the merge, set that time, and a loaded machine stretches them."""


def _merge_feature(kv_url: str, index: int, barrier) -> int:
    """Merge one feature branch; a dirty destination (a committer mid-write) is retried."""
    with Lake.connect(kv_url) as lake:
        repo = lake.repository("merges")
        barrier.wait(60)
        deadline = time.monotonic() + DIRTY_PATIENCE_S
        while time.monotonic() < deadline:
            try:
                return repo.merge(f"f{index}", into="main").attempts
            except DirtyBranch:
                time.sleep(0.01)
    raise AssertionError("destination stayed dirty")


def _commit_to_main(kv_url: str, barrier) -> list[str]:
    committed = []
    with Lake.connect(kv_url) as lake:
        main = lake.repository("merges").branch("main")
        barrier.wait(60)
        for i in range(COMMITTER_ROUNDS):
            main.upload(f"main/{i}", b"m")
            with contextlib.suppress(NoChanges):
                main.commit(f"main {i}")
            committed.append(f"main/{i}")
    return committed


def prepare(kv_url: str, namespace: str) -> None:
    with Lake.connect(kv_url) as lake:
        repo = lake.create_repository("merges", storage_namespace=namespace)
        main = repo.branch("main")
        main.upload("base", b"b")
        main.commit("base")
        for i in range(FEATURES):
            feature = repo.create_branch(f"f{i}", source="main")
            for j in range(FILES_EACH):
                feature.upload(f"f{i}/{j}", f"{i}-{j}".encode())
            feature.commit(f"feature {i}")


def contend(kv_url: str, namespace: str, with_committer: bool) -> None:
    prepare(kv_url, namespace)
    with forked_pool(FEATURES + with_committer) as (manager, pool):
        barrier = manager.Barrier(FEATURES + with_committer)
        committer = pool.apply_async(_commit_to_main, (kv_url, barrier)) if with_committer else None
        merges = [pool.apply_async(_merge_feature, (kv_url, i, barrier)) for i in range(FEATURES)]
        attempts = [m.get(300) for m in merges]
        committed = committer.get(300) if committer else []
    assert all(a >= 1 for a in attempts)
    with Lake.connect(kv_url) as lake:
        repo = lake.repository("merges")
        paths = {e.path for e in repo.ref("main").list()}
        expected = {f"f{i}/{j}" for i in range(FEATURES) for j in range(FILES_EACH)}
        assert expected <= paths
        assert set(committed) <= paths
        for i in range(FEATURES):
            tip = repo.ref(f"f{i}").commit_id
            assert repo.merge_base(f"f{i}", "main").id == tip, f"f{i} is not in main's history"


@pytest.mark.slow
@pytest.mark.parametrize("with_committer", [False, True], ids=["merges", "merges-and-a-commit"])
def test_concurrent_merges_lose_no_merge_and_no_commit(
    race_kv: str, tmp_path: Path, with_committer: bool
) -> None:
    contend(race_kv, f"file://{tmp_path}/ns", with_committer=with_committer)
