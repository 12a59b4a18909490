"""The uncommitted-GC job: mark (prepare, committed metaranges, the choice of slices, the
mark itself slice by slice on the executors, the quality gate), then sweep; see `plan` for
the clean and optimized runs and their safety, and `marking` for how the mark files.

Run it from the command line (`arguments`), or call `GCJob(spark, config).run()` with a
session of your own.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from functools import cached_property, partial
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession

from branchwater.engine import (
    BranchwaterError,
    GCRunLease,
    InvalidAddress,
    InvalidArgument,
    Lake,
    Repository,
    UncommittedRun,
)
from branchwater.engine.failpoints import hit
from branchwater.engine.gc.runs import files, plan, statuses
from branchwater.engine.gc.runs.config import (
    CLEAN,
    CLOCK_SKEW,
    OPTIMIZED,
    SLICE_LIFETIME,
    JobConfig,
)
from branchwater.engine.gc.runs.events import Events, emit
from branchwater.engine.gc.runs.files import RunSummary
from branchwater.engine.gc.runs.layout import choose_slices
from branchwater.engine.gc.runs.pruning import prune_quietly
from branchwater.engine.gc.runs.retention import (
    EXPIRED_COMMITS,
    ONLY_COMMITTED,
    ONLY_UNCOMMITTED,
    PARTS,
    release_unswept,
    retention_input,
    write_expiring,
)
from branchwater.engine.gc.runs.storage import Namespace
from branchwater.engine.gc.runs.sweeps import save_run, saved_validations, sweep_mark, take_lease
from branchwater.spark_jobs.gc.committed import CommittedInput, read_committed
from branchwater.spark_jobs.gc.frames import cores, executor_errors, read_parquet
from branchwater.spark_jobs.gc.gate import (
    Gate,
    GateLimits,
    max_candidates,
    with_age,
)
from branchwater.spark_jobs.gc.inputs import SetsRead
from branchwater.spark_jobs.gc.listing import data_slices
from branchwater.spark_jobs.gc.mark_paths import MarkPath, choose
from branchwater.spark_jobs.gc.marking import Marked
from branchwater.spark_jobs.gc.retention import ExpiredMark, active_addresses, flagged, mark_expired
from branchwater.spark_jobs.gc.sweep import sweep

ID_COLUMNS = {"ranges": "range_id", "metaranges": "metarange_id"}
SHUFFLE_PARTITIONS = "spark.sql.shuffle.partitions"
"""Spark's default (200) suits big clusters; unless set, the job uses 4 per core."""
SESSION_CONF: dict[str, bool | float | int | str | None] = {
    "spark.sql.session.timeZone": "UTC",
    "spark.python.sql.dataFrameDebugging.enabled": "false",
    "spark.sql.files.ignoreMissingFiles": "false",
    "spark.sql.files.ignoreCorruptFiles": "false",
}
"""The job's own session settings. PySpark's DataFrame debugging (on by default since Spark
4) records the Python call site of every DataFrame and Column call, a stack walk and four
Py4J round trips each; the driver makes hundreds a run (GX's suites most of them: a seventh
of the candidates' suite), and the job's errors name their phase already. A cluster set to
skip missing or corrupt files would let the gate validate fewer candidates than a sweep
deletes: the job's reads never skip."""


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


class GCJob:
    """One run of the job on a Spark session, or on one a function starts when the run first
    needs it (a sweep of a mark with no candidates needs none); `events` hears phases and the
    summary."""

    def __init__(
        self,
        spark: SparkSession | Callable[[], SparkSession],
        config: JobConfig,
        events: Events | None = None,
    ):
        self._session = spark
        self.config = config
        self.events = events or (lambda event: None)
        self._phases: dict[str, float] = {}

    @cached_property
    def spark(self) -> SparkSession:
        return self._session() if callable(self._session) else self._session

    def started_session(self) -> SparkSession | None:
        """The session, if the run needed one."""
        return self.__dict__.get("spark")

    @cached_property
    def cores(self) -> int:
        return cores(self.spark)

    @cached_property
    def partitions(self) -> int:
        return self.config.partitions or 2 * self.cores

    def run(self) -> RunSummary:
        with Lake.connect(self.config.kv_url, s3_options=dict(self.config.s3_options)) as lake:
            repo = lake.repository(self.config.repository)
            ns = Namespace.of(repo.storage_namespace, self.config.s3_options)
            with take_lease(repo, self.config) as lease:
                self.events({"event": "notice", "message": f"GC run lease held: {lease.holder}"})
                if self.config.sweep is not None:
                    summary = files.read_summary(ns, self.config.sweep)
                    summary = self.sweep_mark(repo, ns, summary, lease)
                else:
                    summary = self.mark(repo, ns)
                    if not summary.gate_success:
                        release_unswept(repo.lake.graveler, repo.record, ns, summary)
                    elif not self.config.dry_run:
                        summary = self.sweep_mark(repo, ns, summary, lease)
                prune_quietly(
                    ns,
                    repo.record.unique_id,
                    self.config.keep_runs,
                    utc_now(),
                    lease.check,
                    self.events,
                )
        self.events({"event": "summary", "summary": summary.to_json()})
        return summary

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        self.events({"event": "phase", "phase": name, "state": "start"})
        start = time.monotonic()
        try:
            yield
        finally:
            seconds = round(time.monotonic() - start, 3)
            self._phases[name] = seconds
            self.events({"event": "phase", "phase": name, "state": "end", "seconds": seconds})

    # -- mark -------------------------------------------------------------------------------

    @property
    def parts(self) -> list[str]:
        """The parts this run does: one with `--only`, else both (the committed one only
        when the repository has rules, which the run finds out when it reads them)."""
        return [self.config.only] if self.config.only else list(PARTS)

    def mark(self, repo: Repository, ns: Namespace) -> RunSummary:
        started = utc_now()
        base, fallback = self._base(repo, ns)
        with self.phase("prepare"):
            prepared = self._prepare(repo)
        if base is not None and (
            widened := _late_writes_widened(base, self._late_writes(prepared))
        ):
            base, fallback = None, widened
        if self.config.prepare_run is not None:
            self._withdraw_earlier_mark(repo, ns, prepared.run_id)
        min_age = self.config.min_age
        if min_age is None:
            min_age = prepared.default_min_age
        cutoff = prepared.started_at - min_age
        after = _time(base.considered_through) if base else None
        window = plan.Window(cutoff, after)
        summary = RunSummary(
            run_id=prepared.run_id,
            repository=repo.name,
            repository_id=repo.record.unique_id,
            storage_namespace=repo.storage_namespace,
            mode=OPTIMIZED if base else CLEAN,
            requested_mode=self.config.mode,
            dry_run=self.config.dry_run,
            started_at=started.isoformat(),
            prepare_started_at=prepared.started_at.isoformat(),
            cutoff=cutoff.isoformat(),
            min_age_seconds=min_age.total_seconds(),
            default_min_age_seconds=prepared.default_min_age.total_seconds(),
            fallback=fallback,
            base_run=base.run_id if base else None,
            considered_after=after.isoformat() if after else None,
            considered_through=window.through.isoformat() if self._lists else None,
            phases=self._phases,
            retention={"parts": [p for p in self.parts if p == ONLY_UNCOMMITTED]},
        )
        if fallback:
            self.events({"event": "notice", "message": fallback})
        try:
            with executor_errors(f"mark of GC run {summary.run_id}"):
                self._mark(ns, repo, prepared, base, window, summary, started)
        except BaseException as exc:
            summary.status = statuses.FAILED
            summary.error = str(exc) if isinstance(exc, BranchwaterError) else repr(exc)
            save_run(ns, summary, None)
            with contextlib.suppress(BranchwaterError, OSError):
                for folder in files.set_folders(summary.run_id):
                    ns.delete_folder(folder)
            raise
        return summary

    def _withdraw_earlier_mark(self, repo: Repository, ns: Namespace, run_id: str) -> None:
        """A prepare run marked again (a retried or cleared mark task): a mark whose sweep
        began is refused, since its records under `deleted/` name that mark's files; any
        other earlier mark is saved as failed and its files removed before this mark writes
        one, so a mark killed midway never leaves the earlier gate's verdict over files it
        rewrote."""
        if not files.RUN_ID.match(run_id):
            return
        earlier = files.saved_summary(ns, run_id)
        began = ns.folder_keys(f"{files.run_prefix(run_id)}{files.DELETED}")
        if began or (earlier is not None and earlier.status == statuses.SWEPT):
            raise InvalidArgument(
                f"GC run {run_id} was swept, or its sweep began: its prepare run cannot be "
                "marked again; prepare a new run (nothing was marked or deleted)"
            )
        if earlier is None or earlier.status == statuses.FAILED:
            return
        if earlier.repository_id == repo.record.unique_id:
            release_unswept(repo.lake.graveler, repo.record, ns, earlier)
        earlier.status = statuses.FAILED
        earlier.error = "withdrawn: its prepare run was marked again"
        save_run(ns, earlier, None)
        for folder in files.set_folders(run_id):
            ns.delete_folder(folder)

    def _prepare(self, repo: Repository) -> UncommittedRun:
        """Mark every branch's uncommitted addresses (then the copy records) now."""

        def progress(entries: int) -> None:
            self.events({"event": "progress", "phase": "prepare", "entries": entries})

        run = repo.prepare_uncommitted_for_gc(self.config.prepare_run, progress=progress)
        return repo.uncommitted_gc_run(run.run_id)

    @property
    def _lists(self) -> bool:
        """Whether the run does the uncommitted part, listing the namespace. A committed-only
        run does not, so it is never an optimized run's base (`considered_through` unset)."""
        return ONLY_UNCOMMITTED in self.parts

    def _base(self, repo: Repository, ns: Namespace) -> tuple[RunSummary | None, str | None]:
        if self.config.mode != OPTIMIZED or not self._lists:
            return None, None
        base = files.latest_base(ns, repo.record.unique_id)
        if base is None:
            return None, (
                "optimized run requested, but no previous run of this repository passed its "
                "gate and finished its sweep: running a clean run instead"
            )
        return base, None

    def _mark(
        self,
        ns: Namespace,
        repo: Repository,
        prepared: UncommittedRun,
        base: RunSummary | None,
        window: plan.Window,
        summary: RunSummary,
        started: datetime,
    ) -> None:
        read = SetsRead(self.spark, ns, prepared, base, self.cores)
        gate = Gate(self.spark)
        gate.start_prepare_output(read.frame(plan.UNCOMMITTED), read.rows(plan.UNCOMMITTED))
        scratch = files.scratch_prefix(summary.run_id, "committed")
        late = self._late_writes(prepared)
        try:
            marked = (
                self._uncommitted_part(ns, repo, base, window, late, summary, read, scratch)
                if self._lists
                else None
            )
            limits = GateLimits(
                (prepared.started_at - window.cutoff).total_seconds(),
                max_candidates(summary.volume("namespace").objects, self.config.max_share),
            )
            self._committed_part(repo, ns, read, gate, summary, started, window, late, limits)
            hit("gc.mark.before_gate")
            with self.phase("gate"):
                if marked is None:
                    checked = gate.result()
                else:
                    path, keys = marked
                    flagged = path.flagged(keys, read, scratch)
                    candidates = with_age(flagged, prepared.started_at)
                    rows = summary.volume("candidates").objects
                    checked = gate.check_candidates(candidates, rows, limits)
        finally:
            gate.wait()
            ns.delete_folder(scratch)
        summary.gate = checked.expectations
        summary.gate_success = checked.success
        summary.status = statuses.MARKED if checked.success else statuses.GATE_FAILED
        save_run(ns, summary, checked.validations)

    def _uncommitted_part(
        self,
        ns: Namespace,
        repo: Repository,
        base: RunSummary | None,
        window: plan.Window,
        late: timedelta,
        summary: RunSummary,
        read: SetsRead,
        scratch: str,
    ) -> tuple[MarkPath, list[str]]:
        """The uncommitted mark: committed addresses, the slices listed and marked, the
        state an optimized run builds on; returns the mark path and its candidates files."""
        run_id = summary.run_id
        with self.phase("committed"):
            read.committed = committed = self._committed(repo, ns, base, scratch)
        with self.phase("slices"):
            slices, summary.slices = self._slices(ns, late, window)
        with self.phase("mark"):
            path = choose(
                self.spark, slices, read, self.config.driver_rows, self.partitions, self.cores
            )
            summary.slices["marked_on"] = path.where
            marked = self._marked(path, run_id, slices, read, window, late)
            self._refuse_malformed(marked)
            counts = marked.counts
            counts["namespace"] = files.namespace_volume(base, counts["new"])
            summary.counts = {k: v for k, v in counts.items() if k != "malformed"}
            summary.ranges = {
                "metaranges_read": committed.new_metaranges,
                "ranges_read": committed.new_ranges,
                "ranges_known": len(committed.range_ids),
            }
            summary.reclaimed_by_slice = marked.per_slice
        with self.phase("state"):
            summary.files = {**marked.files, **self._write_ids(ns, run_id, committed)}
        return path, marked.files["candidates"]

    def _committed_part(
        self,
        repo: Repository,
        ns: Namespace,
        read: SetsRead,
        gate: Gate,
        summary: RunSummary,
        started: datetime,
        window: plan.Window,
        late: timedelta,
        limits: GateLimits,
    ) -> None:
        """Retention's part of the run (see `retention`), when the repository has rules and
        the run is not `--only uncommitted`: its candidates join the run's candidates files,
        its suite (`gc-expired`) the gate. `--only committed` lists nothing, so its share of
        the namespace is bounded by the objects the commits it read hold: the active
        commits' addresses and its candidates."""
        if ONLY_COMMITTED not in self.parts:
            return
        rules = retention_input(repo.lake.graveler, repo.record, started)
        if rules is None:
            summary.files.setdefault(files.CANDIDATES, [])
            summary.retention = {"parts": summary.retention["parts"], "rules": None}
            return
        with self.phase("retention"):
            layout = repo.committed_layout()
            uncommitted = read.frame(plan.UNCOMMITTED)
            expired = mark_expired(
                self.spark,
                ns,
                repo,
                layout,
                rules,
                uncommitted,
                summary.run_id,
                window.cutoff,
                late,
                self.cores,
                self.config.candidates_per_file,
            )
            active = active_addresses(self.spark, ns, layout, rules, self.cores).distinct()
            if not self._lists:
                held = active.count() + expired.volume.objects
                bound = max_candidates(held, self.config.max_share)
                limits = GateLimits(limits.min_age_seconds, bound)
            frame = flagged(self.spark, ns, expired.keys, active, uncommitted, started)
            gate.check_expired(frame, expired.volume.objects, limits)
        self._record_expired(ns, summary, rules.summary(), expired)

    def _record_expired(
        self, ns: Namespace, summary: RunSummary, commits: dict[str, Any], expired: ExpiredMark
    ) -> None:
        summary.files[EXPIRED_COMMITS] = write_expiring(ns, summary.run_id, expired.expiring)
        uncommitted = summary.files.get(files.CANDIDATES, [])
        summary.files[files.CANDIDATES] = [*uncommitted, *expired.keys]
        summary.counts["expired"] = expired.volume
        parts = [*summary.retention["parts"], ONLY_COMMITTED]
        summary.retention = {"parts": parts, **commits, **expired.to_json()}

    def _marked(
        self,
        path: MarkPath,
        run_id: str,
        slices: list[str],
        read: SetsRead,
        window: plan.Window,
        late: timedelta,
    ) -> Marked:
        prefixes = {name: files.set_prefix(run_id, name) for name in plan.SETS}
        per_file = self.config.candidates_per_file
        return path.mark(slices, read, window, late + CLOCK_SKEW, prefixes, per_file)

    def _committed(
        self, repo: Repository, ns: Namespace, base: RunSummary | None, copies: str
    ) -> CommittedInput:
        known_metaranges: set[str] = set()
        known_ranges: set[str] = set()
        if base is not None:
            known_metaranges = _ids(ns, base.files.get("metaranges", []))
            known_ranges = _ids(ns, base.files.get("ranges", []))
        return read_committed(
            self.spark,
            ns,
            repo.committed_layout(),
            known_metaranges,
            known_ranges,
            self.cores,
            copies,
            on_driver=base is not None and self.config.driver_rows > 0,
        )

    def _late_writes(self, prepared: UncommittedRun) -> timedelta:
        """How long after a slice is opened objects may still land in it."""
        if self.config.late_writes is not None:
            return self.config.late_writes
        return prepared.token_expiry + SLICE_LIFETIME + CLOCK_SKEW

    def _slices(
        self, ns: Namespace, late: timedelta, window: plan.Window
    ) -> tuple[list[str], dict[str, Any]]:
        """The slices to list, and what the summary says of them."""
        names = data_slices(ns)
        chosen, skipped = choose_slices(names, window.cutoff, window.after, late, CLOCK_SKEW)
        slices = {
            "read": len(chosen),
            "skipped_young": skipped["young"],
            "skipped_old": skipped["old"],
            "ignored_folders": skipped["malformed"],
            "newest_read": chosen[0] if chosen else None,
            "oldest_read": chosen[-1] if chosen else None,
            "late_writes_seconds": late.total_seconds(),
        }
        return chosen, slices

    def _read(self, ns: Namespace, keys: list[str], schema: str) -> DataFrame:
        return read_parquet(self.spark, ns, keys, schema, self.partitions)

    def _refuse_malformed(self, marked: Marked) -> None:
        bad = marked.counts["malformed"].objects
        if not bad:
            return
        examples = ", ".join(f"{a!r} ({plan.describe(b)})" for a, b in marked.malformed)
        raise InvalidAddress(
            f"GC refuses to run: {bad} address(es) it read are not data/<slice>/<object id> "
            f"in the repository's namespace, e.g. {examples}; nothing was deleted"
        )

    def _write_ids(
        self, ns: Namespace, run_id: str, committed: CommittedInput
    ) -> dict[str, list[str]]:
        """The range and metarange ids the next optimized run need not read again."""
        written: dict[str, list[str]] = {}
        for name, ids in (("ranges", committed.range_ids), ("metaranges", committed.metarange_ids)):
            key = f"{files.set_prefix(run_id, name)}/{files.part_name(0)}"
            ns.write_parquet(key, pa.table({ID_COLUMNS[name]: pa.array(ids, pa.string())}))
            written[name] = [key]
        return written

    # -- sweep ------------------------------------------------------------------------------

    def sweep_mark(
        self, repo: Repository, ns: Namespace, summary: RunSummary, lease: GCRunLease
    ) -> RunSummary:
        """`sweeps.sweep_mark`, deleting on the executors (in this process when the mark
        has no candidates)."""
        delete = partial(self._delete, ns)
        return sweep_mark(repo, ns, summary, lease, delete, self._phases, self.events)

    def _delete(
        self, ns: Namespace, summary: RunSummary
    ) -> tuple[list[str], list[files.SliceVolume]]:
        run_id = summary.run_id
        spark = None if files.nothing_to_delete(summary) else self.spark
        hit("gc.sweep.before_delete")
        try:
            with self.phase("sweep"):
                deleted = (
                    sweep(spark, ns, run_id, summary.files[files.CANDIDATES]) if spark else ([], [])
                )
            hit("gc.sweep.after_delete")
        except BaseException as exc:
            summary.error = f"sweep unfinished, run it again with --sweep {run_id}: {exc}"
            summary.phases = {**summary.phases, **self._phases}
            save_run(ns, summary, saved_validations(ns, run_id))
            raise
        return deleted


def _time(text: str | None) -> datetime:
    assert text is not None
    return datetime.fromisoformat(text)


def _ids(ns: Namespace, keys: list[str]) -> set[str]:
    """A saved set of ids, read on the driver: small next to what is read from them."""
    return {i for key in keys for i in ns.read_parquet(key).column(0).to_pylist()}


def start_session(config: JobConfig) -> SparkSession:
    builder = SparkSession.builder.appName(f"branchwater-gc-{config.repository}")
    spark = builder.config(map=SESSION_CONF).getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    if not spark.sparkContext.getConf().contains(SHUFFLE_PARTITIONS):
        spark.conf.set(SHUFFLE_PARTITIONS, str(4 * cores(spark)))
    return spark


def _late_writes_widened(base: RunSummary, late: timedelta) -> str | None:
    """Why `base` cannot be built on when this run's late-writes window is wider than its
    (a client with longer link tokens, or `--late-writes`): the base skipped old slices
    and settled objects by the narrower window, so an object landing later in a slice than
    it allowed was never considered, and listed now by its true time it would look like
    garbage although a commit holds it."""
    based_on = base.slices.get("late_writes_seconds")
    if based_on is not None and late.total_seconds() <= based_on:
        return None
    return (
        f"optimized run requested, but the late-writes window ({late.total_seconds():g} s) "
        f"is wider than base run {base.run_id}'s ({based_on or 'unknown'} s): running a "
        "clean run instead"
    )


def run(config: JobConfig) -> int:
    """Run the job `config` describes in a session of its own; the exit status: 0 only when
    the run and its gate succeeded."""
    job = GCJob(partial(start_session, config), config, emit)
    try:
        summary = job.run()
    except BranchwaterError as exc:
        emit({"event": "error", "message": str(exc), "kind": type(exc).__name__})
        return 1
    finally:
        spark = job.started_session()
        if spark is not None:
            spark.stop()
    return 0 if summary.gate_success else 1
