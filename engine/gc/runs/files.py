"""What a GC run saves under `<namespace>/_branchwater/retention/gc/<run_id>/`, and reading it.

- `summary.json`: the run's summary (`RunSummary`), written when the mark finishes and again
  when the sweep does; a run without it never finished marking.
- `report.html`: the summary for a person, self-contained.
- `validation.json`: Great Expectations' own validation results of the gate.
- `candidates/part-NNNNN-CCC.parquet`: the marked addresses (address, size, mtime, slice),
  each file a sweep task's unit.
- `deleted/part-NNNNN-CCC.parquet`: what the sweep deleted, one file per candidates file, written
  after its deletes: a sweep re-run skips the files already recorded.
- `state/{pending,carry,ranges,metaranges}/part-….parquet`: what the next optimized run
  starts from (see `plan`).

The run id is the id of the prepare run the GC run started with (newest first, and encoding
its start), so one id names both. Nothing here imports Spark: the CLI reads runs too.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from branchwater.engine.errors import CorruptedData, GateFailed, InvalidArgument, NotFound
from branchwater.engine.gc.addresses import ID_PATTERN
from branchwater.engine.gc.runs.statuses import GATE_FAILED, MARKED, SWEPT
from branchwater.engine.gc.runs.storage import Namespace, missing_ok_json
from branchwater.engine.objects import ObjectStore

RUNS_PREFIX = "_branchwater/retention/gc/"
FORMAT = "branchwater-gc-run/1"
SUMMARY = "summary.json"
REPORT = "report.html"
VALIDATION = "validation.json"
CANDIDATES = "candidates"
DELETED = "deleted"
STATE = "state"
SCRATCH = "scratch"
STATE_SETS = ("pending", "carry", "ranges", "metaranges")
RUN_ID = re.compile(rf"^{ID_PATTERN}\Z")


def run_prefix(run_id: str) -> str:
    return f"{RUNS_PREFIX}{run_id}/"


def set_prefix(run_id: str, name: str) -> str:
    """The folder of one set a run writes: `candidates/`, or `state/<name>/` for the rest."""
    if name == CANDIDATES:
        return f"{run_prefix(run_id)}{CANDIDATES}"
    return f"{run_prefix(run_id)}{STATE}/{name}"


def scratch_prefix(run_id: str, name: str) -> str:
    """The folder of files a run needs only while it runs (`scratch/<name>`)."""
    return f"{run_prefix(run_id)}{SCRATCH}/{name}"


def set_folders(run_id: str) -> list[str]:
    """The folders of the files a mark writes besides its summary, report and validation."""
    return [f"{run_prefix(run_id)}{name}" for name in (CANDIDATES, STATE, SCRATCH)]


def part_name(number: int, chunk: int | None = None) -> str:
    """`part-NNNNN.parquet`, or `part-NNNNN-CCC.parquet` for a task's chunk `CCC`."""
    if chunk is None:
        return f"part-{number:05d}.parquet"
    return f"part-{number:05d}-{chunk:03d}.parquet"


@dataclass
class Volume:
    """How many objects (or addresses) and how many bytes."""

    objects: int = 0
    bytes: int = 0


@dataclass
class Expectation:
    """One expectation of the gate, with Great Expectations' own figures."""

    suite: str
    type: str
    kwargs: dict[str, Any]
    success: bool
    observed: dict[str, Any]


@dataclass
class SliceVolume:
    slice: str
    objects: int
    bytes: int


@dataclass
class RunSummary:
    """Everything a person (or the next run) needs to know about one GC run."""

    run_id: str
    repository: str
    repository_id: str
    storage_namespace: str
    mode: str
    requested_mode: str
    dry_run: bool
    started_at: str
    prepare_started_at: str
    cutoff: str
    min_age_seconds: float
    default_min_age_seconds: float
    format: str = FORMAT
    status: str = MARKED
    fallback: str | None = None
    base_run: str | None = None
    considered_after: str | None = None
    considered_through: str | None = None
    slices: dict[str, Any] = field(default_factory=dict)
    counts: dict[str, Volume] = field(default_factory=dict)
    ranges: dict[str, int] = field(default_factory=dict)
    gate_success: bool | None = None
    gate: list[Expectation] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)
    files: dict[str, list[str]] = field(default_factory=dict)
    reclaimed_by_slice: list[SliceVolume] = field(default_factory=list)
    retention: dict[str, Any] = field(default_factory=dict)
    """The committed part: rules, commit counts, expired candidates by branch and month
    (empty when the run had none)."""
    swept_at: str | None = None
    pruned_at: str | None = None
    """When a later run removed this run's data sets (`pruning`): it is never swept nor a
    base after that, and its summary, report and gate results are all that is left."""
    error: str | None = None
    summary_uri: str = ""
    report_uri: str = ""

    @property
    def min_age_override(self) -> bool:
        """A minimum age below the lake's default lets GC race live link tokens."""
        return self.min_age_seconds < self.default_min_age_seconds

    def to_json(self) -> dict[str, Any]:
        document = dataclasses.asdict(self)
        document["min_age_override"] = self.min_age_override
        return document

    @classmethod
    def from_json(cls, document: dict[str, Any]) -> RunSummary:
        values = {f.name: document[f.name] for f in dataclasses.fields(cls) if f.name in document}
        values["counts"] = {k: Volume(**v) for k, v in values.get("counts", {}).items()}
        values["gate"] = [Expectation(**e) for e in values.get("gate", [])]
        values["reclaimed_by_slice"] = [
            SliceVolume(**s) for s in values.get("reclaimed_by_slice", [])
        ]
        return cls(**values)

    def volume(self, name: str) -> Volume:
        return self.counts.get(name, Volume())

    def failed_expectations(self) -> list[Expectation]:
        return [e for e in self.gate if not e.success]


def namespace_volume(base: RunSummary | None, new: Volume) -> Volume:
    """The objects of the namespace old enough for this run, which the gate bounds the
    candidates by: each run of a chain considers an object once (`new`), and only sweeps
    remove objects, so the base's figure less what its sweep deleted plus this run's new
    objects. A base saved without the figure counts only what it considered."""
    if base is None:
        return new
    known = base.counts.get("namespace") or base.volume("considered")
    deleted = base.volume("deleted")
    return Volume(
        max(0, known.objects - deleted.objects) + new.objects,
        max(0, known.bytes - deleted.bytes) + new.bytes,
    )


def write_summary(ns: Namespace, summary: RunSummary) -> None:
    summary.summary_uri = ns.uri(run_prefix(summary.run_id) + SUMMARY)
    summary.report_uri = ns.uri(run_prefix(summary.run_id) + REPORT)
    ns.put_json(run_prefix(summary.run_id) + SUMMARY, summary.to_json())


def read_summary(ns: Namespace, run_id: str) -> RunSummary:
    """The summary of a run whose mark finished; `NotFound` otherwise."""
    if not RUN_ID.match(run_id):
        raise NotFound(f"{run_id!r} is not a GC run id (such as fe5dcfcfb8ff-4db019)")
    summary = saved_summary(ns, run_id)
    if summary is None:
        raise NotFound(
            f"GC run {run_id!r} has no summary in {ns.url}: it does not exist or its mark "
            "did not finish"
        )
    return summary


def saved_summary(ns: Namespace, run_id: str) -> RunSummary | None:
    """A run's summary, None when it has none; `CorruptedData` when it is not one."""
    key = run_prefix(run_id) + SUMMARY
    try:
        document = missing_ok_json(ns, key)
        return None if document is None else RunSummary.from_json(document)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise CorruptedData(
            f"GC run {run_id!r} has a damaged summary ({ns.uri(key)}: {exc}); an optimized "
            "run starts from the newest summary, so run a clean run, or move the run's "
            "folder aside"
        ) from None


def run_ids(ns: Namespace) -> list[str]:
    """Ids of the runs saved in the namespace, newest first."""
    return stored_run_ids(ns.store)


def stored_run_ids(store: ObjectStore) -> list[str]:
    """`run_ids` in a namespace's object store opened by its reader (the Branchwater view): the
    runs' folders from one delimiter listing, never a listing of the files runs wrote."""
    listing = store.list_folder(RUNS_PREFIX.rstrip("/"), metadata=False)
    return sorted(name for name in listing.directories if RUN_ID.match(name))


def summaries(ns: Namespace) -> Iterator[RunSummary]:
    """Summaries of the runs whose mark finished, newest first."""
    for run_id in run_ids(ns):
        summary = saved_summary(ns, run_id)
        if summary is not None:
            yield summary


def latest_base(ns: Namespace, repository_id: str) -> RunSummary | None:
    """The newest run an optimized run may start from: its gate passed and its sweep
    finished, so everything it found collectable is gone, in this very repository."""
    return newest_base(summaries(ns), repository_id)


def newest_base(newest_first: Iterable[RunSummary], repository_id: str) -> RunSummary | None:
    """`latest_base` among summaries already read, newest first; None when the newest base
    was pruned."""
    for summary in newest_first:
        if (
            summary.repository_id == repository_id
            and summary.status == SWEPT
            and summary.gate_success
            and summary.considered_through is not None
        ):
            return None if summary.pruned_at else summary
    return None


def nothing_to_delete(summary: RunSummary) -> bool:
    """The mark holds no candidates files: its sweep deletes nothing and needs no Spark (and
    one that cannot be swept is refused all the same)."""
    return not summary.files.get(CANDIDATES)


def check_sweepable(summary: RunSummary, repository_id: str) -> None:
    """Refuse a mark that did not finish, whose gate failed, or that was made in another
    repository than `repository_id`: it judged that one's references (a repository deleted
    since, whose namespace a new one has)."""
    if summary.repository_id != repository_id:
        raise InvalidArgument(
            f"GC run {summary.run_id} was marked in another repository (one deleted since, "
            "whose namespace this one has): it cannot be swept; nothing was deleted"
        )
    if summary.pruned_at is not None:
        raise InvalidArgument(
            f"GC run {summary.run_id} was pruned at {summary.pruned_at}, when newer runs "
            "replaced it: its mark is gone, so run GC again"
        )
    if summary.status not in (MARKED, SWEPT, GATE_FAILED):
        raise InvalidArgument(
            f"GC run {summary.run_id} did not finish marking ({summary.status}); it cannot be swept"
        )
    if not summary.gate_success:
        failed = ", ".join(e.type for e in summary.failed_expectations()) or "unknown"
        raise GateFailed(
            f"GC run {summary.run_id} failed its quality gate ({failed}); its mark cannot be swept"
        )
