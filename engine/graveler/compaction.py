"""Staging compaction (seed: staging compaction): a sensor that says when, a compactor that does.

Staged tombstones and sealed tokens make every read of a branch pay: a listing reads and
throws away each tombstone, a lookup probes each sealed token. Compaction folds the staging
area into a metarange (`compacted_metarange_id`) that reads go to instead of HEAD's, so
those costs go away without a commit.

**Sensor** (`compaction_status`): counts staged entries and tombstones by scanning the staging
tokens up to a scan budget, so its cost is bounded whatever the size of the staging area,
and writers keep no shared counter (no contended key on the write path).

**Compactor** (`compact`), with the same steps as a commit and no commit record:

1. `set_if` the branch: seal its staging token and set `compaction_start_time`. With
   `if_needed`, the start time is also the guard: a second sensor that finds it within the
   guard window skips. A skewed clock can only cost a wasted compaction: correctness rests
   on the `set_if`s, never on time.
2. Apply the sealed tokens (newest wins) on the compacted metarange, else HEAD's: the path
   `commit.apply_sealed` shares with commits.
3. `set_if` the branch to the new compacted metarange without those tokens, only if they
   are still sealed on the same base. Otherwise a commit (or another compaction) took them:
   the compaction is superseded, nothing lost and nothing half-applied, and the ranges it
   wrote are unreferenced data. Tokens sealed on top since step 1 stay sealed above the new
   metarange when other compactions sealed them; when a commit did, the compaction gives
   way to it (`_sealed_above`). The applied tokens' rows are dropped in the
   background, as commits do: listed for deletion before this `set_if`, guarded by the
   branch, so a compactor killed right after it leaves them for the next drop to find.

A compactor killed between any two steps leaves a branch whose layers are all still in place
(an extra sealed token at worst), so reads stay complete and the next compaction or commit
absorbs what it left.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Literal

from branchwater.engine import failpoints
from branchwater.engine.errors import InvalidArgument, too_many_tries
from branchwater.engine.graveler.commit import Applied, apply_sealed, sealing
from branchwater.engine.graveler.graveler import Graveler, check_seconds
from branchwater.engine.graveler.model import BranchRecord, RepositoryRecord
from branchwater.engine.graveler.staging import COMPACTION_MARK, opened_by_commit

Clock = Callable[[], datetime]
StepHook = Callable[[str], None]
"""Called with each step's name as the compactor completes it (tests stop a process there)."""

STEPS = ("sealed", "applied", "updated")
"""The compactor's steps, in order: after `updated` only the background drop is left."""

Outcome = Literal["compacted", "nothing-staged", "not-due", "guarded", "superseded"]

MAX_SCAN_BUDGET = 100_000_000
MAX_SEALED_TOKENS = 10_000
MAX_GUARD_SECONDS = 7 * 24 * 3600.0
_SCAN_BATCH = 1000


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class CompactionPolicy:
    """When compaction is due, and what the sensor may spend to find out.

    Due when the staged tombstones reach `max_tombstones` or the sealed tokens reach
    `max_sealed_tokens`. The sensor reads at most `scan_budget` staged rows, so a tombstone
    threshold above it could never be seen. `guard_seconds` is how long after one compaction
    started a compaction `if_needed` skips the branch.
    """

    max_tombstones: int = 20_000
    max_sealed_tokens: int = 8
    scan_budget: int = 100_000
    guard_seconds: float = 300.0

    def __post_init__(self) -> None:
        _check_int("max_tombstones", self.max_tombstones, 1, MAX_SCAN_BUDGET)
        _check_int("max_sealed_tokens", self.max_sealed_tokens, 1, MAX_SEALED_TOKENS)
        _check_int("scan_budget", self.scan_budget, 1, MAX_SCAN_BUDGET)
        check_seconds("guard_seconds", self.guard_seconds, MAX_GUARD_SECONDS)
        if self.max_tombstones > self.scan_budget:
            raise InvalidArgument(
                f"max_tombstones ({self.max_tombstones}) is above scan_budget "
                f"({self.scan_budget}): the sensor could never count that many"
            )


def _check_int(name: str, value: object, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise InvalidArgument(f"{name} must be an integer from {low} to {high}, not {value!r}")


@dataclass(frozen=True)
class CompactionStatus:
    """What drives the decision for one branch, and the verdict."""

    repository: str
    branch: str
    staged_entries: int
    staged_tombstones: int
    sealed_tokens: int
    scanned_rows: int
    complete: bool
    """The scan saw every staged row; otherwise the staged counts are lower bounds."""
    compacted: bool
    """The branch reads from a compacted metarange."""
    last_compaction_age: float | None
    """Seconds since the last compaction started, if one has since the last commit or reset."""
    listing_overhead: int
    """Staged rows a full listing reads without showing them (tombstones): what compaction
    takes off every listing."""
    lookup_layers: int
    """Layers a lookup of a path absent from staging probes: each sealed token, then the
    committed or compacted metarange."""
    guarded: bool
    """A compaction started within the guard window: a sensor leaves the branch alone."""
    reasons: tuple[str, ...]
    """The thresholds reached."""

    @property
    def due(self) -> bool:
        """Compaction is due now: a threshold is reached and no compaction is under way."""
        return bool(self.reasons) and not self.guarded


@dataclass(frozen=True)
class CompactionResult:
    """What a compaction did. Only `compacted` changed the branch; every other outcome left
    it as it was (`superseded`: a commit or another compaction took the sealed tokens)."""

    repository: str
    branch: str
    outcome: Outcome
    message: str
    metarange_id: str | None = None
    sealed_tokens: int = 0
    """Sealed tokens applied."""
    entries_applied: int = 0
    tombstones_removed: int = 0
    ranges_written: int = 0
    ranges_reused: int = 0
    seconds: float = 0.0

    @property
    def compacted(self) -> bool:
        return self.outcome == "compacted"


# --- sensor --------------------------------------------------------------------------------


def compaction_status(
    g: Graveler,
    repo: RepositoryRecord,
    branch_name: str,
    policy: CompactionPolicy | None = None,
    now: Clock = utc_now,
) -> CompactionStatus:
    branch, _ = g.refs.get_branch(repo, branch_name)
    return branch_status(g, repo, branch, policy or CompactionPolicy(), now())


def repository_status(
    g: Graveler,
    repo: RepositoryRecord,
    policy: CompactionPolicy | None = None,
    now: Clock = utc_now,
) -> list[CompactionStatus]:
    """Every branch's status, from one scan of the branch records."""
    chosen, at = policy or CompactionPolicy(), now()
    return [branch_status(g, repo, branch, chosen, at) for branch in g.refs.branches(repo)]


def branch_status(
    g: Graveler,
    repo: RepositoryRecord,
    branch: BranchRecord,
    policy: CompactionPolicy,
    now: datetime,
) -> CompactionStatus:
    """The sensor on a branch record already read: at most `scan_budget` staged rows."""
    entries = tombstones = 0
    for value in _staged_values(g, branch, policy.scan_budget):
        if value:
            entries += 1
        else:
            tombstones += 1
    scanned = entries + tombstones
    sealed = len(branch.sealed_tokens)
    age = _age(branch, now)
    reasons = []
    if tombstones >= policy.max_tombstones:
        reasons.append(f"{tombstones} staged tombstones >= {policy.max_tombstones}")
    if sealed >= policy.max_sealed_tokens:
        reasons.append(f"{sealed} sealed tokens >= {policy.max_sealed_tokens}")
    g.metrics.sealed_tokens.labels(repo.name, branch.name).set(sealed)
    return CompactionStatus(
        repository=repo.name,
        branch=branch.name,
        staged_entries=entries,
        staged_tombstones=tombstones,
        sealed_tokens=sealed,
        scanned_rows=scanned,
        complete=scanned < policy.scan_budget,
        compacted=branch.compacted_metarange_id is not None,
        last_compaction_age=age,
        listing_overhead=tombstones,
        lookup_layers=sealed + 1,
        guarded=age is not None and abs(age) < policy.guard_seconds,
        reasons=tuple(reasons),
    )


def _staged_values(g: Graveler, branch: BranchRecord, budget: int) -> Iterator[bytes]:
    """Raw staged values of every token of the branch, newest first, at most `budget`."""
    left = budget
    for token in (branch.staging_token, *branch.sealed_tokens):
        for _, value in g.kv.scan(token.encode(), b"", min(left, _SCAN_BATCH)):
            yield value
            left -= 1
            if not left:
                return


def _age(branch: BranchRecord, now: datetime) -> float | None:
    if branch.compaction_start_time is None:
        return None
    return (now - branch.compaction_start_time).total_seconds()


# --- compactor -----------------------------------------------------------------------------


def compact(
    g: Graveler,
    repo: RepositoryRecord,
    branch_name: str,
    *,
    if_needed: bool = False,
    policy: CompactionPolicy | None = None,
    now: Clock = utc_now,
    on_step: StepHook | None = None,
) -> CompactionResult:
    """Compact the branch's staging area; with `if_needed`, only when the sensor says it is
    due (thresholds reached, guard free). See the module docstring for the steps."""
    chosen = policy or CompactionPolicy()
    started = time.monotonic()
    sealed = _seal(g, repo, branch_name, chosen, if_needed, now)
    if isinstance(sealed, CompactionResult):
        return _counted(g, sealed)
    _reached(on_step, "sealed")
    head = g.refs.get_commit(repo, sealed.commit_id).metarange_id
    applied = apply_sealed(g, repo, sealed.base(head), head, sealed.sealed_tokens)
    failpoints.hit("compaction.after_ranges")
    _reached(on_step, "applied")
    above = _install(g, repo, sealed, applied)
    if above is None:
        return _counted(g, _superseded(repo, sealed, applied, time.monotonic() - started))
    _reached(on_step, "updated")
    seconds = time.monotonic() - started
    g.metrics.duration.labels(repo.name).observe(seconds)
    g.metrics.tombstones.labels(repo.name).inc(applied.tombstones)
    g.metrics.sealed_tokens.labels(repo.name, branch_name).set(len(above))
    return _counted(g, _done(repo, sealed, applied, seconds))


def _seal(
    g: Graveler,
    repo: RepositoryRecord,
    branch_name: str,
    policy: CompactionPolicy,
    if_needed: bool,
    now: Clock,
) -> BranchRecord | CompactionResult:
    """Step 1: the sealed branch record, or the result of a compaction that need not run."""
    for _ in g.retry:
        branch, predicate = g.refs.get_branch(repo, branch_name)
        at = now()
        if if_needed:
            status = branch_status(g, repo, branch, policy, at)
            if not status.reasons:
                return _skipped(repo, branch_name, "not-due", "no compaction threshold reached")
            if status.guarded:
                g.metrics.skipped.labels(repo.name).inc()
                return _skipped(repo, branch_name, "guarded", _guard_message(status, policy))
        if not branch.sealed_tokens and g.staging.is_empty(branch.staging_token):
            return _skipped(repo, branch_name, "nothing-staged", "nothing staged to compact")
        sealed = dataclasses.replace(
            sealing(repo, branch, mark=COMPACTION_MARK), compaction_start_time=at
        )
        if g.try_update_branch(repo, sealed, predicate):
            return sealed
    raise too_many_tries(f"compaction of branch {branch_name!r} of {repo.name!r}", g.retry.attempts)


def _install(
    g: Graveler, repo: RepositoryRecord, sealed: BranchRecord, applied: Applied
) -> tuple[str, ...] | None:
    """Step 3: point the branch at the compacted metarange, dropping the applied tokens;
    returns the tokens still sealed above it, or None if the compaction gave way."""
    for _ in g.retry:
        branch, predicate = g.refs.get_branch(repo, sealed.name)
        above = _sealed_above(branch, sealed)
        if above is None:
            return None
        updated = dataclasses.replace(
            branch,
            sealed_tokens=above,
            compacted_metarange_id=applied.metarange_id,
            compacted_from=_lineage(sealed),
        )
        failpoints.hit("compaction.before_install")
        if g.update_branch_dropping(repo, updated, predicate, sealed.sealed_tokens):
            return above
    raise too_many_tries(f"compaction of branch {sealed.name!r} of {repo.name!r}", g.retry.attempts)


def _lineage(sealed: BranchRecord) -> str | None:
    """The `compacted_from` of a compaction that sealed `sealed`: its base's, when it extends
    a compacted metarange, else the oldest token it absorbs."""
    if sealed.compacted_metarange_id:
        return sealed.compacted_from
    return sealed.sealed_tokens[-1]


def _sealed_above(branch: BranchRecord, sealed: BranchRecord) -> tuple[str, ...] | None:
    """The tokens sealed on top of the ones a compaction applied, which stay sealed above its
    metarange; None if the compaction must give way.

    It gives way when its base moved (a commit, a reset, another compaction installed) or its
    tokens are gone, and, as the compaction design asks, when a commit sealed on top: that
    commit is building on these tokens, and compaction is the one that can wait. It does not
    give way to seals no commit builds on: other compactions' (or compactors sealing in turn
    would supersede each other for as long as they run), and a failed commit's release.
    Each seal opens the token the next one seals, so the seals after ours opened the staging
    token and every token above ours but the lowest.
    """
    tokens, applied = branch.sealed_tokens, sealed.sealed_tokens
    cut = len(tokens) - len(applied)
    moved = (branch.commit_id, branch.compacted_metarange_id) != (
        sealed.commit_id,
        sealed.compacted_metarange_id,
    )
    if moved or cut < 0 or tokens[cut:] != applied:
        return None
    above = tokens[:cut]
    if above and any(map(opened_by_commit, (branch.staging_token, *above[:-1]))):
        return None
    return above


def _reached(on_step: StepHook | None, step: str) -> None:
    if on_step is not None:
        on_step(step)


def _guard_message(status: CompactionStatus, policy: CompactionPolicy) -> str:
    return (
        f"another compaction started {abs(status.last_compaction_age or 0.0):.0f} s ago, "
        f"within the {policy.guard_seconds:.0f} s guard window"
    )


def _skipped(repo: RepositoryRecord, branch: str, outcome: Outcome, why: str) -> CompactionResult:
    return CompactionResult(repo.name, branch, outcome, why)


def _superseded(
    repo: RepositoryRecord, sealed: BranchRecord, applied: Applied, seconds: float
) -> CompactionResult:
    return CompactionResult(
        repo.name,
        sealed.name,
        "superseded",
        "the sealed tokens changed meanwhile (a commit or another compaction took them): "
        "nothing was lost and the branch is unchanged",
        sealed_tokens=len(sealed.sealed_tokens),
        ranges_written=applied.ranges_written,
        seconds=seconds,
    )


def _done(
    repo: RepositoryRecord, sealed: BranchRecord, applied: Applied, seconds: float
) -> CompactionResult:
    return CompactionResult(
        repo.name,
        sealed.name,
        "compacted",
        f"compacted {len(sealed.sealed_tokens)} sealed token(s) into metarange "
        f"{applied.metarange_id[:12]}",
        metarange_id=applied.metarange_id,
        sealed_tokens=len(sealed.sealed_tokens),
        entries_applied=applied.entries,
        tombstones_removed=applied.tombstones,
        ranges_written=applied.ranges_written,
        ranges_reused=applied.ranges_reused,
        seconds=seconds,
    )


def _counted(g: Graveler, result: CompactionResult) -> CompactionResult:
    g.metrics.outcomes.labels(result.repository, result.outcome).inc()
    return result
