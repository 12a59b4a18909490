"""prepare_uncommitted_for_gc against an independent model of "uncommitted addresses".

Randomized histories of writes, deletes, overwrites, commits, compactions, resets, branch
creates and deletes, copies and links. The model is plain dictionaries that never read the
lake: per branch, HEAD's paths, the staged layer (a path's address, or `None` for a
tombstone), and the compacted state if any, plus the content each address holds. A branch's
uncommitted addresses are its staged ones plus the compacted ones HEAD lacks; shallow copies
add their source's address for good. Identity is content: a write, link or copy of what a
path already shows stages nothing, and a commit or compaction keeps HEAD's object of a path
whose content HEAD already holds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from branchwater.engine import Lake
from branchwater.engine.api import Repository
from tests.fixtures.s3 import S3Server
from tests.gc_model import BranchModel, BranchSteps, LakeModel
from tests.helpers.gc import run_rows
from tests.helpers.servers import unique_name

PATHS = [f"t/{name}" for name in "abcdefghij"]


@dataclass
class Model(LakeModel):
    copies: set[tuple[str, str]] = field(default_factory=set)

    def shows(self, branch: BranchModel, path: str, content: str) -> bool:
        address = branch.view().get(path)
        return address is not None and self.labels[address] == content

    def expected(self) -> set[tuple[str, str, bool]]:
        """(address, branch, is a copy record) of everything a run must hold."""
        found = {
            (address, name, False)
            for name, branch in self.branches.items()
            for address in branch.uncommitted()
        }
        return found | {(address, name, True) for address, name in self.copies}


class History(BranchSteps[Model]):
    """Applies random operations to the lake and the model alike."""

    def __init__(self, repo: Repository, seed: int) -> None:
        super().__init__(repo, seed, Model())

    def step(self) -> None:
        weighted: dict[Callable[[], object], int] = {
            self.write: 10,
            self.delete: 4,
            self.commit: 2,
            self.compact: 2,
            self.reset: 1,
            self.create: 1,
            self.drop: 1,
            self.copy: 4,
            self.link: 2,
        }
        operation = self.random.choices(list(weighted), weights=list(weighted.values()))[0]
        operation()

    def write(self) -> None:
        _, branch, model = self.branch()
        path = self.random.choice(PATHS)
        unchanged = self.model.shows(model, path, path)
        address = branch.upload(path, path.encode()).address
        if unchanged:
            assert address == model.view()[path]
            return
        self.model.labels[address] = path
        model.staged[path] = address

    def copy(self) -> None:
        name, branch, model = self.branch()
        view = model.view()
        if not view:
            return
        src = self.random.choice(sorted(view))
        dst = self.random.choice(PATHS)
        content = self.model.labels[view[src]]
        unchanged = self.model.shows(model, dst, content)
        copied = branch.copy(src, dst)
        if unchanged:
            assert copied.address == view[dst]
            return
        shallow = model.head.get(src) != view[src]
        assert (copied.address == view[src]) == shallow
        if shallow:
            self.model.copies.add((view[src], name))
        self.model.labels[copied.address] = content
        model.staged[dst] = copied.address

    def link(self) -> None:
        _, branch, model = self.branch()
        physical = branch.get_physical_address()
        objects = self.repo.lake.graveler.objects(self.repo.storage_namespace)
        objects.put(physical.address, b"linked")
        path = self.random.choice(PATHS)
        unchanged = self.model.shows(model, path, "linked")
        linked = branch.link_physical_address(path, physical.token, size=6, checksum="c")
        if unchanged:
            assert linked.address == model.view()[path]
            return
        self.model.labels[physical.address] = "linked"
        model.staged[path] = physical.address


def check(repo: Repository, model: Model) -> None:
    run = repo.prepare_uncommitted_for_gc()
    found = {(address, branch, kind == "copy") for address, branch, kind in run_rows(repo, run)}
    assert found == model.expected()


def play(repo: Repository, seed: int, steps: int, every: int) -> None:
    history = History(repo, seed)
    for i in range(1, steps + 1):
        history.step()
        if i % every == 0:
            check(repo, history.model)
    check(repo, history.model)


@pytest.fixture
def local_repo(tmp_path: Path) -> Iterator[Repository]:
    with Lake.connect(f"sqlite:///{tmp_path}/lake.db") as lake:
        yield lake.create_repository("model", storage_namespace=f"file://{tmp_path}/ns")


@pytest.fixture
def s3_repo(tmp_path: Path, s3_server: S3Server, s3_bucket: str) -> Iterator[Repository]:
    with Lake.connect(f"sqlite:///{tmp_path}/lake.db", s3_options=s3_server.options) as lake:
        namespace = f"s3://{s3_bucket}/{unique_name('ns-')}"
        yield lake.create_repository("model", storage_namespace=namespace)


@pytest.mark.parametrize("seed", [*range(6), 1030])
def test_prepare_matches_the_model_on_the_local_store(local_repo: Repository, seed: int) -> None:
    """Seed 1030 compacts a branch, deletes and writes the same bytes again, then commits."""
    play(local_repo, seed, steps=120, every=15)


@pytest.mark.s3
@pytest.mark.parametrize("seed", range(2))
def test_prepare_matches_the_model_on_s3(s3_repo: Repository, seed: int) -> None:
    play(s3_repo, 100 + seed, steps=60, every=20)
