"""The GC model's branch and the random steps on branches, shared by the prepare model test
(tests/gc) and the Spark job's model test (tests/spark_jobs): plain dictionaries that never
read the lake, and a history that applies each step to the lake and to them alike.

A branch is HEAD's paths, the staged layer (a path's address, or `None` for a tombstone) and
the compacted state if any. Its uncommitted addresses are the staged ones plus the compacted
ones HEAD lacks. Identity is content: a commit or compaction keeps HEAD's object of a path
whose content HEAD already holds (`settle` on HEAD), whether the branch was compacted or not.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from branchwater.engine import NoChanges
from branchwater.engine.api import Branch, Repository
from tests.helpers import compact


@dataclass
class BranchModel:
    head: dict[str, str] = field(default_factory=dict)
    staged: dict[str, str | None] = field(default_factory=dict)
    compacted: dict[str, str] | None = None

    def base(self) -> dict[str, str]:
        return self.head if self.compacted is None else self.compacted

    def view(self) -> dict[str, str]:
        view = dict(self.base())
        for path, address in self.staged.items():
            if address is None:
                view.pop(path, None)
            else:
                view[path] = address
        return view

    def clean(self) -> bool:
        return not self.staged and self.compacted is None

    def uncommitted(self) -> set[str]:
        found = {a for a in self.staged.values() if a is not None}
        if self.compacted is not None:
            found |= {a for p, a in self.compacted.items() if self.head.get(p) != a}
        return found


def settle(base: dict[str, str], view: dict[str, str], content: dict[str, str]) -> dict[str, str]:
    """`view` applied on `base`: a path whose content (`content[address]`, a label) did not
    change keeps `base`'s object (a deep copy holds its source's content at another address)."""
    return {
        path: base[path] if path in base and content[base[path]] == content[address] else address
        for path, address in view.items()
    }


@dataclass
class LakeModel:
    """The branches, and the content (a label) each address holds."""

    branches: dict[str, BranchModel] = field(default_factory=lambda: {"main": BranchModel()})
    labels: dict[str, str] = field(default_factory=dict)


M = TypeVar("M", bound=LakeModel)
Chosen = tuple[str, Branch, BranchModel]


class BranchSteps(Generic[M]):
    """The steps both tests take alike: deletes, commits, compactions, resets, branch creates
    and deletes. Writes, copies and links stay with each test, which records them its way."""

    def __init__(self, repo: Repository, seed: int, model: M) -> None:
        self.repo = repo
        self.random = random.Random(seed)
        self.model = model
        self.created = 0

    def branch(self) -> Chosen:
        name = self.random.choice(sorted(self.model.branches))
        return name, self.repo.branch(name), self.model.branches[name]

    def delete(self) -> None:
        _, branch, model = self.branch()
        visible = sorted(model.view())
        if not visible:
            return
        path = self.random.choice(visible)
        branch.delete(path)
        if path in model.base():
            model.staged[path] = None
        else:
            del model.staged[path]

    def commit(self, chosen: Chosen | None = None) -> dict[str, str]:
        """Returns the new HEAD's tree: the view settled on HEAD, compacted or not."""
        _, branch, model = chosen or self.branch()
        head = settle(model.head, model.view(), self.model.labels)
        try:
            branch.commit("step")
        except NoChanges:
            assert head == model.head
        model.head, model.staged, model.compacted = head, {}, None
        return head

    def compact(self) -> None:
        name, _, model = self.branch()
        compact(self.repo, name)
        model.compacted = settle(model.head, model.view(), self.model.labels)
        model.staged = {}

    def reset(self) -> None:
        _, branch, model = self.branch()
        branch.reset()
        model.staged, model.compacted = {}, None

    def create(self) -> None:
        source, _, model = self.branch()
        self.created += 1
        name = f"b{self.created}"
        self.repo.create_branch(name, source=source)
        self.model.branches[name] = BranchModel(head=dict(model.head))

    def drop(self) -> None:
        name, _, _ = self.branch()
        if name != "main":
            self.repo.delete_branch(name)
            del self.model.branches[name]
