"""The GC model's branch, shared by the prepare model test (tests/gc) and the Spark job's
model test (tests/spark_jobs): plain dictionaries that never read the lake.

A branch is HEAD's paths, the staged layer (a path's address, or `None` for a tombstone) and
the compacted state if any. Its uncommitted addresses are the staged ones plus the compacted
ones HEAD lacks. Identity is content: a commit or compaction keeps the stored object of a
path whose content did not change (`settle`).
"""

from __future__ import annotations

from dataclasses import dataclass, field


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
