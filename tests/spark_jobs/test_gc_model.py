"""A clean run followed by optimized runs, against an independent model of what is garbage.

Randomized histories of writes, overwrites, deletes, commits, merges, resets, branch creates
and deletes, compactions, copies, links, abandoned uploads and copy records expiring (on the
test lake's clock, so a copied address can be committed and uncommitted at one run and only
committed at the next). The model never reads what GC
reads: it records every object written, the tree of every commit, each branch's HEAD, staged
layer and compacted tree, and the sources of shallow copies. An object is referenced when a
commit's tree, a branch's uncommitted layers or a copy record holds its address. After each
run, exactly the unreferenced objects modified at or before the run's cutoff are gone.

Each round writes, waits past the minimum age, and writes again, so a run always finds
young objects (committed or not) that only a later run may consider: the optimized runs'
carried and pending sets are exercised, not just their new ranges and slices.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from branchwater.engine import Conflict, GCSettings, NoChanges
from branchwater.engine.gc.runs import files, statuses
from branchwater.engine.gc.runs.config import DRIVER_ROWS
from branchwater.spark_jobs.gc import committed
from tests.gc_model import BranchSteps, Chosen, LakeModel
from tests.helpers.gc import FakeClock, GCLake, use_clock

pytestmark = [pytest.mark.spark, pytest.mark.slow]

PATHS = [f"t/{name}" for name in "abcdefgh"]
MIN_AGE = timedelta(seconds=1)
S3_MIN_AGE = timedelta(seconds=3)
"""S3 stamps objects to the second: a wider margin keeps the last writes young."""


@dataclass
class Model(LakeModel):
    committed: set[str] = field(default_factory=set)
    copied: set[str] = field(default_factory=set)
    written: set[str] = field(default_factory=set)

    def referenced(self) -> set[str]:
        uncommitted = {a for b in self.branches.values() for a in b.uncommitted()}
        return self.committed | uncommitted | self.copied


class History(BranchSteps[Model]):
    """Applies random operations to the lake and to the model alike."""

    def __init__(self, gc: GCLake, seed: int) -> None:
        super().__init__(gc.repo, seed, Model())
        self.gc = gc
        self.clock = FakeClock(datetime.now(UTC))
        self.settings = GCSettings()
        use_clock(gc.lake, self.clock, self.settings)
        self.contents = 0

    def steps(self, count: int) -> None:
        weighted: dict[Callable[[], object], int] = {
            self.write: 10,
            self.delete: 4,
            self.commit: 3,
            self.merge: 2,
            self.compact: 2,
            self.reset: 1,
            self.create: 1,
            self.drop: 1,
            self.copy: 3,
            self.link: 2,
            self.abandon: 1,
            self.expire: 1,
        }
        for _ in range(count):
            self.random.choices(list(weighted), weights=list(weighted.values()))[0]()

    def content(self) -> bytes:
        self.contents += 1
        return f"content {self.contents}".encode()

    def write(self, chosen: Chosen | None = None) -> None:
        _, branch, model = chosen or self.branch()
        path = self.random.choice(PATHS)
        data = self.content()
        address = branch.upload(path, data).address
        model.staged[path] = address
        self.model.written.add(address)
        self.model.labels[address] = data.decode()

    def commit(self, chosen: Chosen | None = None) -> dict[str, str]:
        head = super().commit(chosen)
        self.model.committed |= set(head.values())
        return head

    def merge(self) -> None:
        """Into a clean branch only (merge refuses a dirty one). The merged tree is read back
        from the lake: a merge only recombines trees already committed, which the test
        checks, so it adds nothing to what the model counts as committed."""
        source, _, _ = self.branch()
        destination, _, model = self.branch()
        if source == destination or not model.clean():
            return
        try:
            self.repo.merge(source, into=destination, strategy="source-wins")
        except (NoChanges, Conflict):
            return
        merged = {e.path: e.address for e in self.repo.ref(destination).list()}
        assert set(merged.values()) <= self.model.committed
        model.head = merged

    def copy(self) -> None:
        _, branch, model = self.branch()
        view = model.view()
        if not view:
            return
        src = self.random.choice(sorted(view))
        dst = self.random.choice(PATHS)
        label = self.model.labels[view[src]]
        unchanged = dst in view and self.model.labels[view[dst]] == label
        copied = branch.copy(src, dst)
        if unchanged:
            assert copied.address == view[dst]
            return
        self.model.labels[copied.address] = label
        if model.head.get(src) != view[src]:
            assert copied.address == view[src]
            self.model.copied.add(view[src])
        else:
            self.model.written.add(copied.address)
        model.staged[dst] = copied.address

    def link(self) -> None:
        """Once `expire` moved the lake's clock days ahead, a token is issued after the
        object's stamp (the file system's clock): the link stages a fresh copy, and the
        object written at the token's address stays, unreferenced."""
        _, branch, model = self.branch()
        physical = branch.get_physical_address()
        data = self.content()
        self.gc.objects.put(physical.address, data)
        path = self.random.choice(PATHS)
        checksum = hashlib.sha256(data).hexdigest()
        entry = branch.link_physical_address(
            path, physical.token, size=len(data), checksum=checksum
        )
        model.staged[path] = entry.address
        for address in {physical.address, entry.address}:
            self.model.written.add(address)
            self.model.labels[address] = data.decode()

    def abandon(self) -> None:
        """An upload whose link never comes: garbage once older than the minimum age."""
        _, branch, _ = self.branch()
        physical = branch.get_physical_address()
        self.gc.objects.put(physical.address, self.content())
        self.model.written.add(physical.address)

    def expire(self) -> None:
        """Let every copy record expire and be swept: their addresses are no longer held."""
        self.clock.advance(self.settings.copy_record_ttl + timedelta(minutes=1))
        self.gc.lake.gc.copies.sweep(self.repo.record)
        self.model.copied.clear()


def check_run(
    gc: GCLake, history: History, mode: str, min_age: timedelta, **settings: Any
) -> files.RunSummary:
    before = gc.data_objects()
    assert set(before) == history.model.written
    referenced = history.model.referenced()

    summary = gc.run(mode=mode, min_age=min_age, **settings)

    cutoff = datetime.fromisoformat(summary.cutoff)
    garbage = {k for k, info in before.items() if k not in referenced and info.mtime <= cutoff}
    assert summary.status == statuses.SWEPT and summary.mode == mode
    assert set(gc.data_objects()) == set(before) - garbage
    assert summary.volume("deleted").objects == len(garbage)
    history.model.written -= garbage
    return summary


def play(
    gc: GCLake, seed: int, rounds: int, steps: int, min_age: timedelta = MIN_AGE, **settings: Any
) -> list[files.RunSummary]:
    """Each round: steps, a wait past the minimum age, more steps ending with a write and a
    commit on one branch (so every run sees a young committed object), then a run; the
    runs' summaries."""
    history = History(gc, seed)
    summaries = []
    for number in range(rounds):
        history.steps(steps)
        time.sleep(min_age.total_seconds() * 1.5)
        history.steps(steps // 2)
        chosen = history.branch()
        history.write(chosen)
        history.commit(chosen)
        mode = "clean" if number == 0 else "optimized"
        summaries.append(check_run(gc, history, mode, min_age, **settings))
    assert any(s.volume("carry").objects for s in summaries[:-1])
    assert any(s.volume("pending").objects for s in summaries[:-1])
    return summaries


@pytest.mark.parametrize("marked_on", ["driver", "executors"])
def test_clean_then_optimized_runs_match_the_model_on_the_local_store(
    local_gc: GCLake, monkeypatch: pytest.MonkeyPatch, marked_on: str
) -> None:
    """Optimized runs mark on the driver (their inputs are small) or, told to, on the
    executors, where ranges are read two to a task: the versions of a key range meet in
    different tasks (a large repository's do), and the mark sees their addresses from
    several."""
    settings = {}
    if marked_on == "executors":
        monkeypatch.setattr(committed, "FILES_PER_TASK", 2)
        settings["driver_rows"] = 0
    summaries = play(local_gc, 0, rounds=5, steps=60, **settings)
    assert {s.slices["marked_on"] for s in summaries[1:]} == {marked_on}


@pytest.mark.s3
@pytest.mark.parametrize("marked_on", ["driver", "executors"])
def test_clean_then_optimized_runs_match_the_model_on_s3(s3_gc: GCLake, marked_on: str) -> None:
    driver_rows = {"driver": DRIVER_ROWS, "executors": 0}[marked_on]
    summaries = play(s3_gc, 100, rounds=3, steps=30, min_age=S3_MIN_AGE, driver_rows=driver_rows)
    assert {s.slices["marked_on"] for s in summaries[1:]} == {marked_on}
