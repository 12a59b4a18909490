"""The retention fence: a move that makes an old commit (or its entries) reachable again
claims the commit first, and refuses, writing nothing, when a GC run is collecting that
commit or collected it.

A GC run with retention rules writes an *expiring* record for every commit it is about to
treat as expired (`engine/gc/retention/expired.py`), before its re-check reads the refs, the
commit records and the staging again; its sweep turns each into an *expired* record, which
never lapses, before it deletes any object. A move's *claim* lives under the same key, one
per commit, so a move pays one KV get and one `set_if`; a read (`repo.ref`) only gets it.

The moves: branch creation from a commit, reset to one, a fast-forward or a publish onto one,
a tag on one, a restore from one (before its entries are staged), and a revert (of one, and
of its parent, whose tree a revert brings back), cherry-pick or merge of one (before the new
commit record is written). Each calls `claim` before its first write: it reads the key,
refuses with `CommitExpired` on a live expiring record or an expired one, and otherwise
replaces what it read (nothing, a claim, a lapsed record) by a claim stamped with the
mover's wall clock, by compare-and-swap. The run writes its record by compare-and-swap too
(`write_expiring_unless_claimed`), and not where a claim younger than the operation margin
(`OPERATION_MARGIN`, 5 minutes) is: that commit is not fenced this run, and the run's
re-check counts it as active, keeping what its tree holds; a later run decides.

Why no object a ref then references is deleted. Let C be the move's claim and W its first
write (within the margin of C: the assumption every GC argument here makes, clock skew
included), R the run's record and Q its re-check (R before Q). C and R are swaps of one key,
so one comes first.
- R before C: the claim reads R (or loses its swap to it and reads it on the retry) and
  refuses; nothing was written. A record that lapsed (its run died) can be replaced by a
  claim: the sweep re-arms its records only while each is still its own and live, and
  deletes nothing otherwise; once all are re-armed it records them expired before its
  first delete, so no claim lands on them however long it deletes or however late a killed
  sweep is resumed.
- C before R, the claim fresh when R reads it: no record, and the re-check counts the
  commit as active, so no object its tree holds is a candidate. Independently, the sweep
  re-arms every commit whose tree holds an object it deletes before deleting, and finding
  one unfenced deletes nothing.
- C before R, the claim older than the margin: W landed before R, so before Q. The re-check
  sees W (a ref on the commit makes it active; a new commit record or a staged entry holds
  its addresses) and drops them from the candidates; R may replace the claim.
So a move that writes once needs no check after W: a move killed anywhere leaves at most a
claim, or a W the re-check or the sweep's refusal covers, and nothing to take back. A
refused merge, revert or cherry-pick has written nothing, no commit record either. A move
that writes many times (a restore stages path after path) may outlast the margin, so it
claims again before each write once half the margin has passed (`claim_again`): each of
its writes is then within the margin of its latest claim, and the argument holds write by
write. Refused between two writes, it keeps what it wrote before (covered as above), as a
restore killed there would.

Claims do not accumulate per move: a commit has one key, which each claim overwrites. A
run replaces a stale claim on a commit it expires by its record; a claim on a commit that
stays active stays, one small value beside the commit's record, until a run expires it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from branchwater.engine import failpoints
from branchwater.engine.errors import CommitExpired, NotFound, PredicateFailed, too_many_tries
from branchwater.engine.graveler.graveler import Graveler
from branchwater.engine.graveler.model import RepositoryRecord
from branchwater.engine.kv import Store
from branchwater.engine.kv.store import Predicate

FENCE_PREFIX = b"gc/expired/"
OPERATION_MARGIN = timedelta(minutes=5)
"""The longest an operation may take between its checks and its write, clock skew between
processes included: what GC's safety argument assumes of clients that keep working."""


@dataclass(frozen=True)
class FenceRecord:
    """A commit's retention state: `expired` (when its sweep began deleting its objects),
    for good, else expiring, fenced by run `run` until `until`."""

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
        """The record `value` holds; `NotFound` when it is a move's claim, as in
        `read_fence`."""
        raw = json.loads(value)
        if "claimed" in raw:
            raise NotFound("the fence key holds a move's claim, no GC retention record")
        if "expired" in raw:
            return cls(raw["run"], expired=raw["expired"])
        return cls(raw["expiring"], until=datetime.fromisoformat(raw["until"]))

    def fences(self, now: datetime) -> bool:
        """Whether a move onto the commit must refuse at `now`."""
        return self.expired is not None or (self.until is not None and now < self.until)

    def refusal(self, commit_id: str) -> CommitExpired:
        if self.expired is not None:
            return CommitExpired(commit_id, self.expired)
        return CommitExpired(commit_id, "", collecting=self.run)


@dataclass(frozen=True)
class Claim:
    """A move's claim on the commit, written before its write at `at`: the time of the
    clock that dates commits (`refs.clock`, the wall clock but in tests that spread a
    history over months, whose moves are then as old as its commits)."""

    at: datetime

    def encode(self) -> bytes:
        return json.dumps({"claimed": self.at.isoformat()}).encode()

    def fresh(self, now: datetime, margin: timedelta) -> bool:
        """Whether the claiming move may still be about to write (the margin not yet past)."""
        return now - self.at < margin


def fence_key(commit_id: str) -> bytes:
    return FENCE_PREFIX + commit_id.encode()


def _decode(value: bytes) -> FenceRecord | Claim:
    raw = json.loads(value)
    if "claimed" in raw:
        return Claim(datetime.fromisoformat(raw["claimed"]))
    return FenceRecord.decode(value)


def _read(
    kv: Store, repo: RepositoryRecord, commit_id: str
) -> tuple[FenceRecord | Claim | None, Predicate]:
    """What the commit's key holds and the predicate to replace it (None: absent)."""
    try:
        value, predicate = kv.get(repo.partition, fence_key(commit_id))
    except NotFound:
        return None, None
    return _decode(value), predicate


def read_fence(kv: Store, repo: RepositoryRecord, commit_id: str) -> tuple[FenceRecord, bytes]:
    """The commit's GC record and its stored value (for `set_if`); `NotFound` when none (no
    key, or only a move's claim)."""
    state, predicate = _read(kv, repo, commit_id)
    if not isinstance(state, FenceRecord) or not isinstance(predicate, bytes):
        raise NotFound(f"commit {commit_id!r} has no GC retention record")
    return state, predicate


def check_unfenced(kv: Store, repo: RepositoryRecord, commit_id: str) -> str:
    """`commit_id`, or `CommitExpired` when retention collected it or a live GC run is
    collecting it (one KV get): the check of a read, which references nothing."""
    state, _ = _read(kv, repo, commit_id)
    if isinstance(state, FenceRecord) and state.fences(datetime.now(UTC)):
        raise state.refusal(commit_id)
    return commit_id


def claim(g: Graveler, repo: RepositoryRecord, *commit_ids: str) -> None:
    """Before a move writes anything referencing `commit_ids` (or their entries): claim each
    in its fence key, or `CommitExpired` when retention collected it or a live GC run is
    collecting it (one get and one `set_if` per commit; again only when another claim or
    a run's record landed in between)."""
    for commit_id in commit_ids:
        _claim(g, repo, commit_id)
    failpoints.hit("gc.fence.after_claim")


def claim_again(g: Graveler, repo: RepositoryRecord, commit_id: str) -> None:
    """Before each further write of a move that writes many times (a restore, a restore of
    refs): the proof takes every write within the margin of the move's latest claim, and
    such a move may outlast the margin. One get while the claim is younger than half the
    margin, a new claim once older, `CommitExpired` once a run fenced the commit."""
    state, _ = _read(g.kv, repo, commit_id)
    if not (isinstance(state, Claim) and state.fresh(datetime.now(UTC), OPERATION_MARGIN / 2)):
        _claim(g, repo, commit_id)


def _claim(g: Graveler, repo: RepositoryRecord, commit_id: str) -> None:
    for _ in g.retry:
        state, predicate = _read(g.kv, repo, commit_id)
        if isinstance(state, FenceRecord) and state.fences(datetime.now(UTC)):
            raise state.refusal(commit_id)
        value = Claim(g.refs.clock()).encode()
        try:
            g.kv.set_if(repo.partition, fence_key(commit_id), value, predicate)
            return
        except PredicateFailed:
            continue
    raise too_many_tries(f"claim of commit {commit_id[:12]} in {repo.name!r}", g.retry.attempts)


def write_expiring_unless_claimed(
    kv: Store,
    repo: RepositoryRecord,
    commit_ids: Iterable[str],
    record: FenceRecord,
    margin: timedelta,
) -> list[str]:
    """A run's expiring `record` for each of `commit_ids`, written only where no move's
    claim is younger than `margin` (a stale claim, or another run's record, is replaced;
    an expired record stays); returns the commits fenced, the expired ones included. A
    commit left out stays unfenced, so a sweep expiring it refuses (`StaleGCMark`)."""
    value = record.encode()
    fenced = []
    for commit_id in commit_ids:
        if _write_unless_claimed(kv, repo, commit_id, value, margin):
            fenced.append(commit_id)
    return fenced


def _write_unless_claimed(
    kv: Store, repo: RepositoryRecord, commit_id: str, value: bytes, margin: timedelta
) -> bool:
    """Whether the commit is fenced: its record written, or expired already. Terminates:
    a `set_if` lost only to a move's claim, which is then fresh."""
    while True:
        state, predicate = _read(kv, repo, commit_id)
        if isinstance(state, FenceRecord) and state.expired is not None:
            return True
        if isinstance(state, Claim) and state.fresh(datetime.now(UTC), margin):
            return False
        try:
            kv.set_if(repo.partition, fence_key(commit_id), value, predicate)
            return True
        except PredicateFailed:
            continue
