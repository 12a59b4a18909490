"""`Lake.close()` is final, as a closed file's: later calls raise `LakeClosed` and open
nothing, and a call under way on another thread when the lake closes re-opens nothing
either (it re-opened a KV connection and the drop and range-store threads, which stayed
open until the next `close`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from branchwater.engine import Lake, LakeClosed, Repository
from branchwater.engine.background import Background
from branchwater.engine.kv.sql import SQLStore
from tests.helpers.failpoints import held_at

CLOSED = r"the lake was closed: open a new one"


def still_open(lake: Lake) -> list[str]:
    """What of the lake is open: the KV store's connections (live or idle) and the threads
    of its executors (staging drops, GC housekeeping, each namespace's range storing)."""
    graveler = lake.graveler
    kv = graveler.kv
    assert isinstance(kv, SQLStore)
    found = [f"KV connection {conn!r}" for conn in [*kv._connections, *kv._idle] if conn.usable]
    executors: dict[str, Background] = {
        "drop": graveler._background,
        "housekeeping": lake.gc.housekeeper._background,
    }
    for namespace, committed in graveler._committed.items():
        executors[f"range-store of {namespace}"] = committed.storage.storing
    found += [f"{name} threads" for name, work in executors.items() if work._executor is not None]
    return found


def opened(race_kv: str, tmp_path: Path) -> tuple[Lake, Repository]:
    """A lake with repository `sales`, an object staged on `main`, ranges stored before."""
    lake = Lake.connect(race_kv, range_cache_bytes=0)
    repo = lake.create_repository("sales", f"file://{tmp_path}/sales")
    main = repo.branch("main")
    main.upload("a", b"a")
    main.commit("first")
    main.upload("b", b"b")
    return lake, repo


@pytest.mark.parametrize("point", ["commit.after_seal", "commit.before_set"])
def test_a_commit_under_way_when_the_lake_closes_fails_typed_and_reopens_nothing(
    race_kv: str, tmp_path: Path, point: str
) -> None:
    lake, repo = opened(race_kv, tmp_path)
    with held_at(point, lambda: repo.branch("main").commit("held")) as held:
        lake.close()
        assert still_open(lake) == []
    assert isinstance(held.raised, LakeClosed), held.raised or held.result
    assert still_open(lake) == []
    lake.close()


CALLS: dict[str, Callable[[Lake, Repository], Any]] = {
    "repositories": lambda lake, _: lake.repositories(),
    "repository": lambda lake, _: lake.repository("sales"),
    "create_repository": lambda lake, _: lake.create_repository("other", "file:///tmp/o"),
    "branch": lambda _, repo: repo.branch("main"),
    "upload": lambda _, repo: repo.branch("main").upload("c", b"c"),
    "commit": lambda _, repo: repo.branch("main").commit("after close"),
    "read": lambda _, repo: repo.ref("main").read("a"),
    "log": lambda _, repo: list(repo.log("main")),
}


@pytest.mark.parametrize("call", CALLS.values(), ids=CALLS.keys())
def test_a_call_after_close_raises_lake_closed_and_opens_nothing(
    race_kv: str, tmp_path: Path, call: Callable[[Lake, Repository], Any]
) -> None:
    lake, repo = opened(race_kv, tmp_path)
    lake.close()
    with pytest.raises(LakeClosed, match=CLOSED):
        call(lake, repo)
    assert still_open(lake) == []


def test_closing_twice_is_harmless_and_a_with_block_closes(tmp_path: Path) -> None:
    with Lake.connect(f"sqlite:///{tmp_path}/lake.db") as lake:
        lake.create_repository("sales", f"file://{tmp_path}/sales")
    lake.close()
    assert still_open(lake) == []
    with pytest.raises(LakeClosed, match=CLOSED):
        lake.repositories()
    with Lake.connect(f"sqlite:///{tmp_path}/lake.db") as again:
        assert [r.name for r in again.repositories()] == ["sales"]
