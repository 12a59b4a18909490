"""The public Python API: `Lake` → `Repository` → `Branch` / `Ref`.

Thin handles over the graveler operations; every handle re-reads what it needs from the KV
store, so handles are cheap and never stale. The names here are a contract (README.md and
docs/architecture.md document them).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import BinaryIO

from branchwater.engine.allocator import settle_arrow_allocator
from branchwater.engine.errors import InvalidArgument
from branchwater.engine.gc import copies, links
from branchwater.engine.gc.context import GCContext
from branchwater.engine.gc.inputs import (
    CommittedLayout,
    UncommittedRun,
    committed_layout,
    uncommitted_run,
)
from branchwater.engine.gc.prepare import PreparedRun, prepare_uncommitted_for_gc
from branchwater.engine.gc.provenance import Provenance, provenance
from branchwater.engine.gc.retention import rules as retention_rules
from branchwater.engine.gc.retention.expired import check_live
from branchwater.engine.gc.retention.expiry import Retention, repository_retention
from branchwater.engine.gc.retention.rules import GCRules
from branchwater.engine.gc.runlock import (
    DEFAULT_LEASE,
    GCRunLease,
    acquire_run_lease,
    refuse_while_running,
)
from branchwater.engine.gc.settings import LONGEST, GCSettings
from branchwater.engine.gc.tokens import PhysicalAddress
from branchwater.engine.graveler import branches as branch_ops
from branchwater.engine.graveler import checks as check_ops
from branchwater.engine.graveler import commit as commit_ops
from branchwater.engine.graveler import (
    compaction,
    history,
    imports,
    picks,
    protection,
    reads,
    repositories,
    transactions,
    writes,
)
from branchwater.engine.graveler import merge as merge_ops
from branchwater.engine.graveler import publish as publish_ops
from branchwater.engine.graveler import restore as restore_ops
from branchwater.engine.graveler import tags as tag_ops
from branchwater.engine.graveler.checks import CheckResult
from branchwater.engine.graveler.committed import (
    DEFAULT_MAX_BYTES,
    RangeCache,
    RangePolicy,
    default_cache_dir,
)
from branchwater.engine.graveler.compaction import (
    CompactionPolicy,
    CompactionResult,
    CompactionStatus,
)
from branchwater.engine.graveler.graveler import Graveler, RetryPolicy, S3Options, check_seconds
from branchwater.engine.graveler.imports import ImportResult
from branchwater.engine.graveler.merge import MergeResult
from branchwater.engine.graveler.metrics import CompactionMetrics
from branchwater.engine.graveler.model import (
    Change,
    Commit,
    Entry,
    RepositoryRecord,
    Tag,
    check_flag,
    check_metadata,
)
from branchwater.engine.graveler.names import check_new_path, check_path
from branchwater.engine.graveler.protection import ProtectionChange, ProtectionRule
from branchwater.engine.graveler.uploads import Upload, UploadSource
from branchwater.engine.kv import open_store
from branchwater.engine.objects.store import check_moment

DEFAULT_KV_URL = "sqlite:///.branchwater/lake.db"


class Lake:
    """A connection to one lake: a KV store plus the object stores its repositories name."""

    def __init__(self, graveler: Graveler, gc: GCSettings | None = None) -> None:
        self.graveler = graveler
        self.gc = GCContext(graveler.kv, gc)
        self.addresses = self.gc.addresses

    @classmethod
    def connect(
        cls,
        kv_url: str = DEFAULT_KV_URL,
        *,
        s3_options: S3Options | Callable[[], S3Options] | None = None,
        range_policy: RangePolicy | None = None,
        retry: RetryPolicy | None = None,
        branch_cache_ttl: float = 0.5,
        range_cache_dir: str | Path | None = None,
        range_cache_bytes: int = DEFAULT_MAX_BYTES,
        gc: GCSettings | None = None,
        create: bool = True,
    ) -> Lake:
        """Open a lake, starting it where its KV store holds none (a new SQLite file, a new
        PostgreSQL or DynamoDB table); `create=False` opens only a lake that is there and
        raises `LakeNotFound` (nothing created) where none is, so a mistyped URL is not
        taken for a new, empty lake. Verified ranges are shared with the machine's other
        processes through a cache in `range_cache_dir` (default: `$BRANCHWATER_CACHE_DIR`,
        else the user's cache directory), trimmed to `range_cache_bytes`; 0 bytes, or an
        empty `$BRANCHWATER_CACHE_DIR`, turns it off. `gc` sets link-token expiry,
        copy-record lifetime and prepare's file size. `s3_options` may be a function
        returning them, called when the first S3 namespace is opened (never, on a lake of
        local ones). Arrow's default pool becomes one that keeps freed pages (`allocator`).
        An option of the wrong kind is refused at the call (S3 options given as a function:
        when it is called), naming the option, never a secret's value."""
        if range_cache_dir is not None:
            _local_path(range_cache_dir, "range_cache_dir")
        _check_kind("range_policy", range_policy, RangePolicy)
        _check_kind("retry", retry, RetryPolicy)
        _check_kind("gc", gc, GCSettings)
        settle_arrow_allocator()
        directory = Path(range_cache_dir) if range_cache_dir else default_cache_dir()
        cache = None
        if directory is not None and range_cache_bytes:
            cache = RangeCache(directory, range_cache_bytes)
        store = open_store(kv_url, create=create)
        try:
            graveler = Graveler(
                store,
                object_store_options=s3_options,
                range_policy=range_policy,
                range_cache=cache,
                retry=retry,
                branch_cache_ttl=branch_cache_ttl,
            )
        except BaseException:
            store.close()
            raise
        return cls(graveler, gc)

    def create_repository(
        self, name: str, storage_namespace: str, default_branch: str = "main"
    ) -> Repository:
        record = repositories.create_repository(
            self.graveler, name, storage_namespace, default_branch
        )
        return Repository(self, record)

    def repository(self, name: str) -> Repository:
        return Repository(self, self.graveler.refs.get_repository(name))

    def repositories(self) -> list[Repository]:
        return [Repository(self, r) for r in self.graveler.refs.list_repositories()]

    def delete_repository(self, name: str) -> None:
        repositories.delete_repository(self.graveler, name)

    @property
    def metrics(self) -> CompactionMetrics:
        """This lake's Prometheus metrics; serve `lake.metrics.registry` to expose them."""
        return self.graveler.metrics

    def wait_for_cleanup(self, timeout: float | None = None) -> bool:
        """Wait until the staging tokens that commits let go of are dropped (in the
        background, so a commit returns first; `close()` waits too). False if some still
        are after `timeout` seconds."""
        if timeout is not None:
            check_seconds("timeout", timeout)
        return self.graveler.wait_for_background(timeout)

    def close(self) -> None:
        """Wait for background cleanup and release connections, for good, as a file's close:
        what a lake opens lazily (KV connections, threads, object stores and their clients)
        refuses to open again, so a later call, or one under way on another thread, raises
        `LakeClosed` rather than leave something open. Closing again does nothing new."""
        self.gc.close()
        self.graveler.close()

    def __enter__(self) -> Lake:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class Repository:
    def __init__(self, lake: Lake, record: RepositoryRecord) -> None:
        self.lake = lake
        self.record = record

    @property
    def name(self) -> str:
        return self.record.name

    @property
    def storage_namespace(self) -> str:
        return self.record.storage_namespace

    @property
    def default_branch(self) -> str:
        return self.record.default_branch

    def __repr__(self) -> str:
        return f"Repository({self.name!r}, storage_namespace={self.storage_namespace!r})"

    @property
    def _g(self) -> Graveler:
        return self.lake.graveler

    def create_branch(self, name: str, source: str | None = None) -> Branch:
        source = self.default_branch if source is None else source
        self._live(source)
        branch_ops.create_branch(self._g, self.record, name, source)
        return Branch(self, name)

    def branch(self, name: str) -> Branch:
        self._g.refs.get_branch(self.record, name)
        return Branch(self, name)

    def branches(self, *, after: str = "", limit: int | None = None) -> list[Branch]:
        """The branches by name: all of them, or a page of at most `limit` named after
        `after` (the last name of the page before)."""
        records = self._g.refs.branches(self.record, after)
        return [Branch(self, b.name) for b in history.bounded(records, limit, "limit", "branches")]

    def delete_branch(self, name: str) -> None:
        branch_ops.delete_branch(self._g, self.record, name)

    def ref(self, ref: str) -> Ref:
        """Any branch, tag, commit id (full or abbreviated) or `ref~N`, read-only at its commit;
        `CommitExpired` when GC retention deleted that commit's objects."""
        return Ref(self, ref, self._live(ref))

    def _live(self, ref: str) -> str:
        """The commit `ref` names, unless retention deleted its objects (`CommitExpired`): a
        branch's HEAD is never expired, so only other refs cost the extra read."""
        resolved = self._g.refs.resolve(self.record, ref)
        if resolved.branch is not None:
            return resolved.commit_id
        return check_live(self._g.kv, self.record, resolved.commit_id)

    def commit(self, commit_id: str) -> Commit:
        return self._g.refs.get_commit(
            self.record, self._g.refs.resolve(self.record, commit_id).commit_id
        )

    def log(
        self,
        ref: str,
        *,
        first_parent: bool = False,
        limit: int | None = None,
        after: str | None = None,
        where: Mapping[str, str] | None = None,
        paths: Sequence[str] | None = None,
        depth: int | None = None,
    ) -> Iterator[Commit]:
        """Commits reachable from `ref`, newest first, streamed: each commit is read as the
        iterator reaches it, so the first match costs only the walk to it (`list(...)` for
        all of them). `after` (a commit id) pages on.

        `where` keeps the commits whose metadata has every key with that value
        (`{"airflow.dag_id": "daily_orders"}`), `paths` those that change a path starting
        with one of them against their first parent (`["orders/"]`); the walk stops at the
        `limit`-th match. `depth` bounds the walk itself: only the newest `depth` commits are
        looked at, so a search that finds nothing stays cheap on a long history. The ref and
        every argument are checked when called, before anything is iterated.
        """
        check_flag("first_parent", first_parent)
        start = self._g.refs.resolve(self.record, ref).commit_id
        return history.filtered_log(
            self._g.refs,
            self._g.committed(self.record) if paths is not None else None,
            self.record,
            start,
            history.LogFilter(first_parent, limit, after, where, paths, depth),
        )

    def diff(self, left: str, right: str) -> Iterator[Change]:
        """Changes that turn `left`'s commit into `right`'s, whole equal ranges skipped."""
        left_mr = self.commit(left).metarange_id
        right_mr = self.commit(right).metarange_id
        return self._g.committed(self.record).diff(left_mr, right_mr)

    def merge(
        self,
        source: str,
        into: str,
        strategy: str | None = None,
        *,
        message: str | None = None,
        metadata: Mapping[str, str] | None = None,
        committer: str = "",
        hint: str | None = None,
        fast_forward: bool = True,
        preview: bool = False,
    ) -> MergeResult:
        """Merge a ref into a branch, retrying lost races on the work already done.

        `strategy` resolves conflicts (`source-wins` or `dest-wins`); without it a conflict
        raises `MergeConflict` listing the paths. After every attempt lost its race,
        `MergeRaceLost.hint` can be passed back as `hint` to resume from that work. A
        destination that has not moved since the source branched is fast-forwarded (no
        commit, `message` and `metadata` unused) unless `fast_forward=False`, which always
        writes a merge commit.

        `preview=True` builds that merge commit (always one, never a fast-forward) on the
        destination's HEAD without moving the destination: it is readable by its id, checks
        can be recorded on it, and `publish` lands it if the destination has not moved.
        """
        check_flag("fast_forward", fast_forward)
        check_flag("preview", preview)
        return merge_ops.merge(
            self._g,
            self.record,
            source,
            into,
            strategy=strategy,
            message=message,
            metadata=check_metadata(metadata),
            committer=committer,
            hint=hint,
            fast_forward=fast_forward,
            preview=preview,
        )

    def publish(self, commit_id: str, into: str) -> MergeResult:
        """Move the branch `into` to a merge preview (`merge(..., preview=True)`'s commit),
        only if its HEAD is still the one the preview was built on: otherwise nothing changes
        and `MergeRaceLost` says to preview again (its `hint` reuses the preview's work). A
        branch already at the preview is left as it is, so publishing twice is safe."""
        return publish_ops.publish(self._g, self.record, commit_id, into)

    def revert(
        self,
        branch: str,
        commit: str,
        parent: int | None = None,
        *,
        message: str | None = None,
        metadata: Mapping[str, str] | None = None,
        committer: str = "",
        allow_dirty: bool = False,
    ) -> MergeResult:
        """A new commit on `branch` undoing what `commit` (any ref) changed against its
        parent, merged three-way onto HEAD like a merge (and retried like one), so later
        changes to other paths survive; `MergeConflict` lists the paths HEAD changed since.
        A merge commit needs `parent` (1 or 2, git's `-m`). The commit records
        `branchwater.revert` (the reverted id); `NoChanges` if there is nothing to undo.
        A branch with uncommitted changes raises `DirtyBranch` unless `allow_dirty`, which
        keeps them staged above the new commit (where they touch a reverted path, they win)."""
        check_flag("allow_dirty", allow_dirty)
        return picks.pick(
            self._g,
            self.record,
            "revert",
            branch,
            commit,
            parent=parent,
            message=message,
            metadata=check_metadata(metadata),
            committer=committer,
            allow_dirty=allow_dirty,
        )

    def cherry_pick(
        self,
        branch: str,
        commit: str,
        parent: int | None = None,
        *,
        message: str | None = None,
        metadata: Mapping[str, str] | None = None,
        committer: str = "",
        allow_dirty: bool = False,
    ) -> MergeResult:
        """A new commit on `branch` applying what `commit` changed against its parent, as
        `revert` undoes it (same arguments and errors); records `branchwater.cherry_pick`."""
        check_flag("allow_dirty", allow_dirty)
        return picks.pick(
            self._g,
            self.record,
            "cherry-pick",
            branch,
            commit,
            parent=parent,
            message=message,
            metadata=check_metadata(metadata),
            committer=committer,
            allow_dirty=allow_dirty,
        )

    def protect(
        self,
        pattern: str,
        *,
        no_direct_writes: bool = False,
        required_checks: Sequence[str] = (),
        no_delete: bool = False,
        no_reset: bool = False,
        by: str = "",
    ) -> ProtectionRule:
        """Protect the branches `pattern` names (a branch name, or a glob: `*` within one
        `/`-separated part, `**` across them, `?` one character), replacing the pattern's
        rule if it has one. Every write path then refuses what the rule forbids with
        `BranchProtected` naming the rule, in every process, from the moment this returns
        (the rules travel in each branch's record, read under its compare-and-swap).
        `required_checks`: merges into the branch need each check recorded as passed on the
        commit merged, else `ChecksMissing`. The change is logged with `by` (default: the
        OS user, at most 96 KiB) and the time: `protection_log()`. Running it again finishes
        a protect that was killed midway (listed meanwhile with `pending=True`), as does any
        later rule change."""
        rule = ProtectionRule.checked(
            pattern,
            no_direct_writes=no_direct_writes,
            required_checks=required_checks,
            no_delete=no_delete,
            no_reset=no_reset,
        )
        protection.protect(self._g, self.record, rule, by)
        return rule

    def protections(self) -> list[ProtectionRule]:
        """The protection rules, by pattern. A rule whose `pending` is True is not yet
        enforced on every branch that existed before it (its `protect` was killed midway):
        run `protect` again (any rule change finishes it too)."""
        return list(protection.read_book(self._g.kv, self.record)[0].listed)

    def unprotect(self, pattern: str, *, by: str = "") -> None:
        """Remove `pattern`'s rule (logged like `protect`); `NotFound` if it has none.
        Running it again finishes an unprotect that was killed midway."""
        protection.unprotect(self._g, self.record, pattern, by)

    def pending_unprotects(self) -> list[str]:
        """Patterns whose rule was removed but may still be enforced on branches that
        existed before (an `unprotect` killed midway): run `unprotect` again."""
        return list(protection.read_book(self._g.kv, self.record)[0].removals_pending)

    def protection_log(self) -> list[ProtectionChange]:
        """Every change of the protection rules, oldest first: who, when, what."""
        return list(protection.log_entries(self._g, self.record))

    def record_check(
        self,
        commit_id: str,
        name: str,
        passed: bool,
        details: Mapping[str, object] | None = None,
        *,
        by: str = "",
    ) -> CheckResult:
        """Record check `name` (a validation, a review) on a commit (any ref resolves to
        one), with `details`: a JSON object of at most 16 KiB (figures, a link). Immutable:
        recording a different result again raises `AlreadyExists`; the same result returns
        the stored one, so a retried task succeeds. Merges into a branch whose rules
        require the check pass only if the commit merged carries it as passed; publishing a
        merge preview, the preview's own result decides, and its source's counts only where
        the preview has none."""
        return check_ops.record_check(self._g, self.record, commit_id, name, passed, details, by)

    def checks(self, commit_id: str) -> list[CheckResult]:
        """The checks recorded on a commit (any ref resolves to one), by name."""
        return check_ops.checks(self._g, self.record, commit_id)

    def merge_base(self, left: str, right: str) -> Commit:
        """The commit a merge of `left` and `right` would start from."""
        left_id = self._g.refs.resolve(self.record, left).commit_id
        right_id = self._g.refs.resolve(self.record, right).commit_id
        return history.find_merge_base(self._g.refs, self.record, left_id, right_id)

    def tag(self, name: str, ref: str) -> Tag:
        """Tag the commit `ref` resolves to; a tag or a branch of that name is `AlreadyExists`."""
        return tag_ops.create_tag(self._g, self.record, name, ref)

    def tags(self, *, after: str = "", limit: int | None = None) -> list[Tag]:
        """The tags by name: all of them, or a page, as `branches`."""
        tags = self._g.refs.list_tags(self.record, after)
        return list(history.bounded(tags, limit, "limit", "tags"))

    def delete_tag(self, name: str) -> None:
        self._g.refs.remove_tag(self.record, name)

    def prepare_uncommitted_for_gc(
        self,
        run_id: str | None = None,
        *,
        progress: commit_ops.Progress | None = None,
        started: Callable[[str], None] | None = None,
    ) -> PreparedRun:
        """Write every branch's uncommitted addresses, then the copy records, as Parquet for
        GC; returns (run_id, location). Passing the `run_id` of an interrupted run resumes it.
        `progress(n)` is called as entries are written, with how many so far; `started(id)`
        once a new run has its id, before it scans (keep it to resume the run if stopped)."""
        _check_progress(progress)
        _check_progress(started, "started", "the run's id")
        return prepare_uncommitted_for_gc(
            self._g, self.lake.gc, self.record, run_id, progress, started
        )

    def compaction_status(self, policy: CompactionPolicy | None = None) -> list[CompactionStatus]:
        """Every branch's compaction figures and verdict (see `Branch.compaction_status`)."""
        return compaction.repository_status(self._g, self.record, policy)

    def dump_refs(self, path: str | Path) -> int:
        """Write commits, branches and tags as JSON; returns the number of records written."""
        from branchwater.engine.graveler.dump import dump_refs

        return dump_refs(self._g, self.record, _local_path(path, "dump_refs"))

    def restore_refs(self, path: str | Path) -> int:
        """Load a dump into this repository, which must still be bare (only its first commit);
        a damaged or incomplete dump raises `CorruptedData` and restores nothing. A restore
        stopped part-way is finished by running it again with the same dump. Refused
        (`GCRunLocked`) while a GC run holds the repository; a GC mark made before a
        restore ended is not swept (`StaleGCMark`): its commits name objects the mark took
        for garbage."""
        from branchwater.engine.graveler.dump import restore_refs

        def no_gc_run() -> None:
            refuse_while_running(self._g.kv, self.record, self.lake.gc.clock)

        return restore_refs(self._g, self.record, _local_path(path, "restore_refs"), no_gc_run)

    def committed_layout(self) -> CommittedLayout:
        """Every commit's metarange and where the Parquet files are, for a GC job that reads
        committed addresses straight from storage."""
        return committed_layout(self._g, self.record)

    def set_gc_rules(self, rules: Mapping[str, object] | str | GCRules) -> GCRules:
        """Store the repository's retention rules (lakeFS's JSON shape: `default_retention_days`,
        `branches: [{branch_id, retention_days}]`, plus an optional `keep_tags` pattern; a
        `branch_id` may be a glob), replacing any; `InvalidGCRules` stores nothing. GC then
        also deletes objects only expired commits hold (docs/gc.md)."""
        return retention_rules.set_rules(self._g.kv, self.record, rules)

    def gc_rules(self) -> GCRules | None:
        """The repository's retention rules; `None` when it has none (every commit is kept)."""
        return retention_rules.get_rules(self._g.kv, self.record)

    def delete_gc_rules(self) -> None:
        """Drop the retention rules: GC keeps every commit's objects again."""
        retention_rules.delete_rules(self._g.kv, self.record)

    def retention(self, now: datetime | None = None) -> Retention | None:
        """Every commit, active or expired under the rules at `now` (a timezone-aware
        datetime; default: the GC clock's time); `None` without rules.
        `engine/gc/retention/expiry.py` states the rule."""
        if now is not None:
            check_moment(now, "now", within=LONGEST)
        rules = self.gc_rules()
        if rules is None:
            return None
        at = self.lake.gc.clock() if now is None else now
        return repository_retention(self._g, self.record, rules, at)

    def lock_gc_run(self, holder: str, ttl: timedelta = DEFAULT_LEASE) -> GCRunLease:
        """Take the repository's GC run lease (`with` renews it meanwhile and releases it);
        raises `GCRunLocked` naming the holder of a live one. A crashed holder's lease
        expires after `ttl`."""
        return acquire_run_lease(self._g.kv, self.record, self.lake.gc.clock, holder, ttl)

    def uncommitted_gc_run(self, run_id: str) -> UncommittedRun:
        """A finished `prepare_uncommitted_for_gc` run: its start, files and time limits."""
        return uncommitted_run(
            self._g.objects(self.storage_namespace), run_id, self.record.unique_id
        )

    def provenance(self, address: str) -> list[Provenance]:
        """The shallow copies and links GC's records remember for `address`, oldest first."""
        return provenance(self.lake.gc, self.record, address)


class Ref:
    """A read-only view of one commit, reached through any ref name."""

    def __init__(self, repository: Repository, name: str, commit_id: str) -> None:
        self.repository = repository
        self.name = name
        self._commit_id = commit_id

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.repository.name!r}, {self.name!r})"

    @property
    def commit_id(self) -> str:
        return self._commit_id

    @property
    def _g(self) -> Graveler:
        return self.repository.lake.graveler

    @property
    def _record(self) -> RepositoryRecord:
        return self.repository.record

    def head(self) -> Commit:
        return self._g.refs.get_commit(self._record, self.commit_id)

    def stat(self, path: str) -> Entry:
        return reads.get_commit_entry(
            self._g, self._record, self.commit_id, check_path(path), self.name
        )

    def read(self, path: str, *, verify: bool = True) -> bytes:
        """The object's bytes, checked against its entry: the size, and the checksum where
        it can be recomputed (`CorruptedData` naming path and address if they differ).
        `verify=False` returns what storage holds, unchecked."""
        check_flag("verify", verify)
        entry = self.stat(path)
        return reads.read_object(
            self._g, self._record, entry, verify, ref=self.name, commit_id=self._commit_id or None
        )

    def open(self, path: str, *, verify: bool = True) -> BinaryIO:
        """A readable, seekable file object over the object, in bounded memory; reads fetch
        only what they ask (ranged GETs on S3). With `verify`, the size is checked now and
        the checksum once the reads have covered the object to its end (`CorruptedData`
        naming path and address), as `read` checks its bytes."""
        check_flag("verify", verify)
        entry = self.stat(path)
        return reads.open_object(
            self._g, self._record, entry, verify, ref=self.name, commit_id=self._commit_id or None
        )

    def list(self, prefix: str = "", after: str = "") -> Iterator[Entry]:
        prefix, after = _listing_bounds(prefix, after)
        return reads.list_commit(self._g, self._record, self.commit_id, prefix, after)


class Branch(Ref):
    """A branch: reads see uncommitted changes; writes stage them."""

    def __init__(self, repository: Repository, name: str) -> None:
        super().__init__(repository, name, "")

    def head(self) -> Commit:
        branch = self._g.read_branch(self._record, self.name)
        return self._g.refs.get_commit(self._record, branch.commit_id)

    @property
    def commit_id(self) -> str:
        """A branch's HEAD, read live: branch handles never go stale."""
        return self._g.read_branch(self._record, self.name).commit_id

    def stat(self, path: str) -> Entry:
        return reads.get_branch_entry(self._g, self._record, self.name, check_path(path))

    def list(self, prefix: str = "", after: str = "") -> Iterator[Entry]:
        prefix, after = _listing_bounds(prefix, after)
        return reads.list_branch(self._g, self._record, self.name, prefix, after)

    def upload(
        self,
        path: str,
        data: UploadSource,
        metadata: Mapping[str, str] | None = None,
        *,
        if_absent: bool = False,
    ) -> Entry:
        """Write `data` to a fresh address in the namespace, then stage it at `path`.

        `data` is bytes, a local file's path (`str` or `Path`) or a binary file object (read
        from where it stands to its end); a file streams in bounded memory (multipart on
        S3), its SHA-256 computed on the way. Content the branch already shows at `path`
        (same bytes, same metadata) is neither written nor staged: its entry is returned, so
        a retried task changes nothing. Content is hashed while it is written, in one pass;
        only a seekable file the branch may already show (an entry at `path` of its size and
        metadata: a retry, most likely) is hashed first, so that a retry writes nothing at
        all. A stream is written, and the new object deleted if the branch turns out to show
        its content. Path, metadata and the type of
        `data` are checked before anything is written. The object is written before it is
        staged, so until then it is younger than any GC cutoff (the "upload" row of GC's
        promises in docs/design/gc.md).

        `if_absent=True` is an exclusive creation (S3's `If-None-Match: *`): `PathExists`
        (an `AlreadyExists` and a `FileExistsError`) if the branch shows anything at `path`,
        found before the object is written or once it is (then the object is deleted); of
        concurrent creations of one path exactly one succeeds, and a retry of the one that
        did is refused too.
        """
        check_new_path(path)
        meta = check_metadata(metadata)
        check_flag("if_absent", if_absent)
        upload = Upload(
            self._g,
            self._record,
            self.name,
            path,
            meta,
            self.repository.lake.addresses.next_address,
            exclusive=if_absent,
        )
        return upload.run(data)

    def upload_file(
        self,
        path: str,
        local_path: str | os.PathLike[str],
        metadata: Mapping[str, str] | None = None,
        *,
        if_absent: bool = False,
    ) -> Entry:
        """`upload` of a local file by its path, streamed (multipart on S3) in bounded memory;
        anything but a path (bytes, a file object) is `InvalidArgument`, so content is never
        taken for a file name or the reverse."""
        path_of = _local_path(
            local_path, "upload_file", "; use upload() for bytes or a file object"
        )
        return self.upload(path, path_of, metadata, if_absent=if_absent)

    def import_objects(
        self,
        source_uri: str,
        prefix: str = "",
        commit_message: str | None = None,
        *,
        metadata: Mapping[str, str] | None = None,
        committer: str = "",
        progress: Callable[[int], None] | None = None,
    ) -> ImportResult:
        """Import every object under `source_uri` (`s3://bucket/prefix/` or
        `file:///dir/`, outside every repository's namespace) without copying it: each
        becomes the entry `prefix` + its key below the source, pointing at the object where
        it is, all in one commit on this branch. Uncommitted changes stay staged above it.
        `progress(n)` is called after each batch with the objects listed so far. Running it
        again converges: unchanged objects are no change (`commit` is then None). Reads go
        to the source; GC never deletes it (docs/python.md, "Importing objects")."""
        _check_progress(progress)
        return imports.import_objects(
            self._g,
            self._record,
            self.name,
            source_uri,
            prefix,
            message=commit_message,
            metadata=metadata,
            committer=committer,
            progress=progress,
        )

    @contextmanager
    def transaction(
        self,
        message: str = transactions.DEFAULT_MESSAGE,
        metadata: Mapping[str, str] | None = None,
        *,
        committer: str = "",
    ) -> Iterator[Transaction]:
        """`with main.transaction("Load orders") as tx:` writes through `tx` (a `Branch` on
        `tx/<hex>`, made from this branch's HEAD) and, when the block ends normally, lands
        them on this branch as one commit (`tx.landed`; None if they change nothing); an
        exception in the block lands nothing and deletes `tx`'s branch. Commits others land
        meanwhile are merged with, changes staged here stay staged above it, and a path
        both changed differently raises `MergeConflict` with nothing landed. Message,
        metadata and protection are checked before anything is written. Crashes, GC and
        retries: `graveler/transactions.py`."""
        started = transactions.begin(self._g, self._record, self.name, message, metadata, committer)
        tx = Transaction(self.repository, started)
        try:
            yield tx
        except BaseException:
            transactions.abort(self._g, started)
            raise
        tx.landed = transactions.land(self._g, started)

    def delete(self, path: str) -> None:
        writes.stage_delete(self._g, self._record, self.name, check_path(path))

    def uncommitted(self) -> Iterator[Change]:
        return reads.uncommitted_changes(self._g, self._record, self.name)

    def commit(
        self,
        message: str,
        metadata: Mapping[str, str] | None = None,
        *,
        committer: str = "",
        allow_empty: bool = False,
        progress: commit_ops.Progress | None = None,
    ) -> Commit:
        """Commit everything staged. `progress(n)` is called as the staged entries are
        applied, every `commit.PROGRESS_EVERY` and at the end, with how many so far.

        `NoChanges` when nothing is staged; its subclass `AlreadyRecorded` when a concurrent
        commit on the branch recorded what was staged (its `commit_id` holds it)."""
        if not isinstance(message, str) or not message.strip():
            raise InvalidArgument("a commit needs a non-empty message")
        check_flag("allow_empty", allow_empty)
        _check_progress(progress)
        return commit_ops.commit(
            self._g,
            self._record,
            self.name,
            message,
            metadata,
            committer=committer,
            allow_empty=allow_empty,
            progress=progress,
        )

    def reset(self, to: str | None = None) -> None:
        """Drop every uncommitted change. With `to` (any ref; a branch means its HEAD), also
        point the branch at that commit, in one step, as `git reset --hard`: the commit it
        leaves is not recorded anywhere else but stays readable by its id."""
        if to is not None:
            self.repository._live(to)
        branch_ops.reset_branch(self._g, self._record, self.name, to)

    def restore(self, paths: str | Sequence[str], source: str, *, every_path: bool = False) -> int:
        """Stage `source`'s (any ref's) version of `paths`, as `git restore --source`: each
        path with everything under it as a folder (`orders` is `orders` and `orders/…`; a
        name ending in `/` is a prefix), a path `source` lacks becoming a delete. Returns how
        many paths it staged; those the branch already shows as `source` has them are left.
        Every path of the branch is restored only when asked, with no paths and
        `every_path=True`: an empty path is refused."""
        return restore_ops.restore(self._g, self._record, self.name, paths, source, every_path)

    def get_physical_address(self) -> PhysicalAddress:
        """An address to write an object to (with Spark, aws cli, ...) and the token that lets
        `link_physical_address` stage it; the token expires and is single-use."""
        return links.get_physical_address(self._g, self._gc, self._record, self.name)

    def link_physical_address(
        self,
        path: str,
        token: str,
        *,
        size: int,
        checksum: str,
        metadata: Mapping[str, str] | None = None,
        address: str | None = None,
    ) -> Entry:
        """Stage the object written at a `get_physical_address` address as `path`."""
        return links.link_physical_address(
            self._g,
            self._gc,
            self._record,
            self.name,
            check_new_path(path),
            token,
            size=size,
            checksum=checksum,
            metadata=metadata,
            address=address,
        )

    def copy(self, src: str, dst: str) -> Entry:
        """Copy `src` to `dst`: shallow (and tracked for GC) when `src` is uncommitted."""
        return copies.copy_entry(
            self._g, self._gc, self._record, self.name, check_path(src), check_new_path(dst)
        )

    @property
    def _gc(self) -> GCContext:
        return self.repository.lake.gc

    def compaction_status(self, policy: CompactionPolicy | None = None) -> CompactionStatus:
        """What staging compaction would be decided on (staged tombstones and entries, sealed
        tokens, age of the last compaction), at a bounded cost, and whether it is due."""
        _check_kind("policy", policy, CompactionPolicy)
        return compaction.compaction_status(self._g, self._record, self.name, policy)

    def compact(
        self, *, if_needed: bool = False, policy: CompactionPolicy | None = None
    ) -> CompactionResult:
        """Fold the staging area into a compacted metarange that reads use instead of HEAD's.

        With `if_needed`, only when `compaction_status` says it is due. Nothing staged is a
        no-op result, and a compaction that a concurrent commit overtook says so
        (`outcome="superseded"`) rather than raising: the branch is intact either way.
        """
        check_flag("if_needed", if_needed)
        _check_kind("policy", policy, CompactionPolicy)
        return compaction.compact(
            self._g, self._record, self.name, if_needed=if_needed, policy=policy
        )


class Transaction(Branch):
    """The branch a `Branch.transaction` writes to. `message` and `metadata` may be changed
    inside the block; once it ends, `landed` is the commit it landed (None: no change)."""

    def __init__(self, repository: Repository, started: transactions.Transaction) -> None:
        super().__init__(repository, started.branch)
        self.started = started
        self.landed: Commit | None = None

    @property
    def target(self) -> str:
        return self.started.target

    @property
    def message(self) -> str:
        return self.started.message

    @message.setter
    def message(self, value: str) -> None:
        self.started.message = value

    @property
    def metadata(self) -> dict[str, str]:
        return self.started.metadata

    @metadata.setter
    def metadata(self, value: Mapping[str, str]) -> None:
        self.started.metadata = check_metadata(value)


def _check_kind(name: str, value: object, kind: type) -> None:
    """`value` is None or a `kind`: an option object of another type would only surface
    later, as Python's own error far from the call."""
    if value is not None and not isinstance(value, kind):
        raise InvalidArgument(f"{name} must be a {kind.__name__}, not {type(value).__name__}")


def _check_progress(progress: object, name: str = "progress", called_with: str = "a count") -> None:
    """Checked before any work: a callback that cannot be called would fail the operation
    at its first report, midway."""
    if progress is not None and not callable(progress):
        raise InvalidArgument(
            f"{name} must be a function called with {called_with}, not {type(progress).__name__}"
        )


def _listing_bounds(prefix: object, after: object) -> tuple[str, str]:
    return check_path(prefix, "prefix", empty=True), check_path(after, "listing start", empty=True)


def _local_path(path: object, what: str, hint: str = "") -> Path:
    """A local file's path as given (`str` or path-like), else `InvalidArgument`."""
    if not isinstance(path, str | os.PathLike):
        raise InvalidArgument(f"{what} takes a local path, not {type(path).__name__}{hint}")
    return Path(path)
