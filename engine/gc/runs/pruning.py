"""Pruning the data GC runs leave behind, so that GC does not itself grow the namespace.

Every run writes data sets of the lake's size: its candidates, what it deleted, the state the
next optimized run starts from, the prepare output it began with. Once newer runs exist only
the newest of them are of use: the newest base (`files.latest_base`) to the next optimized
run, the others to `gc explain` and to a person reading the report. So a run keeps the data of
the newest `keep` runs of its repository, of the newest base, and of the marks newer than that
base that a sweep may still come for (under a week old); of an older run it keeps its summary,
report and gate results (the run history stays whole), marks the summary `pruned_at` and
removes the rest. A pruned run is never swept and never a base (`files.check_sweepable`,
`files.latest_base`).

- **Order.** The data goes first, the summary is marked after: a prune killed in between
  leaves a summary naming files that are gone, which the next prune marks; a sweep of such a
  mark deletes a subset of what it proved garbage, or stops on a missing file.
- **Who runs at the same moment.** Pruning runs under the repository's GC run lease (the job
  and the sweep prune as they end; `bw gc prune-runs` takes the lease), so no other run of the
  repository marks or sweeps meanwhile. A prepare run (`bw gc prepare`, the provider's
  operator) takes no lease: a finished prepare output is pruned only when it is older than
  every kept run (a newer one may be the next run's input), an unfinished one only once
  `ABANDONED_AFTER` has passed since it started, as is a run folder without a summary.
- **Other repositories.** Runs whose summary names another repository (one that had this
  namespace before) are left alone, and so are their prepare outputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial

from branchwater.engine import failpoints
from branchwater.engine.errors import BranchwaterError
from branchwater.engine.gc.addresses import newest_first_time
from branchwater.engine.gc.prepare import MANIFEST, RETENTION_PREFIX
from branchwater.engine.gc.runs import files, statuses
from branchwater.engine.gc.runs.config import check_keep
from branchwater.engine.gc.runs.events import Events
from branchwater.engine.gc.runs.storage import Namespace

ABANDONED_AFTER = timedelta(days=7)
"""A run folder without a summary, or a prepare output without a manifest, this old is taken
for abandoned: far longer than any run or prepare takes."""
PRUNED_SETS = (files.CANDIDATES, files.DELETED, files.STATE, files.SCRATCH)
"""The folders of a run that pruning removes."""


@dataclass(frozen=True)
class Pruned:
    """What a prune removed, by run id, newest first."""

    runs: tuple[str, ...] = ()
    """Runs whose data sets were removed; their summaries stay, marked `pruned_at`."""
    abandoned: tuple[str, ...] = ()
    """Run folders without a summary, removed whole."""
    prepared: tuple[str, ...] = ()
    """Prepare outputs removed."""

    def text(self) -> str:
        parts = [
            f"{len(self.runs)} older runs' data",
            f"{len(self.abandoned)} abandoned run folders",
            f"{len(self.prepared)} prepare outputs",
        ]
        return "pruned " + ", ".join(parts)


def prune_runs(
    ns: Namespace,
    repository_id: str,
    keep: int,
    now: datetime,
    before_each: Callable[[], None] = lambda: None,
) -> Pruned:
    """Remove the data of this repository's runs older than the newest `keep` and the newest
    base; call under the repository's GC run lease. `before_each` runs before each removal (a
    lease check)."""
    check_keep(keep)
    run_ids = files.run_ids(ns)
    saved = list(zip(run_ids, ns.map_keys(run_ids, partial(files.saved_summary, ns)), strict=True))
    base = files.newest_base((s for _, s in saved if s is not None), repository_id)
    kept: list[str] = []
    pruned: list[str] = []
    abandoned: list[str] = []
    foreign: list[str] = []
    prepared: list[str] = []
    for run_id, summary in saved:
        if summary is None:
            if now - newest_first_time(run_id) > ABANDONED_AFTER:
                before_each()
                ns.delete_folder(files.run_prefix(run_id).rstrip("/"))
                abandoned.append(run_id)
            continue
        if summary.repository_id != repository_id:
            foreign.append(run_id)
            continue
        if len(kept) < keep or _needed(summary, base, now):
            kept.append(run_id)
            continue
        if summary.pruned_at is None:
            before_each()
            if _prune(ns, summary, now):
                prepared.append(run_id)
            pruned.append(run_id)
    oldest_kept = kept[-1] if kept else None
    prepared += _prune_prepared(ns, {*kept, *foreign}, oldest_kept, now, before_each)
    return Pruned(tuple(pruned), tuple(abandoned), tuple(prepared))


def _needed(summary: files.RunSummary, base: files.RunSummary | None, now: datetime) -> bool:
    """The newest base, or a mark newer than it that a sweep may still come for (another DAG
    run's, waiting for its gate) unless it is abandoned."""
    if base is not None and summary.run_id == base.run_id:
        return True
    return (
        summary.status == statuses.MARKED
        and (base is None or summary.run_id < base.run_id)
        and now - newest_first_time(summary.run_id) <= ABANDONED_AFTER
    )


def _prune(ns: Namespace, summary: files.RunSummary, now: datetime) -> bool:
    """Remove a run's data sets and its prepare output (whether it had one), then mark its
    summary."""
    prefix = files.run_prefix(summary.run_id)
    for name in PRUNED_SETS:
        ns.delete_folder(prefix + name)
    prepare_output = ns.delete_folder(RETENTION_PREFIX + summary.run_id)
    failpoints.hit("gc.prune.before_mark")
    summary.files = {}
    summary.pruned_at = now.isoformat()
    files.write_summary(ns, summary)
    return bool(prepare_output)


def _prune_prepared(
    ns: Namespace,
    spared: set[str],
    oldest_kept: str | None,
    now: datetime,
    before_each: Callable[[], None],
) -> list[str]:
    """Prepare outputs older than every kept run (ids sort newest first), those without a
    manifest only once abandoned; never those of `spared` runs (kept, or another
    repository's)."""
    removed: list[str] = []
    listing = ns.list_dir(RETENTION_PREFIX.rstrip("/"), metadata=False)
    for run_id in sorted(listing.directories):
        if not files.RUN_ID.match(run_id) or run_id in spared:
            continue
        if oldest_kept is None or run_id < oldest_kept:
            continue
        prefix = RETENTION_PREFIX + run_id
        finished = ns.store.exists(f"{prefix}/{MANIFEST}")
        if not finished and now - newest_first_time(run_id) <= ABANDONED_AFTER:
            continue
        before_each()
        ns.delete_folder(prefix)
        removed.append(run_id)
    return removed


def prune_quietly(
    ns: Namespace,
    repository_id: str,
    keep: int,
    now: datetime,
    lease_check: Callable[[], None],
    emit: Events,
) -> Pruned:
    """`prune_runs` at the end of a run that has recorded its own result: a prune that fails
    (a lost lease, a store error) says so and leaves the rest to the next run's prune, and
    does not fail the run."""
    try:
        pruned = prune_runs(ns, repository_id, keep, now, lease_check)
    except BranchwaterError as exc:
        emit({"event": "notice", "message": f"pruning older GC runs stopped: {exc}"})
        return Pruned()
    if pruned != Pruned():
        emit({"event": "notice", "message": pruned.text()})
    return pruned
