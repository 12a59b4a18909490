"""The retention fence: a move that makes an old commit (or its entries) reachable again
refuses, and takes its write back, when a GC run is collecting that commit or collected it.

A GC run with retention rules writes an *expiring* record for every commit it is about to
treat as expired (`engine/gc/retention/expired.py`), before its re-check reads the refs, the
commit records and the staging again; its sweep turns each into an *expired* record once
the objects are deleted. Both live under one key per commit, so a move pays one KV get.

The moves: branch creation from a commit, reset to one, a fast-forward or a publish onto one,
a tag on one (after the ref is written), a restore from one (after its entries are staged),
and a revert (of one, or of its child: a revert brings the parent's tree back), cherry-pick
or merge of one (after the new commit record is written, before the branch moves). Each
calls `check_unfenced` (or `check_moved`) after its own write and, when it raises, takes
that write back.

Why no object a ref then references is deleted. Let W be the move's write and K its check,
R the run's expiring record and Q its re-check, with W before K and R before Q in the KV's
order. If K does not see R, K read before R was written, so W < K < R < Q: the re-check sees
W (a ref on the commit makes it active; a new commit record or a staged entry holds its
addresses) and drops them from the candidates. If K sees R, the move refuses and removes W,
so nothing it wrote references the commit. A record stops fencing once its `until` passed:
the sweep re-arms it (compare-and-swap, only while it is still live and the run's own)
before deleting, and refuses to delete when it lapsed, so a lapse is only ever a dead run's.

What this does not cover (docs/gc.md, "Moves racing a run"; tests hold a move after a check,
or kill it, at `gc.fence.after_read`). A move killed between W and K keeps W, and K
never runs. If the move's first check came before R and W came after Q, a ref or staged entry
then names a commit the sweep collects. Closing that needs a claim, written by the move
before W, that R cannot overwrite. A merge, revert or cherry-pick that K refuses keeps its
new commit record, dangling: no ref reaches it, and expiry treats it as any other dangling
commit.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from dataclasses import dataclass
from datetime import UTC, datetime

from branchwater.engine import failpoints
from branchwater.engine.errors import CommitExpired, NotFound, PredicateFailed
from branchwater.engine.graveler.graveler import Graveler
from branchwater.engine.graveler.model import BranchRecord, RepositoryRecord
from branchwater.engine.kv import Store

FENCE_PREFIX = b"gc/expired/"


@dataclass(frozen=True)
class FenceRecord:
    """A commit's retention state: `expired` (when its objects were deleted) once swept,
    else expiring, fenced by run `run` until `until`."""

    run: str
    expired: str | None = None
    until: datetime | None = None

    def encode(self) -> bytes:
        if self.expired is not None:
            return json.dumps({"expired": self.expired, "run": self.run}).encode()
        assert self.until is not None
        return json.dumps({"expiring": self.run, "until": self.until.isoformat()}).encode()

    @classmethod
    def decode(cls, value: bytes) -> FenceRecord:
        raw = json.loads(value)
        if "expired" in raw:
            return cls(raw["run"], expired=raw["expired"])
        return cls(raw["expiring"], until=datetime.fromisoformat(raw["until"]))

    def fences(self, now: datetime) -> bool:
        """Whether a move onto the commit must refuse at `now`."""
        return self.expired is not None or (self.until is not None and now < self.until)


def fence_key(commit_id: str) -> bytes:
    return FENCE_PREFIX + commit_id.encode()


def read_fence(kv: Store, repo: RepositoryRecord, commit_id: str) -> tuple[FenceRecord, bytes]:
    """The commit's record and its stored value (for `set_if`); `NotFound` when none."""
    value, predicate = kv.get(repo.partition, fence_key(commit_id))
    return FenceRecord.decode(value), predicate


def check_unfenced(kv: Store, repo: RepositoryRecord, commit_id: str) -> str:
    """`commit_id`, or `CommitExpired` when retention collected it or a live GC run is
    collecting it (one KV get)."""
    try:
        record, _ = read_fence(kv, repo, commit_id)
    except NotFound:
        record = None
    failpoints.hit("gc.fence.after_read")
    if record is None:
        return commit_id
    if record.expired is not None:
        raise CommitExpired(commit_id, record.expired)
    if record.fences(datetime.now(UTC)):
        raise CommitExpired(commit_id, "", collecting=record.run)
    return commit_id


def check_moved(g: Graveler, repo: RepositoryRecord, moved: BranchRecord, left: str) -> None:
    """After a branch was moved onto another commit (a reset to it, a fast-forward): when
    that commit is fenced, point the branch back at `left` (unless it moved on since)."""
    try:
        check_unfenced(g.kv, repo, moved.commit_id)
    except CommitExpired:
        back = dataclasses.replace(moved, commit_id=left)
        with contextlib.suppress(PredicateFailed):
            g.refs.set_branch_if(repo, back, moved.encode())
        g.branch_cache.forget(repo, moved.name)
        raise
