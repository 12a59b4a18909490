"""The GC model's branch and the random steps on branches, shared by the prepare model test
(tests/gc) and the Spark job's model test (tests/spark_jobs): plain dictionaries that never
read the lake, and a history that applies each step to the lake and to them alike; then the
GC rule itself and the property every run must keep (`assert_references_intact`).

A branch is HEAD's paths, the staged layer (a path's address, or `None` for a tombstone) and
the compacted state if any. Its uncommitted addresses are the staged ones plus the compacted
ones HEAD lacks. Identity is content: a commit or compaction keeps HEAD's object of a path
whose content HEAD already holds (`settle` on HEAD), whether the branch was compacted or not.
"""

from __future__ import annotations

import contextlib
import random
from collections.abc import Iterator, Mapping, Set
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Generic, TypeVar

from branchwater.engine import CommitExpired, DirtyBranch, NoChanges, NotFound
from branchwater.engine.api import Branch, Repository
from branchwater.engine.gc.addresses import is_data_address, newest_first_time
from branchwater.engine.gc.prepare import PreparedRun
from branchwater.engine.gc.retention.rules import GCRules
from branchwater.engine.gc.runlock import DEFAULT_LEASE
from branchwater.engine.gc.runs.files import RunSummary
from branchwater.engine.gc.runs.retention import (
    EXPIRED_COMMITS,
    RetentionInput,
    expire_before_sweep,
    metaranges_now_held,
    retention_input,
    settle_expiring,
    write_expiring,
)
from branchwater.engine.gc.runs.storage import Namespace
from branchwater.engine.graveler import reads
from branchwater.engine.graveler.checksums import content_checksum
from branchwater.engine.graveler.external import is_external
from branchwater.engine.graveler.model import Entry
from branchwater.engine.graveler.reads import object_location
from branchwater.engine.objects import ObjectInfo
from tests.helpers.gc import FakeClock, compact, data_objects, run_addresses


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


def gc_candidates(repo: Repository, run: PreparedRun, min_age: timedelta) -> set[str]:
    """What a GC run that prepared `run` deletes, by the job's rule and in its reading order:
    the run's uncommitted addresses, then every commit's (read now, after the run), then the
    objects under `data/` modified at or before the cutoff that neither holds. The Spark job
    is tested against this rule in `tests/spark_jobs`; engine tests use it to sweep fast."""
    uncommitted = run_addresses(repo, run)
    committed = committed_addresses(repo)
    cutoff = newest_first_time(run.run_id) - min_age
    old = {key for key, info in data_objects(repo.lake, repo).items() if info.mtime <= cutoff}
    return old - uncommitted - committed


def sweep(repo: Repository, run: PreparedRun, min_age: timedelta = timedelta(0)) -> set[str]:
    """Delete what `gc_candidates` names, as a sweep would; returns it."""
    doomed = gc_candidates(repo, run, min_age)
    repo.lake.graveler.objects(repo.storage_namespace).delete(sorted(doomed))
    return doomed


def committed_addresses(repo: Repository) -> set[str]:
    """Every address any commit holds, reachable or not and expired or not, as the committed
    listing reads."""
    return commit_addresses(repo, set(repo.committed_layout().metaranges))


def referenced_entries(repo: Repository) -> Iterator[tuple[str, Entry]]:
    """(where, entry) of everything a reader can reach: every branch as it shows now, every
    tag, and every commit, reachable or not, that retention has not expired (reading one
    that it has raises `CommitExpired`, which a tag's commit must never do)."""
    for branch in repo.branches():
        for entry in branch.list():
            yield f"branch {branch.name}", entry
    for tag in repo.tags():
        for entry in repo.ref(tag.name).list():
            yield f"tag {tag.name}", entry
    for commit_id in repo.committed_layout().metaranges:
        try:
            ref = repo.ref(commit_id)
        except CommitExpired:
            continue
        for entry in ref.list():
            yield f"commit {commit_id[:12]}", entry


def assert_references_intact(repo: Repository, slow: Set[str] = frozenset()) -> None:
    """Every object a branch or commit references exists and reads with its checksum, but
    one of `slow` writes' (their checksums), which the runs' minimum age does not cover."""
    broken = []
    for where, entry in referenced_entries(repo):
        store, key = object_location(repo.record, entry.address)
        try:
            data = repo.lake.graveler.objects(store).get(key)
        except NotFound:
            if entry.checksum not in slow:
                broken.append(f"{where}: {entry.path} -> {entry.address} is gone")
            continue
        if not _holds(entry, data):
            broken.append(f"{where}: {entry.path} -> {entry.address} reads other content")
    assert broken == [], "\n".join(broken)


def _holds(entry: Entry, data: bytes) -> bool:
    """An imported object's checksum is its ETag: its size is what can be checked."""
    if is_external(entry.address):
        return len(data) == entry.size
    return content_checksum(data) == entry.checksum


def active_commits(repo: Repository, rules: GCRules, now: datetime) -> set[str]:
    """The committed rule, written as a fixpoint over sets from the public API (unlike the
    engine's walk): per branch, HEAD and the parents newer than its cutoff of commits already
    in, and the first commit of its first-parent log not newer than the cutoff; tags'
    commits, `keep_tags` tags' whole logs; commits no ref reaches at all while newer than the
    default retention."""
    commits = {c.id: c for c in repo.lake.graveler.refs.list_commits(repo.record)}
    active: set[str] = set()
    for branch in repo.branches():
        cutoff = now - timedelta(days=rules.retention_days(branch.name))
        kept = {branch.commit_id}
        while True:
            grown = kept | {
                p
                for c in kept
                for p in commits[c].parents
                if p in commits and commits[p].creation_date > cutoff
            }
            if grown == kept:
                break
            kept = grown
        opened = next(
            (c.id for c in repo.log(branch.name, first_parent=True) if c.creation_date <= cutoff),
            None,
        )
        active |= kept | ({opened} if opened else set())
    reached = {c.id for b in repo.branches() for c in repo.log(b.name)}
    for tag in repo.tags():
        logged = {c.id for c in repo.log(tag.name)}
        reached |= logged
        active |= logged if rules.keeps_history(tag.name) else {tag.commit_id}
    default_cutoff = now - timedelta(days=rules.default_retention_days)
    active |= {
        c.id for c in commits.values() if c.id not in reached and c.creation_date > default_cutoff
    }
    return active


def commit_addresses(repo: Repository, commit_ids: set[str]) -> set[str]:
    """Every address the commits' trees hold, read past `CommitExpired` (records stay)."""
    g = repo.lake.graveler
    return {entry.address for c in commit_ids for entry in reads.list_commit(g, repo.record, c)}


def retention_candidates(
    repo: Repository,
    run: PreparedRun,
    min_age: timedelta,
    rules: GCRules,
    now: datetime,
    listed: Mapping[str, ObjectInfo] | None = None,
) -> set[str]:
    """What a run with retention deletes, by the rule: objects under `data/` (`listed`, by
    default listed now) modified at or before the cutoff that neither the run's uncommitted
    addresses nor an active commit hold (every commit's record is read after the run, as
    the job reads them)."""
    uncommitted = run_addresses(repo, run)
    active = commit_addresses(repo, active_commits(repo, rules, now))
    cutoff = newest_first_time(run.run_id) - min_age
    if listed is None:
        listed = data_objects(repo.lake, repo)
    old = {key for key, info in listed.items() if info.mtime <= cutoff}
    return old - uncommitted - active


def assert_retention_holds(
    repo: Repository,
    rules: GCRules,
    now: datetime,
    run: PreparedRun,
    before: set[str],
    deleted: set[str],
) -> None:
    """After a run: every object a branch, a tag or an active commit references exists and
    reads; every object of `before` (the listing before the run) that only expired commits
    held, and no uncommitted entry of `run`, is gone; nothing deleted was outside `data/`."""
    active = active_commits(repo, rules, now)
    objects = repo.lake.graveler.objects(repo.storage_namespace)
    broken = []
    reachable = [(f"branch {b.name}", b) for b in repo.branches()]
    reachable += [(f"tag {t.name}", repo.ref(t.name)) for t in repo.tags()]
    reachable += [(f"commit {c[:12]}", repo.ref(c)) for c in sorted(active)]
    for where, ref in reachable:
        for entry in ref.list():
            try:
                data = objects.get(entry.address)
            except NotFound:
                broken.append(f"{where}: {entry.path} -> {entry.address} is gone")
                continue
            if content_checksum(data) != entry.checksum:
                broken.append(f"{where}: {entry.path} -> {entry.address} reads other content")
    assert broken == []
    every = {c.id for c in repo.lake.graveler.refs.list_commits(repo.record)}
    expired_only = commit_addresses(repo, every - active) - commit_addresses(repo, active)
    expired_only -= run_addresses(repo, run)
    left = set(data_objects(repo.lake, repo))
    assert not (expired_only & before & left), "objects only expired commits held remain"
    assert all(address.startswith("data/") for address in deleted)


@dataclass
class RetentionRun:
    run_id: str
    deleted: set[str]
    expiring: list[str]


def retention_run(
    repo: Repository,
    now: datetime | None = None,
    holder: str = "retention-races",
    lease: timedelta = DEFAULT_LEASE,
    s3_options: Mapping[str, str] | None = None,
) -> RetentionRun:
    """The committed part of a GC run as the Spark job's driver does it, under the
    repository's GC lease (`retention_mark`), its expiring commits re-armed and recorded
    expired before the deletes, as `sweeps.sweep_mark` does (its files written with
    `s3_options` on S3). Returns what it deleted and the commits it recorded expired."""
    g, record = repo.lake.graveler, repo.record
    ns = Namespace.of(repo.storage_namespace, s3_options)
    with repo.lock_gc_run(holder, lease):
        mark = retention_mark(repo, ns, now)
        expire_before_sweep(g, record, ns, mark.summary)
        g.objects(repo.storage_namespace).delete(sorted(mark.candidates))
    return RetentionRun(mark.summary.run_id, mark.candidates, mark.expiring)


@dataclass
class RetentionMark:
    summary: RunSummary
    """Marked, its gate passed, its expiring commits written (`EXPIRED_COMMITS`)."""
    candidates: set[str]
    expiring: list[str]


def retention_mark(repo: Repository, ns: Namespace, now: datetime | None = None) -> RetentionMark:
    """The committed part's mark as the Spark job's driver makes it, with the job's
    anti-joins replaced by the model's address sets, under the caller's GC lease: the
    classes read at `now` (default: the wall clock), the candidates data addresses only
    (an imported object's URI is not the lake's to delete), the re-check, the second
    prepare, the fence settled on the commits still holding a candidate."""
    g, record = repo.lake.graveler, repo.record
    started = datetime.now(UTC)
    plan = retention_input(g, record, now or started)
    assert plan is not None
    prepared = repo.prepare_uncommitted_for_gc()
    run_id = prepared.run_id
    expired = commit_addresses(repo, set(plan.retention.expired))
    candidates = set(filter(is_data_address, expired))
    candidates -= commit_addresses(repo, set(plan.retention.active))
    candidates -= run_addresses(repo, prepared)
    held_now = metaranges_now_held(g, record, plan, run_id, holding(repo, plan, candidates))
    held = {c.id for c in g.refs.list_commits(record) if c.metarange_id in held_now}
    candidates -= commit_addresses(repo, held)
    if candidates:
        candidates -= run_addresses(repo, repo.prepare_uncommitted_for_gc())
    still = holding(repo, plan, candidates)
    expiring = settle_expiring(g, record, plan, held_now, run_id, still)
    summary = marked(repo, run_id, started)
    summary.files[EXPIRED_COMMITS] = write_expiring(ns, run_id, expiring)
    return RetentionMark(summary, candidates, expiring)


def holding(repo: Repository, plan: RetentionInput, candidates: set[str]) -> set[str]:
    """The expired commits whose trees hold a candidate (the driver's `commits_holding`,
    by address rather than by range)."""
    expired = plan.retention.expired
    return {c for c in expired if not commit_addresses(repo, {c}).isdisjoint(candidates)}


def marked(repo: Repository, run_id: str, started: datetime) -> RunSummary:
    at = started.isoformat()
    return RunSummary(
        run_id, repo.name, repo.record.unique_id, repo.storage_namespace, "clean", "clean",
        False, at, at, at, 0.0, 0.0, gate_success=True,
    )  # fmt: skip


class RetentionHistory:
    """Random histories with commit dates spread over months: uploads, deletes, commits,
    branches created from branches or old commits, resets to old commits, deletes of
    branches, tags on old commits and merges, each a few days after the last (the repository's
    commit clock is `clock`). The committed rule needs no branch model: its oracle reads
    the lake's refs (`active_commits`).

    A seed plays the same history on every run: old commits are drawn from the commits in
    the order the history made them, not by id (an id hashes the tree, whose addresses are
    random, so the order of ids is new on every run)."""

    def __init__(self, repo: Repository, seed: int, clock: FakeClock) -> None:
        self.repo = repo
        self.random = random.Random(seed)
        self.clock = clock
        repo.lake.graveler.refs.clock = clock
        self.created = 0
        self.made: list[str] = []
        self._note_new_commits()

    def play(self, steps: int) -> None:
        actions = [self.upload] * 6 + [self.delete, self.commit, self.commit, self.commit]
        actions += [self.create, self.reset_to_old, self.drop, self.tag, self.merge]
        for _ in range(steps):
            self.clock.advance(timedelta(hours=self.random.randint(0, 24 * 6)))
            self.random.choice(actions)()
            self._note_new_commits()

    def _note_new_commits(self) -> None:
        """Append the commits the last step made (at most a merge and the commit before it,
        told apart by generation and message) to `made`."""
        known = set(self.made)
        commits = self.repo.lake.graveler.refs.list_commits(self.repo.record)
        new = [c for c in commits if c.id not in known]
        self.made += [c.id for c in sorted(new, key=lambda c: (c.generation, c.message))]

    def _branch(self) -> Branch:
        return self.random.choice(self.repo.branches())

    def _old_commit(self) -> str:
        return self.random.choice(self.made)

    def upload(self) -> None:
        path = f"t/{self.random.randint(0, 12)}"
        self._branch().upload(path, f"v{self.random.randint(0, 40)}".encode())

    def delete(self) -> None:
        branch = self._branch()
        paths = [e.path for e in branch.list()]
        if paths:
            branch.delete(self.random.choice(paths))

    def commit(self) -> None:
        with contextlib.suppress(NoChanges):
            self._branch().commit("step")

    def create(self) -> None:
        self.created += 1
        source = self._branch().name if self.random.random() < 0.6 else self._old_commit()
        self.repo.create_branch(f"b{self.created}", source=source)

    def reset_to_old(self) -> None:
        self._branch().reset(to=self._old_commit())

    def drop(self) -> None:
        branch = self._branch()
        if branch.name != "main":
            self.repo.delete_branch(branch.name)

    def tag(self) -> None:
        self.created += 1
        name = f"{self.random.choice(['v', 'nightly-'])}{self.created}"
        self.repo.tag(name, self._old_commit())

    def merge(self) -> None:
        source, into = self._branch(), self._branch()
        if source.name == into.name:
            return
        with contextlib.suppress(NoChanges):
            into.commit("before merge")
        with contextlib.suppress(NoChanges, DirtyBranch):
            self.repo.merge(source.name, into.name, strategy="source-wins")
