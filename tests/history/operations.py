"""What one worker of a history does: a plan of random operations drawn from the seed, each run
against the lake and logged to the worker's own JSONL file, invocation and completion.

A worker owns a private branch (`w<N>`: only it writes, commits, resets, reverts or merges
into it, so the model of it is exact), writes to the branch every worker shares (`shared`),
plainly and as exclusive creations (`upload(..., if_absent=True)`), merges its branch into
`main` (which takes nothing but merges; some as a preview, then published) and `main` into
its branch, makes and deletes branches and tags of its own, imports a folder of files
outside the lake (the same files every time) into its branch or `shared` under `IMPORTED`,
runs uncommitted GC (prepare, then the GC rule's sweep) and retention GC
(`tests.gc_model.retention_run`, the Spark job's driver with the model's address sets), and
feeds every door hostile input: names, paths and metadata drawn (`hostile.draw`, from the
seed) from the hostile-input suites' strategies, which the engine must refuse with a typed
error and without writing anything, and odd ones (any valid Unicode path, branch or tag
name, user metadata) it must keep exactly. A planned failpoint is armed for the first
attempt only: `raise` is retried at once, `kill` by the process the supervisor starts in its
place, which finds the unfinished operation in the log and runs it again with the same
arguments.

Commits are dated by a fake clock (`refs.clock`) that moves `STEP` per operation from the
history's start, so a history spans weeks and the repository's retention rules (`RULES`)
expire some of it. The dates lie ahead of the wall clock, as the moves' claims (stamped by
the same clock) must: a claim looks fresh to a run for the whole history, which is the order
the fence's argument assumes of a move that may still write.
"""

from __future__ import annotations

import json
import os
import random
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from branchwater.engine import (
    AlreadyExists,
    DirtyBranch,
    GCRunLocked,
    InvalidArgument,
    InvalidName,
    Lake,
    MergeConflict,
    MergeRaceLost,
    NoChanges,
    NotFound,
    StaleGCMark,
    TooManyTries,
    failpoints,
)
from branchwater.engine.api import Repository
from branchwater.engine.graveler.checksums import content_checksum
from branchwater.engine.graveler.names import check_ref_name
from tests.gc_model import retention_run, sweep
from tests.helpers import hostile
from tests.helpers.failpoints import SHORT_COMMIT_WAIT
from tests.helpers.gc import FakeClock

MAIN = "main"
SHARED = "shared"
PATHS = [f"p/{i:02d}" for i in range(8)]
ODD_PATHS = 2
"""Paths of any valid Unicode each history adds to `PATHS` (`paths`)."""
REFUSALS = (
    NotFound,
    NoChanges,
    DirtyBranch,
    MergeConflict,
    TooManyTries,
    AlreadyExists,
    InvalidName,
    InvalidArgument,
    GCRunLocked,
    StaleGCMark,
)
"""Clean refusals: the operation changed nothing (the checker says which fit which
operation: `InvalidName` and `InvalidArgument` only hostile input, `CommitExpired`, a
`NotFound`, only a move onto a commit). Any other error is a finding."""
IMPORTED = "imported-objects/"
"""Where imports land: no other operation names a path under it, so nothing is ever staged
there and an import's effect on a branch is its files, whatever else the branch holds."""
IMPORT_FILES = ("a.csv", "b/c.csv", "d.csv")
"""The files of a history's import source (`Task.source_uri`)."""
MAX_ATTEMPTS = 4
MOVE_POINTS = ("gc.fence.after_claim",)
FAULT_POINTS: dict[str, tuple[str, ...]] = {
    "write": ("write.before_validate",),
    "create": ("write.before_create",),
    "delete": ("write.before_validate",),
    "copy": ("copy.after_read", "copy.after_record", "copy.before_stage"),
    "link": ("link.before_stage",),
    "commit": ("commit.after_seal", "commit.after_ranges", "commit.before_set", "commit.after_set"),
    "compact": ("compaction.after_ranges", "compaction.before_install"),
    "import": (
        "import.after_batch",
        "merge.after_ranges",
        "import.after_record",
        "merge.before_set",
    ),
    "merge": ("merge.after_ranges", "merge.before_set", "publish.before_set", *MOVE_POINTS),
    "sync": ("merge.after_ranges", "merge.before_set", *MOVE_POINTS),
    "revert": ("merge.after_ranges", "merge.before_set", *MOVE_POINTS),
    "cherry_pick": ("merge.after_ranges", "merge.before_set", *MOVE_POINTS),
    "reset": MOVE_POINTS,
    "restore": ("restore.before_stage", *MOVE_POINTS),
    "branch_create": ("branch.before_insert", *MOVE_POINTS),
    "branch_delete": ("branch.before_delete",),
    "tag_create": MOVE_POINTS,
    "gc": ("prepare.branch_scan",),
    "retention": (
        "prepare.branch_scan",
        "gc.retention.before_recheck",
        "gc.retention.before_sweep",
    ),
}
"""The failpoints each kind of operation passes, one of which a faulty operation arms (a merge
that does not publish passes `publish.before_set` by)."""
PUBLISHED = 0.4
"""The share of merges into `main` made as a preview, then published (`Runner.publish`)."""
PREVIEWS = 3
"""Previews a published merge makes at most, each after the last lost its race for `main`
(`MergeRaceLost`, a refusal once the last is lost)."""
STEP = timedelta(days=3)
"""How far each operation of a worker moves the commit clock."""
RULES: dict[str, Any] = {
    "default_retention_days": 9,
    "branches": [
        {"branch_id": MAIN, "retention_days": 24},
        {"branch_id": "w*", "retention_days": 2},
    ],
    "keep_tags": "t1-*",
}
"""The repository's retention rules, in operations of `STEP`: a worker's commits older than
its last operation expire unless something else keeps them, `main` keeps the merges of its
last eight, `shared` and dangling commits those of the last three."""
LEASE = timedelta(seconds=3)
"""The GC run lease of a history's retention runs: one killed holding it blocks the others
this long."""
HOSTILE = {
    "name": ("branch_create", "tag_create", "branch_delete", "tag_delete"),
    "path": ("write", "read", "delete", "link", "copy"),
    "metadata": ("write", "commit", "link"),
}
"""What takes hostile input, by argument."""
MOVES = (
    "reset",
    "revert",
    "cherry_pick",
    "restore",
    "merge",
    "sync",
    "branch_create",
    "tag_create",
)
"""Operations onto a commit (a restore takes entries from one), which retention may have
collected (`CommitExpired`)."""
RESTORED = "p/"
"""The folder a restore takes whole, when it is not given one path."""


def private(worker: int) -> str:
    return f"w{worker}"


@dataclass(frozen=True)
class Task:
    """One worker's part of one history."""

    kv_url: str
    s3_options: dict[str, str] | None
    repository: str
    seed: int
    worker: int
    operations: int
    log_path: str
    fault: str = "raise"
    """`raise` or `kill`: what an armed failpoint does."""
    fault_rate: float = 0.15
    gc_min_age: float = 2.0
    """Seconds: the concurrent runs' minimum age, above any step between a write of an
    object and its staging."""
    start: float = 0.0
    """The history's start (POSIX seconds): the commit clock at operation 0."""
    source_uri: str = ""
    """The folder imports read (`IMPORT_FILES`), outside every namespace."""

    def clock(self, k: int) -> datetime:
        """The commit clock at operation `k`."""
        return datetime.fromtimestamp(self.start, UTC) + k * STEP

    def end(self) -> datetime:
        """The time every retention run classifies at: past every operation."""
        return self.clock(self.operations)


def paths(seed: int) -> list[str]:
    """`PATHS` and the history's odd paths, drawn from the hostile suites' valid paths."""
    rng = random.Random(f"{seed}/paths")
    found = list(PATHS)
    while len(found) < len(PATHS) + ODD_PATHS:
        path = hostile.draw(hostile.object_paths(), rng)
        if path not in found:
            found.append(path)
    return found


def ref_name(rng: random.Random, plain: str) -> str:
    """`plain`, or in 30% of the cases `plain/<any text>` when that is a valid name."""
    if rng.random() > 0.3:
        return plain
    odd = f"{plain}/{hostile.draw(hostile.any_text(8), rng)}"
    try:
        return check_ref_name(odd)
    except InvalidName:
        return plain


@dataclass
class Planned:
    kind: str
    args: dict[str, Any]
    fault: str | None = None
    hostile: dict[str, Any] = field(default_factory=dict)
    """Arguments the engine must refuse, by name: Python values the log cannot hold (it
    holds their `repr`), drawn again from the seed by a restarted worker."""


@dataclass
class Plan:
    """The operations of one worker, drawn from (seed, worker) alone: a restarted worker
    draws the same plan and skips what its log shows finished."""

    task: Task
    steps: list[Planned] = field(default_factory=list)
    pending: list[tuple[int, Planned]] = field(default_factory=list)
    """Deletes of a branch or tag made earlier, with the step they are due at."""

    @classmethod
    def draw(cls, task: Task) -> Plan:
        rng = random.Random(f"{task.seed}/{task.worker}")
        plan = cls(task)
        own = private(task.worker)
        universe = paths(task.seed)
        weights: dict[str, float] = {
            "write": 8,
            "create": 1.5,
            "delete": 2,
            "copy": 2,
            "link": 1,
            "read": 6,
            "list": 1,
            "commit": 3,
            "compact": 1,
            "import": 0.4,
            "reset": 0.5,
            "revert": 0.7,
            "restore": 0.6,
            "cherry_pick": 0.5,
            "merge": 1,
            "sync": 0.7,
            "branch": 0.5,
            "tag": 0.5,
            "gc": 0.2,
            "retention": 0.4,
            "hostile": 1.5,
        }
        kinds, odds = list(weights), list(weights.values())
        while len(plan.steps) < task.operations:
            due = [item for item in plan.pending if item[0] <= len(plan.steps)]
            if due:
                plan.pending.remove(due[0])
                plan.steps.append(due[0][1])
                continue
            kind = rng.choices(kinds, odds)[0]
            staged = kind in ("write", "create", "delete", "copy", "link", "read", "list", "commit")
            shares = staged or kind in ("compact", "import")
            branch = SHARED if shares and rng.random() < 0.4 else own
            path = rng.choice(universe)
            k = len(plan.steps)
            if kind in ("write", "create", "link"):
                plan.add(rng, kind, branch=branch, path=path, metadata=_metadata(rng))
            elif kind in ("delete", "read"):
                plan.add(rng, kind, branch=branch, path=path)
            elif kind == "copy":
                plan.add(rng, kind, branch=branch, src=path, dst=rng.choice(universe))
            elif kind == "commit":
                plan.add(rng, kind, branch=branch, metadata=_metadata(rng))
            elif kind in ("list", "compact", "import"):
                plan.add(rng, kind, branch=branch)
            elif kind == "hostile":
                plan.add_hostile(rng, branch, path)
            elif kind == "reset":
                plan.add(rng, kind, branch=own, back=rng.random() < 0.5)
            elif kind in ("revert", "cherry_pick"):
                plan.add(rng, "commit", branch=own)
                plan.add(rng, kind, branch=own)
            elif kind == "restore":
                spec = rng.choice([path, RESTORED])
                plan.add(rng, kind, branch=own, spec=spec, source=rng.choice(["parent", MAIN]))
            elif kind == "sync":
                plan.add(rng, "commit", branch=own)
                plan.add(rng, kind, source=MAIN, into=own, strategy=_strategy(rng))
            elif kind == "merge":
                plan.add(rng, "commit", branch=own)
                strategy, published = _strategy(rng), rng.random() < PUBLISHED
                plan.add(rng, kind, source=own, into=MAIN, strategy=strategy, publish=published)
            elif kind in ("branch", "tag"):
                name = ref_name(rng, f"{'e' if kind == 'branch' else 't'}{task.worker}-{k}")
                plan.add(rng, f"{kind}_create", name=name, source=own)
                if rng.random() < 0.5:
                    plan.add(rng, f"{kind}_delete", name=name)
                    plan.pending.append((k + rng.randint(2, 8), plan.steps.pop()))
            else:
                plan.add(rng, kind)
        del plan.steps[task.operations :]
        return plan

    def add(self, rng: random.Random, kind: str, **args: Any) -> None:
        fault = None
        points = FAULT_POINTS.get(kind)
        if points and rng.random() < self.task.fault_rate:
            fault = rng.choice(points)
        self.steps.append(Planned(kind, args, fault))

    def add_hostile(self, rng: random.Random, branch: str, path: str) -> None:
        """One operation given a name, path or metadata it must refuse, and nothing else
        it could refuse: its error type is `args["expect"]`."""
        what = rng.choice(sorted(HOSTILE))
        kind = rng.choice(HOSTILE[what])
        args: dict[str, Any] = {"branch": branch}
        if what == "name":
            value, args = hostile.draw(hostile.hostile_names(), rng), {"source": branch}
            args["expect"] = InvalidName.__name__
        elif what == "path":
            value = hostile.draw(hostile.hostile_paths(), rng)
            args["expect"] = InvalidArgument.__name__
            if kind == "copy":
                what = rng.choice(["src", "dst"])
                args["src" if what == "dst" else "dst"] = path
        else:
            value = hostile.draw(hostile.bad_metadata(), rng)
            args["expect"] = InvalidArgument.__name__
            if kind != "commit":
                args["path"] = path
        args["hostile"] = {what: repr(value)}
        self.steps.append(Planned(kind, args, None, {what: value}))


def _strategy(rng: random.Random) -> str | None:
    return rng.choice([None, "source-wins", "dest-wins"])


def _metadata(rng: random.Random) -> dict[str, str] | None:
    """User metadata of any valid Unicode in a fifth of the writes and commits."""
    return hostile.draw(hostile.valid_metadata(), rng) if rng.random() < 0.2 else None


class Log:
    """A worker's JSONL log: each record flushed as written, so a SIGKILL loses none."""

    def __init__(self, path: str, worker: int) -> None:
        self.worker = worker
        self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115

    def write(self, record: dict[str, Any]) -> None:
        record = {"w": self.worker, "t": time.monotonic(), "wall": time.time(), **record}
        self.file.write(json.dumps(record, sort_keys=True) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def read_log(path: str) -> list[dict[str, Any]]:
    """The records of one log; a line a kill cut short is dropped."""
    if not os.path.exists(path):
        return []
    records = []
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return records


_LAKES: dict[tuple[str, str], Lake] = {}
"""A worker process's open lakes, one per back end, kept across histories."""


def lake_for(task: Task) -> Lake:
    key = (task.kv_url, json.dumps(task.s3_options, sort_keys=True))
    if key not in _LAKES:
        _LAKES[key] = Lake.connect(task.kv_url, s3_options=task.s3_options, retry=SHORT_COMMIT_WAIT)
    return _LAKES[key]


def run_task(task: Task) -> None:
    """Run the worker's plan, resuming after the last operation its log shows finished."""
    plan = Plan.draw(task)
    done: set[int] = set()
    started: dict[int, dict[str, Any]] = {}
    attempts: dict[int, int] = {}
    for record in read_log(task.log_path):
        k = record["k"]
        if record["event"] == "invoke":
            started.setdefault(k, record)
            attempts[k] = attempts.get(k, 0) + 1
        elif record["status"] != "fault":
            done.add(k)
    repo = lake_for(task).repository(task.repository)
    log = Log(task.log_path, task.worker)
    try:
        for k, step in enumerate(plan.steps):
            if k in done:
                continue
            args = started[k]["args"] if k in started else None
            repo.lake.graveler.refs.clock = FakeClock(task.clock(k))
            Runner(repo, task, log).run(k, step, args, attempts.get(k, 0))
    finally:
        log.close()


class Runner:
    def __init__(self, repo: Repository, task: Task, log: Log) -> None:
        self.repo = repo
        self.task = task
        self.log = log

    def run(self, k: int, step: Planned, args: dict[str, Any] | None, attempt: int) -> None:
        """Attempts until one finishes; the planned failpoint armed on the first only."""
        while True:
            resolved = args if args is not None else self.resolve(k, step)
            args = resolved
            fault = step.fault if attempt == 0 else None
            self.log.write(
                {
                    "event": "invoke",
                    "k": k,
                    "op": step.kind,
                    "args": resolved,
                    "attempt": attempt,
                    "fault": fault,
                }
            )
            try:
                with self.armed(fault):
                    result = self.perform(step.kind, {**resolved, **step.hostile})
            except failpoints.FailpointHit:
                self.log.write({"event": "complete", "k": k, "status": "fault"})
                attempt += 1
                if attempt < MAX_ATTEMPTS:
                    continue
                return
            except REFUSALS as exc:
                self.log.write(
                    {"event": "complete", "k": k, "status": "refused", "error": type(exc).__name__}
                )
            except Exception as exc:  # a finding: logged for the checker, the history goes on
                self.log.write(
                    {
                        "event": "complete",
                        "k": k,
                        "status": "error",
                        "error": f"{type(exc).__name__}: {exc}",
                    }
                )
            else:
                self.log.write({"event": "complete", "k": k, "status": "ok", "result": result})
            return

    @contextmanager
    def armed(self, point: str | None) -> Iterator[None]:
        if point is None:
            yield
            return
        action: Callable[[], None]
        if self.task.fault == "kill":

            def action() -> None:
                os.kill(os.getpid(), signal.SIGKILL)

        else:

            def action() -> None:
                raise failpoints.FailpointHit(f"failpoint {point} fired")

        with failpoints.armed(point, action):
            yield

    def resolve(self, k: int, step: Planned) -> dict[str, Any]:
        """The arguments the state decides, fixed at the first attempt: the commit a revert,
        reset or tag names is the private branch's HEAD then, a restore's source that HEAD's
        parent (HEAD itself at the root) or `main`'s HEAD then, a cherry-pick's `main`'s HEAD
        then (against its first parent, `main` holding merges)."""
        args = dict(step.args)
        own = private(self.task.worker)
        if step.kind in ("write", "create", "link"):
            args["data"] = f"{step.kind} {self.task.seed}:{self.task.worker}:{k}"
        if step.kind in (
            "revert",
            "reset",
            "restore",
            "cherry_pick",
            "tag_create",
            "branch_create",
        ):
            head = self.repo.branch(own).head()
            args["head"] = head.id
            args["parents"] = list(head.parents)
            if step.kind == "cherry_pick":
                picked = self.repo.branch(MAIN).head()
                args["picked"] = picked.id
                args["parent"] = 1 if len(picked.parents) > 1 else None
            if step.kind == "restore" and args["source"] == MAIN:
                args["source"] = self.repo.branch(MAIN).head().id
            elif step.kind == "restore":
                args["source"] = head.parents[0] if head.parents else head.id
        return args

    def perform(self, kind: str, args: dict[str, Any]) -> dict[str, Any]:
        repo = self.repo
        if kind == "read":
            return {"value": content_checksum(repo.branch(args["branch"]).read(args["path"]))}
        if kind == "list":
            return {"tree": {e.path: e.checksum for e in repo.branch(args["branch"]).list()}}
        if kind in ("write", "create"):
            branch = repo.branch(args["branch"])
            data, metadata = args["data"].encode(), args.get("metadata")
            exclusive = kind == "create"
            entry = branch.upload(args["path"], data, metadata=metadata, if_absent=exclusive)
            return {"value": entry.checksum, "metadata": entry.metadata}
        if kind == "delete":
            repo.branch(args["branch"]).delete(args["path"])
            return {"value": None}
        if kind == "copy":
            return {"value": repo.branch(args["branch"]).copy(args["src"], args["dst"]).checksum}
        if kind == "link":
            return self.link(args)
        if kind == "commit":
            branch = repo.branch(args["branch"])
            message, metadata = f"by w{self.task.worker}", args.get("metadata")
            try:
                commit_id: str | None = branch.commit(message, metadata=metadata).id
            except NoChanges:
                commit_id = None
            return {"commit": commit_id, "head": branch.commit_id}
        if kind == "compact":
            return {"outcome": repo.branch(args["branch"]).compact().outcome}
        if kind == "import":
            branch = repo.branch(args["branch"])
            landed = branch.import_objects(self.task.source_uri, prefix=IMPORTED).commit
            return {"commit": landed and landed.id, "head": branch.commit_id}
        if kind == "reset":
            branch = repo.branch(args["branch"])
            back = args["back"] and args["parents"]
            branch.reset(to=args["parents"][0] if back else None)
            return {"head": branch.commit_id}
        if kind == "revert":
            if not args["parents"]:
                raise NoChanges("the root commit has nothing to revert")
            parent = 1 if len(args["parents"]) > 1 else None
            result = repo.revert(args["branch"], args["head"], parent)
            return {"commit": result.commit.id, "attempts": result.attempts}
        if kind == "cherry_pick":
            result = repo.cherry_pick(args["branch"], args["picked"], args["parent"])
            return {"commit": result.commit.id, "attempts": result.attempts}
        if kind == "restore":
            branch = repo.branch(args["branch"])
            return {"staged": branch.restore(args["spec"], source=args["source"])}
        if kind == "merge" and args.get("publish"):
            return self.publish(args)
        if kind in ("merge", "sync"):
            result = repo.merge(args["source"], args["into"], strategy=args["strategy"])
            return {
                "commit": result.commit.id,
                "fast_forward": result.fast_forward,
                "attempts": result.attempts,
            }
        if kind == "branch_create":
            try:
                return {"head": repo.create_branch(args["name"], source=args["head"]).commit_id}
            except AlreadyExists:
                return {"head": repo.branch(args["name"]).commit_id}
        if kind == "branch_delete":
            repo.delete_branch(args["name"])
            return {}
        if kind == "tag_create":
            return {"commit": repo.tag(args["name"], args["head"]).commit_id}
        if kind == "tag_delete":
            repo.delete_tag(args["name"])
            return {}
        if kind == "gc":
            return self.gc()
        if kind == "retention":
            return self.retention()
        raise AssertionError(f"unknown operation {kind}")

    def publish(self, args: dict[str, Any]) -> dict[str, Any]:
        """A merge landed as write-audit-publish does: a preview of the merge commit, then
        `publish`, which moves `main` only if it has not moved since; a preview `main` moved
        past is made again from the last one's work (`hint`), as a caller would."""
        hint = None
        for _ in range(PREVIEWS - 1):
            try:
                return self.preview_and_publish(args, hint)
            except MergeRaceLost as lost:
                hint = lost.hint
        return self.preview_and_publish(args, hint)

    def preview_and_publish(self, args: dict[str, Any], hint: str | None) -> dict[str, Any]:
        source, into, strategy = args["source"], args["into"], args["strategy"]
        preview = self.repo.merge(source, into, strategy=strategy, hint=hint, preview=True)
        result = self.repo.publish(preview.commit.id, into=into)
        return {"commit": result.commit.id, "fast_forward": False, "published": True}

    def link(self, args: dict[str, Any]) -> dict[str, Any]:
        branch = self.repo.branch(args["branch"])
        data = args["data"].encode()
        physical = branch.get_physical_address()
        self.repo.lake.graveler.objects(self.repo.storage_namespace).put(physical.address, data)
        entry = branch.link_physical_address(
            args["path"],
            physical.token,
            size=len(data),
            checksum=content_checksum(data),
            metadata=args.get("metadata"),
        )
        return {"value": entry.checksum, "metadata": entry.metadata}

    def gc(self) -> dict[str, Any]:
        run = self.repo.prepare_uncommitted_for_gc()
        deleted = sweep(self.repo, run, timedelta(seconds=self.task.gc_min_age))
        return {"run": run.run_id, "deleted": len(deleted)}

    def retention(self) -> dict[str, Any]:
        """A GC run with the repository's rules, classifying at the history's end."""
        holder = f"w{self.task.worker}"
        run = retention_run(self.repo, self.task.end(), holder, LEASE, self.task.s3_options)
        return {"run": run.run_id, "deleted": len(run.deleted), "expiring": run.expiring}


def serve(slot: int, tasks: Any, done: Any) -> None:
    """A worker process: run each task the supervisor sends until it sends `None`."""
    while (task := tasks.get()) is not None:
        try:
            run_task(task)
        except BaseException as exc:  # reported to the supervisor, which fails the history
            done.put((slot, f"{type(exc).__name__}: {exc}"))
        else:
            done.put((slot, None))


def log_path(directory: Path, seed: int, worker: int) -> str:
    return str(directory / f"history-{seed}-w{worker}.jsonl")
