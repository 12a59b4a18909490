"""The metadata-KV design's guarantees under real concurrency: separate processes, real databases.

Writers upload unique paths while a committer commits in a loop. Afterwards every acknowledged
write must be in HEAD with exactly the acknowledged address (a final commit absorbs what was
still staged), and the history must be one first-parent chain with no commit lost.

Meanwhile one more process overwrites (and now and then deletes) a path with rising versions
and announces each once it is acknowledged, and a reader in another process reads the path:
read-after-write across processes means it never reads a version older than the one announced
before its read began (`helpers.SharedPathRace`).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from branchwater.engine import Lake, NoChanges
from tests.helpers.races import SharedPathRace, committer
from tests.helpers.servers import forked_pool

WRITERS = 3
MIN_WRITES_EACH = 40
MAX_WRITES_EACH = 3000
MIN_COMMITS = 3


def _writer(kv_url: str, index: int, start, commits) -> list[tuple[str, str]]:
    """Write at least MIN_WRITES_EACH paths, and go on until the committer has raced us."""
    acknowledged = []
    with Lake.connect(kv_url) as lake:
        main = lake.repository("race").branch("main")
        start.wait(30)
        j = 0
        while j < MIN_WRITES_EACH or (commits.value < MIN_COMMITS and j < MAX_WRITES_EACH):
            entry = main.upload(f"w{index}/{j:04d}", f"{index}-{j}".encode())
            acknowledged.append((entry.path, entry.address))
            j += 1
    return acknowledged


def race(kv_url: str, namespace: str) -> None:
    with Lake.connect(kv_url) as lake:
        lake.create_repository("race", storage_namespace=namespace)
    with forked_pool(WRITERS + 1 + SharedPathRace.PROCESSES) as (manager, pool):
        start, stop, commits = manager.Event(), manager.Event(), manager.Value("i", 0)
        committing = pool.apply_async(committer, (kv_url, "race", start, stop, commits))
        shared = SharedPathRace(manager, pool, kv_url, "race", start, stop)
        writers = [pool.apply_async(_writer, (kv_url, i, start, commits)) for i in range(WRITERS)]
        start.set()
        acknowledged = [pair for w in writers for pair in w.get(240)]
        shared.wait_for_writes(240)
        stop.set()
        committing.get(240)
        shared.check_reads(240)
        made = commits.value
    assert made >= MIN_COMMITS, "the committer never raced the writers"

    with Lake.connect(kv_url) as lake:
        repo = lake.repository("race")
        main = repo.branch("main")
        with contextlib.suppress(NoChanges):
            main.commit("final")
        head = {e.path: e.address for e in repo.ref("main").list()}
        SharedPathRace.check_committed(repo.ref("main"))
        assert len(acknowledged) >= WRITERS * MIN_WRITES_EACH
        missing = [(p, a) for p, a in acknowledged if head.get(p) != a]
        assert missing == []
        history = list(repo.log("main", first_parent=True))
        assert len(history) == len(list(repo.log("main")))
        assert history[-1].message == "Repository created"
        assert list(main.uncommitted()) == []


@pytest.mark.slow
def test_writers_and_committer_race(race_kv: str, tmp_path: Path) -> None:
    race(race_kv, f"file://{tmp_path}/ns")
