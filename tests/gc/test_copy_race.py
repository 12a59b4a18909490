"""The seed's race between a prepare run and a rename (copy + delete), in separate processes.

The preparer has read the first rows of the branch when it pauses; another process copies
the last path to a path the scan has passed and deletes the source; the scan goes on. The
object is then held only by the copy record, which the run reads last: it must be there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from branchwater.engine import Lake
from branchwater.engine.gc import prepare
from branchwater.engine.gc.prepare import read_run
from tests.helpers.failpoints import PAUSE_TIMEOUT
from tests.helpers.servers import forked_pool, unique_name


def _prepare_paused(kv_url: str, repo_name: str, scanning, go) -> list[tuple[str, str, str]]:
    prepare.ROW_GROUP_ROWS = 2
    original = prepare._BranchScanner._add
    paused: list[bool] = []

    def add(self, batch):
        original(self, batch)
        if "main" in batch.column("branch").to_pylist() and not paused:
            paused.append(True)
            scanning.set()
            assert go.wait(PAUSE_TIMEOUT)

    prepare._BranchScanner._add = add
    with Lake.connect(kv_url) as lake:
        repo = lake.repository(repo_name)
        run = repo.prepare_uncommitted_for_gc()
        table = read_run(lake.graveler.objects(repo.storage_namespace), run.run_id)
        columns = [table.column(c).to_pylist() for c in ("address", "branch", "source")]
        return list(zip(*columns, strict=True))


def _rename(kv_url: str, repo_name: str, scanning, go) -> None:
    with Lake.connect(kv_url) as lake:
        main = lake.repository(repo_name).branch("main")
        assert scanning.wait(PAUSE_TIMEOUT)
        main.copy("z/source", "a/0-renamed")
        main.delete("z/source")
        go.set()


def race(kv_url: str, namespace: str) -> None:
    name = unique_name("race-")
    with Lake.connect(kv_url) as lake:
        repo = lake.create_repository(name, storage_namespace=namespace)
        main = repo.branch("main")
        for i in range(6):
            main.upload(f"a/{i}", b"a")
        source = main.upload("z/source", b"precious").address
    with forked_pool(2) as (manager, pool):
        scanning, go = manager.Event(), manager.Event()
        preparer = pool.apply_async(_prepare_paused, (kv_url, name, scanning, go))
        renamer = pool.apply_async(_rename, (kv_url, name, scanning, go))
        renamer.get(PAUSE_TIMEOUT * 2)
        found = preparer.get(PAUSE_TIMEOUT * 2)
    held = {(branch, kind) for address, branch, kind in found if address == source}
    assert held == {("main", "copy")}
    with Lake.connect(kv_url) as lake:
        main = lake.repository(name).branch("main")
        assert main.read("a/0-renamed") == b"precious"


@pytest.mark.slow
def test_a_rename_during_prepare_keeps_the_object(race_kv: str, tmp_path: Path) -> None:
    race(race_kv, f"file://{tmp_path}/ns")
