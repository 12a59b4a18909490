"""`gc explain`: why an object was or was not collected (what lakeFS users ask in its
issue 4237). No Spark: it reads the saved runs, the repository's refs and the object itself.

The answer says, in this order: in which run the object was deleted (or marked and not yet
swept); which commits (and paths) hold its address; on which branches it is uncommitted now,
and how the run's prepare output saw it; whether it is too young; and otherwise that it is
garbage the next run collects, or why an optimized run did not reach it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Protocol

import pyarrow.compute as pc

from branchwater.engine.errors import InvalidAddress, NotFound
from branchwater.engine.gc.addresses import is_data_address
from branchwater.engine.gc.inputs import CommittedLayout, UncommittedRun
from branchwater.engine.gc.provenance import Provenance
from branchwater.engine.gc.runs import files, statuses
from branchwater.engine.gc.runs.layout import slice_time
from branchwater.engine.gc.runs.storage import Namespace
from branchwater.engine.graveler.model import Change, Commit

EXPIRED_FILE_PREFIX = "expired-"
"""How the committed part's candidates files are named (`spark_jobs/gc/retention.py`)."""
MAX_COMMITS = 5
"""Commits named in an answer; the count says how many more hold the address."""


class UncommittedBranch(Protocol):
    @property
    def name(self) -> str: ...

    def uncommitted(self) -> Iterator[Change]: ...


class ExplainedRepository(Protocol):
    """What `explain` reads of a repository: `branchwater.engine.Repository` has it all
    (a protocol, as this layer sits below the public API)."""

    @property
    def storage_namespace(self) -> str: ...

    def committed_layout(self) -> CommittedLayout: ...

    def commit(self, commit_id: str) -> Commit: ...

    def branches(self) -> Sequence[UncommittedBranch]: ...

    def uncommitted_gc_run(self, run_id: str) -> UncommittedRun: ...

    def provenance(self, address: str) -> list[Provenance]: ...


@dataclass
class Reference:
    """Something that keeps the address alive: a commit or a branch (now), or the prepare
    output of a run (then)."""

    kind: str
    name: str
    path: str | None = None
    detail: str | None = None


@dataclass
class Explanation:
    address: str
    verdict: str
    reasons: list[str]
    references: list[Reference] = field(default_factory=list)
    commits_holding: int = 0
    run_id: str | None = None
    exists: bool = False
    mtime: str | None = None
    size: int | None = None
    made_by: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def text(self) -> str:
        lines = [f"{self.address}: {self.verdict}"]
        lines += [f"  {reason}" for reason in self.reasons]
        return "\n".join(lines)


def normalize_address(ns: Namespace, address: str) -> str:
    """A data address relative to the namespace; an absolute one must point inside it."""
    relative = address
    root = ns.url.rstrip("/") + "/"
    if "://" in address:
        if not address.startswith(root):
            raise InvalidAddress(f"{address!r} is outside this repository's namespace {ns.url}")
        relative = address[len(root) :]
    if not is_data_address(relative):
        raise InvalidAddress(
            f"{address!r} is not a data address: GC only ever collects data/<slice>/<object id>"
            f" in {ns.url}"
        )
    return relative


def explain(
    repo: ExplainedRepository,
    address: str,
    run_id: str | None = None,
    *,
    min_age: timedelta,
    s3_options: Mapping[str, str] | None = None,
    now: datetime | None = None,
) -> Explanation:
    ns = Namespace.of(repo.storage_namespace, s3_options)
    key = normalize_address(ns, address)
    now = now or datetime.now(timezone.utc)
    summaries = _summaries(ns, run_id)
    answer = Explanation(key, "", [], run_id=run_id)
    _object(ns, key, answer)
    commits = _commits(repo, ns, key)
    answer.commits_holding = len(commits)
    answer.references += commits[:MAX_COMMITS]
    answer.references += _branches(repo, key)
    answer.made_by = [made.text() for made in repo.provenance(key)]
    for summary in summaries:
        deleted = _file_holding(ns, summary.files.get("deleted", []), key)
        if deleted is not None:
            answer.run_id = summary.run_id
            answer.verdict = f"deleted by GC run {summary.run_id}"
            if _expired_file(deleted):
                answer.reasons.append(f"swept {summary.swept_at}: {_expired_reason(answer)}")
                return answer
            answer.reasons.append(
                f"swept {summary.swept_at}: unreferenced and modified before the cutoff "
                f"{summary.cutoff}"
            )
            _dangling(answer)
            return answer
        marked = _file_holding(ns, summary.files.get(files.CANDIDATES, []), key)
        if marked is not None:
            answer.run_id = summary.run_id
            answer.verdict = f"marked by GC run {summary.run_id}, not deleted yet"
            if _expired_file(marked):
                answer.reasons.append(_expired_reason(answer))
            answer.reasons.append(_unswept(summary))
            return answer
    _kept(repo, answer, summaries, ns, min_age, now)
    return answer


def _summaries(ns: Namespace, run_id: str | None) -> list[files.RunSummary]:
    if run_id is not None:
        return [files.read_summary(ns, run_id)]
    return list(files.summaries(ns))


def _object(ns: Namespace, key: str, answer: Explanation) -> None:
    try:
        info = ns.store.stat(key)
    except NotFound:
        return
    answer.exists, answer.mtime, answer.size = True, info.mtime.isoformat(), info.size


def _commits(repo: ExplainedRepository, ns: Namespace, key: str) -> list[Reference]:
    """Every commit whose tree holds the address, newest first (each range read once)."""
    layout = repo.committed_layout()
    holding: dict[str, str] = {}
    ranges: dict[str, str | None] = {}
    for metarange_id in layout.metarange_ids():
        table = ns.read_parquet(layout.metarange_key(metarange_id), ["range_id"])
        for range_id in table.column(0).to_pylist():
            if range_id not in ranges:
                ranges[range_id] = _path_in_range(ns, layout.range_key(range_id), key)
            path = ranges[range_id]
            if path is not None:
                holding[metarange_id] = path
                break
    found = []
    for commit_id, metarange_id in layout.metaranges.items():
        if metarange_id in holding:
            commit = repo.commit(commit_id)
            detail = f"{commit.creation_date.isoformat()}: {commit.message}"
            found.append(
                (
                    commit.creation_date,
                    Reference("commit", commit_id, holding[metarange_id], detail),
                )
            )
    return [ref for _, ref in sorted(found, key=lambda item: item[0], reverse=True)]


def _path_in_range(ns: Namespace, range_key: str, key: str) -> str | None:
    table = ns.read_parquet(range_key, ["path", "address"])
    hits = table.filter(pc.equal(table.column("address"), key))
    return hits.column("path")[0].as_py() if hits.num_rows else None


def _branches(repo: ExplainedRepository, key: str) -> list[Reference]:
    found = []
    for branch in repo.branches():
        for change in branch.uncommitted():
            if change.entry is not None and change.entry.address == key:
                found.append(Reference("branch", branch.name, change.path, change.type))
    return found


def _file_holding(ns: Namespace, keys: list[str], address: str) -> str | None:
    """The first of the files `keys` that lists `address`."""
    for file_key in keys:
        table = ns.read_parquet(file_key, ["address"])
        if pc.any(pc.equal(table.column(0), address)).as_py():
            return file_key
    return None


def _expired_file(key: str) -> bool:
    """Whether a candidates (or deleted) file is the committed part's (retention)."""
    return key.rsplit("/", 1)[-1].startswith(EXPIRED_FILE_PREFIX)


def _expired_reason(answer: Explanation) -> str:
    """Retention's reason, naming the expired commits that held the address."""
    commits = [r for r in answer.references if r.kind == "commit"]
    if not commits:
        return "retention: only expired commits held it"
    more = answer.commits_holding - len(commits)
    named = ", ".join(f"{r.name[:12]} ({r.detail}) as {r.path}" for r in commits)
    return f"retention: only expired commits held it: {named}" + (
        f" and {more} more" if more else ""
    )


def _prepared(repo: ExplainedRepository, ns: Namespace, run_id: str, key: str) -> list[Reference]:
    """How a run's prepare output saw the address: branch and source of each row."""
    try:
        prepared = repo.uncommitted_gc_run(run_id)
    except NotFound:
        return []
    found = []
    for file_key in prepared.keys:
        table = ns.read_parquet(file_key, ["address", "branch", "source"])
        hits = table.filter(pc.equal(table.column("address"), key))
        for branch, source in zip(
            hits.column("branch").to_pylist(), hits.column("source").to_pylist(), strict=True
        ):
            found.append(Reference("prepare", branch, None, f"{source} at run {run_id}"))
    return found


def _dangling(answer: Explanation) -> None:
    if answer.references:
        names = ", ".join(f"{r.kind} {r.name}" for r in answer.references)
        verb = "refers" if len(answer.references) == 1 else "refer"
        answer.reasons.append(f"yet {names} {verb} to it now: its data is gone")
        _made_by(answer)


def _made_by(answer: Explanation) -> None:
    """Name the operations GC's records remember making a reference to the address."""
    for made in answer.made_by:
        answer.reasons.append(f"referenced by {made}")


def _unswept(summary: files.RunSummary) -> str:
    if summary.status == statuses.GATE_FAILED:
        return "the run's quality gate failed, so its mark will never be swept"
    if summary.dry_run and summary.status == statuses.MARKED:
        return f"a dry run: sweep it with --sweep {summary.run_id}"
    return f"its sweep did not finish: run it again with --sweep {summary.run_id}"


def _kept(
    repo: ExplainedRepository,
    answer: Explanation,
    summaries: list[files.RunSummary],
    ns: Namespace,
    min_age: timedelta,
    now: datetime,
) -> None:
    commits = [r for r in answer.references if r.kind == "commit"]
    branches = [r for r in answer.references if r.kind == "branch"]
    if not answer.exists:
        answer.verdict = "no object at this address"
        answer.reasons.append("nothing to collect: it was never written, or removed by hand")
        pruned = [summary for summary in summaries if summary.pruned_at]
        if pruned:
            answer.reasons.append(
                f"or deleted by one of {len(pruned)} older GC runs ({pruned[-1].run_id} to "
                f"{pruned[0].run_id}) whose records were pruned"
            )
        _dangling(answer)
        return
    if commits:
        more = answer.commits_holding - len(commits)
        named = ", ".join(f"{r.name[:12]} ({r.detail}) as {r.path}" for r in commits)
        answer.verdict = "kept: committed"
        answer.reasons.append(f"held by commit {named}" + (f" and {more} more" if more else ""))
    if branches:
        answer.verdict = answer.verdict or "kept: uncommitted"
        for ref in branches:
            answer.reasons.append(f"uncommitted on branch {ref.name} as {ref.path} ({ref.detail})")
        _made_by(answer)
    age = now - datetime.fromisoformat(answer.mtime or now.isoformat())
    if not commits and not branches and age < min_age:
        answer.verdict = "kept: too young"
        answer.reasons.append(f"modified {age} ago, less than the minimum age {min_age}")
    if summaries:
        _last_run(repo, answer, summaries[0], ns)
    if not answer.verdict:
        answer.verdict = "unreferenced: the next run collects it"


def _last_run(
    repo: ExplainedRepository, answer: Explanation, summary: files.RunSummary, ns: Namespace
) -> None:
    """Why the latest (or the named) run left it alone."""
    mtime = datetime.fromisoformat(answer.mtime) if answer.mtime else None
    run = f"run {summary.run_id}"
    if mtime is not None and mtime > datetime.fromisoformat(summary.cutoff):
        answer.reasons.append(
            f"{run} did not consider it: modified after its cutoff {summary.cutoff}"
        )
        return
    slice_name = answer.address.split("/")[1]
    opened = slice_time(slice_name)
    if summary.mode == "optimized" and summary.considered_after and mtime is not None:
        after = datetime.fromisoformat(summary.considered_after)
        late = timedelta(seconds=summary.slices.get("late_writes_seconds", 0))
        if mtime <= after:
            answer.reasons.append(
                f"{run} (optimized) left it to earlier runs: modified before {after}"
            )
        elif opened is not None and opened <= after - late:
            answer.reasons.append(
                f"{run} (optimized) skipped its slice, opened before {after - late}: a clean "
                "run collects it"
            )
    for ref in _prepared(repo, ns, summary.run_id, answer.address):
        answer.reasons.append(f"{run} saw it uncommitted on branch {ref.name} ({ref.detail})")
