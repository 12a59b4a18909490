"""`Graveler`: the shared context of every versioned operation.

It holds the KV store, the per-namespace object and committed stores, a short-lived branch
cache (allowed by the metadata-KV design for the first read of a write or read flow, never for
the re-read that validates it) and the retry policy of the optimistic protocols.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from urllib.parse import urlsplit

from branchwater.engine.background import Background
from branchwater.engine.errors import (
    BranchwaterError,
    InvalidArgument,
    NotFound,
    PredicateFailed,
    lake_closed,
)
from branchwater.engine.graveler.committed import CommittedStore, RangeCache, RangePolicy
from branchwater.engine.graveler.metrics import CompactionMetrics
from branchwater.engine.graveler.model import BranchRecord, RepositoryRecord
from branchwater.engine.graveler.refs import (
    TOKENS_MARK,
    BranchGuard,
    DeletionMark,
    RefStore,
    branch_not_found,
)
from branchwater.engine.graveler.staging import StagedValue, StagingArea
from branchwater.engine.kv import Store
from branchwater.engine.objects import ObjectStore, check_s3_options, open_object_store
from branchwater.engine.per_process import ChildSafeLock, forget_in_child

log = logging.getLogger(__name__)

S3Options = Mapping[str, str | None]
"""`endpoint_url`, `aws_access_key_id`, `aws_secret_access_key`, `aws_session_token`,
`region_name` (see `open_object_store`)."""

REPOSITORY_MARK = "repo/"
"""To-delete lists of repositories being deleted or created: their partition first, then
their tokens; dropped only once no record names the partition (`_repository_gone`), the
branches fenced before the drop (`fence_branches`)."""
ABANDONED_DROP_S = 3600.0
"""A listed drop this old is taken for abandoned and finished by whichever process drops
next. Dropping is idempotent, so a slow drop that is still running only costs double work."""
LET_GO_DROP_S = 300.0
"""A guarded drop whose branch has let go of its tokens is finished by whichever process
drops next once it is this old: younger, its own process is most likely dropping it right
now (it does so just after its update). Taken at once, every commit's cleanup would drop
the tokens other writers' commits had just let go of, beside them: statements that wait on
the same rows, then find nothing."""


@dataclass(frozen=True)
class RetryPolicy:
    """Bounded attempts with full-jitter exponential backoff, as lakeFS's committer does.

    `for attempt in policy:` is the loop of every compare-and-swap on a branch: it yields the
    attempt numbers 1 to `attempts` and sleeps between two of them, never before the first or
    after the last, so a loop that returns on success and falls out of the `for` has run out.
    """

    attempts: int = 10
    base_delay: float = 0.005
    max_delay: float = 0.5
    commit_wait: float = 5.0
    """Seconds a commit waits for another commit's seal under way on its branch before it
    seals beside it (`commit.seal`). A committer killed after its seal leaves the seal for
    the next commit to absorb, which then waits this long once; a commit still building
    after this long is built on beside."""

    def __post_init__(self) -> None:
        attempts = self.attempts
        if isinstance(attempts, bool) or not isinstance(attempts, int) or attempts < 0:
            raise InvalidArgument(f"RetryPolicy.attempts must be a whole number, not {attempts!r}")
        for name in ("base_delay", "max_delay", "commit_wait"):
            check_seconds(f"RetryPolicy.{name}", getattr(self, name))

    def __iter__(self) -> Iterator[int]:
        for attempt in range(1, self.attempts + 1):
            if attempt > 1:
                time.sleep(self.delay(attempt - 1))
            yield attempt

    def delay(self, lost: int) -> float:
        """A random pause after `lost` attempts in a row lost: its bound doubles with each."""
        return random.uniform(0, min(self.max_delay, self.base_delay * 2 ** (lost - 1)))


def check_seconds(what: str, value: object, most: float = float("inf")) -> float:
    """`value` if it is a finite number of seconds from 0 to `most`, else `InvalidArgument`.
    A NaN would make every comparison false: a cache entry that never expires, a pause
    `time.sleep` refuses."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 <= value <= most
        or value == float("inf")
    ):
        bound = "0 or more" if most == float("inf") else f"from 0 to {most:g}"
        raise InvalidArgument(f"{what} must be a finite number of seconds, {bound}, not {value!r}")
    return float(value)


class BranchCache:
    """Branch records by (repository partition, name), valid for `ttl` seconds."""

    def __init__(self, ttl: float) -> None:
        self.ttl = check_seconds("branch_cache_ttl", ttl)
        self._entries: dict[tuple[bytes, str], tuple[float, BranchRecord]] = {}
        self._lock = threading.Lock()
        forget_in_child(self)

    def after_fork_in_child(self) -> None:
        """In a forked child: start empty, as another thread may have held the lock."""
        self._entries = {}
        self._lock = threading.Lock()

    def get(self, repo: RepositoryRecord, name: str) -> BranchRecord | None:
        if self.ttl <= 0:
            return None
        with self._lock:
            hit = self._entries.get((repo.partition, name))
        if hit is None or time.monotonic() - hit[0] > self.ttl:
            return None
        return hit[1]

    def put(self, repo: RepositoryRecord, branch: BranchRecord) -> None:
        if self.ttl > 0:
            with self._lock:
                self._entries[(repo.partition, branch.name)] = (time.monotonic(), branch)

    def forget(self, repo: RepositoryRecord, name: str) -> None:
        with self._lock:
            self._entries.pop((repo.partition, name), None)


class Graveler:
    def __init__(
        self,
        kv: Store,
        *,
        object_store_options: S3Options | Callable[[], S3Options] | None = None,
        range_policy: RangePolicy | None = None,
        range_cache: RangeCache | None = None,
        retry: RetryPolicy | None = None,
        branch_cache_ttl: float = 0.5,
        drop_pause: float = 0.002,
    ) -> None:
        self.kv = kv
        self.refs = RefStore(kv)
        self.staging = StagingArea(kv)
        self.retry = retry or RetryPolicy()
        self.branch_cache = BranchCache(branch_cache_ttl)
        self.drop_pause = drop_pause
        self.metrics = CompactionMetrics()
        self._s3_options: S3Options | Callable[[], S3Options] = (
            object_store_options
            if callable(object_store_options)
            else check_s3_options(object_store_options or {})
        )
        self._range_policy = range_policy or RangePolicy()
        self.range_cache = range_cache
        self._objects: dict[str, ObjectStore] = {}
        self._committed: dict[str, CommittedStore] = {}
        self._lock = ChildSafeLock()
        self._closed = False
        self._background = Background(1, "bw-drop")
        self._strays_swept_at = 0.0

    def objects(self, namespace: str) -> ObjectStore:
        with self._lock:
            if self._closed:
                raise lake_closed()
            store = self._objects.get(namespace)
            if store is None:
                store = open_object_store(namespace, **self._options_for(namespace))
                self._objects[namespace] = store
            return store

    def _options_for(self, namespace: str) -> S3Options:
        """The S3 options of an S3 namespace. Given as a function, they are asked for when the
        first one is opened (under the lock): a lake whose namespaces are all local never
        resolves credentials (an Airflow AWS connection's, say), and one that cannot resolve
        them fails there, each time until it can."""
        if urlsplit(namespace).scheme != "s3":
            return {}
        if callable(self._s3_options):
            self._s3_options = check_s3_options(self._s3_options())
        return self._s3_options

    def committed(self, repo: RepositoryRecord) -> CommittedStore:
        namespace = repo.storage_namespace
        objects = self.objects(namespace)
        with self._lock:
            if self._closed:
                raise lake_closed()
            store = self._committed.get(namespace)
            if store is None:
                store = CommittedStore(objects, self._range_policy, disk_cache=self.range_cache)
                self._committed[namespace] = store
            return store

    def read_branch(
        self, repo: RepositoryRecord, name: str, *, cached: bool = False
    ) -> BranchRecord:
        """The branch record; `cached=True` only for the first read of a validated flow."""
        if cached:
            hit = self.branch_cache.get(repo, name)
            if hit is not None:
                return hit
        branch, _ = self.refs.get_branch(repo, name)
        self.branch_cache.put(repo, branch)
        return branch

    def stage(
        self, repo: RepositoryRecord, name: str, token: str, path: str, entry: StagedValue
    ) -> BranchRecord:
        """Stage `entry` (`None`: a tombstone) at `path` in `token` and return the branch
        record as it was once the row was in, in one KV call where the store can: the
        staged write's validating read (`writes`). With the branch gone, the row a store
        without that call wrote first is removed: the token is a deleted branch's, whose
        partition may be dropped already, and nothing else would ever remove it."""
        guard = self.refs.branch_address(repo, name)
        try:
            value = self.staging.put_guarded(token, path, entry, guard)
        except NotFound:
            self.staging.remove(token, path)
            raise branch_not_found(repo, name) from None
        branch = BranchRecord.decode(value)
        self.branch_cache.put(repo, branch)
        return branch

    def try_update_branch(
        self, repo: RepositoryRecord, branch: BranchRecord, predicate: bytes
    ) -> bool:
        """`set_if` the branch record; False when another process changed it first.

        Every update writes a record no other names (a new commit, token or metarange), so a
        swap whose reply was lost counts as landed when a read shows it (`set_unique_if`);
        otherwise `OutcomeUnknown` goes up, and the caller undoes nothing."""
        try:
            self.refs.set_branch_if(repo, branch, predicate)
        except PredicateFailed:
            return False
        self.branch_cache.put(repo, branch)
        return True

    def update_branch_dropping(
        self,
        repo: RepositoryRecord,
        branch: BranchRecord,
        predicate: bytes,
        tokens: Sequence[str],
    ) -> bool:
        """`try_update_branch` for an update that lets go of staging `tokens` (a commit, a
        compaction, a reset, a merge), then drop them in the background.

        The tokens are listed for deletion, guarded by the branch, before the `set_if`: a
        process killed right after it leaves them listed, and the next process that drops
        something once the list is `LET_GO_DROP_S` old finds the branch no longer names them
        and drops them. A lost race unlists them again.
        """
        if not tokens:
            return self.try_update_branch(repo, branch, predicate)
        mark, partitions = self._list_tokens(repo, branch.name, tokens)
        if not self.try_update_branch(repo, branch, predicate):
            self.refs.unmark_partitions(mark)
            return False
        self.drop_listed_later(mark, partitions)
        return True

    def remove_branch_dropping(
        self, repo: RepositoryRecord, branch: BranchRecord, predicate: bytes
    ) -> bool:
        """Delete the branch record if unchanged since read, as a `set_if` would replace it
        (False when another process changed it first), and drop every token it had, listed
        first as above."""
        tokens = (branch.staging_token, *branch.sealed_tokens)
        mark, partitions = self._list_tokens(repo, branch.name, tokens)
        try:
            self.refs.remove_branch_if(repo, branch.name, predicate)
        except PredicateFailed:
            self.refs.unmark_partitions(mark)
            return False
        self.branch_cache.forget(repo, branch.name)
        self.drop_listed_later(mark, partitions)
        return True

    def _list_tokens(
        self, repo: RepositoryRecord, branch: str, tokens: Sequence[str]
    ) -> tuple[str, list[bytes]]:
        """A guarded to-delete entry for `tokens`, under a name no other update shares."""
        mark = f"{TOKENS_MARK}{tokens[0]}/{uuid.uuid4().hex}"
        partitions = [t.encode() for t in tokens]
        guard = BranchGuard(repo.partition, branch)
        self.refs.mark_partitions_for_deletion(mark, partitions, guard=guard)
        return mark, partitions

    def has_uncommitted(self, branch: BranchRecord) -> bool:
        """Anything a commit would still record: staged, sealed or compacted changes."""
        return bool(
            branch.sealed_tokens
            or branch.compacted_metarange_id
            or not self.staging.is_empty(branch.staging_token)
        )

    def base_metarange(self, repo: RepositoryRecord, branch: BranchRecord) -> str:
        """What a branch's staging sits on: its compacted metarange, else its HEAD's."""
        if branch.compacted_metarange_id:
            return branch.compacted_metarange_id
        return self.refs.get_commit(repo, branch.commit_id).metarange_id

    def drop_partitions_later(self, mark: str, partitions: list[bytes]) -> None:
        """Delete partitions in the background, listed first in the to-delete list.

        The list entry survives a crash, so `collect_dropped_partitions` can finish the job.
        """
        self.refs.mark_partitions_for_deletion(mark, partitions)
        self.drop_listed_later(mark, partitions)

    def drop_listed_later(self, mark: str, partitions: list[bytes]) -> None:
        """Delete in the background partitions already listed under `mark`, for a caller that
        had to list them before another step (a repository delete, before its record goes)."""
        self._background.submit(self._drop_quietly, mark, partitions)

    def _drop_quietly(self, mark: str, partitions: list[bytes]) -> None:
        """Drop, then finish any drop a dead process left behind: with no server, the
        processes that drop partitions are the ones that clean up after each other."""
        try:
            self._drop(mark, partitions)
            self.collect_dropped_partitions(ABANDONED_DROP_S, let_go_older_than=LET_GO_DROP_S)
        except BranchwaterError as exc:
            log.warning("dropping %s failed, left for collect_dropped_partitions: %s", mark, exc)

    def fence_branches(self, mark: str, listed: list[bytes]) -> list[bytes]:
        """Remove every branch record of a deleted repository (its partition first in
        `listed`), each only as read: a fence ordered after the staged writes under way, so
        a process still holding the repository finds no branch to write to (`stage` removes
        what a store wrote first) and no record for a commit to swap. Tokens a commit sealed
        since `listed` was made are listed under `mark` first, so a crash in between still
        drops them; returns `listed` and those."""
        partition, partitions = listed[0], list(listed)
        for _ in self.retry:
            read = list(self.refs.branches_in(partition))
            new = [p for p in token_partitions(b for b, _ in read) if p not in partitions]
            if new:
                partitions += new
                self.refs.mark_partitions_for_deletion(mark, partitions)
            changed = False
            for branch, predicate in read:
                try:
                    self.refs.remove_branch_in(partition, branch.name, predicate)
                except (PredicateFailed, NotFound):
                    changed = True
            if not changed:
                break
        return partitions

    def _drop(self, mark: str, partitions: list[bytes]) -> None:
        for partition in partitions:
            self.kv.drop_partition(partition, pause=self.drop_pause)
        self.refs.unmark_partitions(mark)

    def collect_dropped_partitions(
        self, older_than: float = 0.0, *, let_go_older_than: float = 0.0
    ) -> int:
        """Finish the drops still listed that were marked at least `older_than` seconds ago
        (their process died, or was killed), and the guarded ones at least
        `let_go_older_than` seconds old whose branch has let go of their tokens; returns how
        many lists were dropped. Called with no ages, it finishes every list it can.

        A guarded list whose branch still names its tokens is left alone: its update is
        under way, or lost its race (and the tokens are some later commit's to drop). A
        repository's list whose record still names its partition is taken off, not dropped
        (`_repository_gone`).
        Parts of long lists that no list names are removed once `ABANDONED_DROP_S` old,
        whatever the ages asked: younger, their writer may be about to name them. That scan
        runs when asked with no ages, else once per `ABANDONED_DROP_S` per process: not after
        every commit's drop.
        """
        now = time.time()
        done = 0
        for mark in list(self.refs.partitions_to_delete()):
            if mark.guard is not None:
                if mark.marked_at > now - let_go_older_than:
                    continue
                if not self.refs.tokens_in_use(mark.guard).isdisjoint(mark.partitions):
                    continue
            elif mark.marked_at > now - older_than:
                continue
            partitions = mark.partitions
            if mark.mark.startswith(REPOSITORY_MARK):
                gone = self._repository_gone(mark.mark)
                if gone is None:
                    continue
                partitions = self.fence_branches(mark.mark, gone.partitions)
            self._drop(mark.mark, partitions)
            done += 1
        if not (older_than or let_go_older_than) or now - self._strays_swept_at >= ABANDONED_DROP_S:
            self._strays_swept_at = now
            self.refs.discard_stray_parts(ABANDONED_DROP_S)
        return done

    def _repository_gone(self, mark: str) -> DeletionMark | None:
        """The repository list `mark` if its partition may drop; None if it may not (taken
        off when a record still names the partition).

        A delete lists the partition, then removes the record only while the list is as it
        wrote it; a creation lists it, writes the partition, then inserts the record on the
        same condition. The list is seized first (`seize_mark`), so neither can take effect
        on it after: the record read next is final. A record naming the partition means a
        delete that never took effect (killed before its removal; one under way now finds
        its removal refused and lists again) or a creation that did: the list is taken off
        and nothing dropped. No record, or one under a new unique id (re-created since),
        means a delete done or a creation that never will be (killed; one under way fails
        its insert): the partition drops."""
        seized = self.refs.seize_mark(mark)
        if seized is None:
            return None
        record, listed = seized
        if not self.refs.names_partition(listed.partitions[0]):
            return listed
        self.refs.unmark_partitions_if(mark, record)
        return None

    def wait_for_background(self, timeout: float | None = None) -> bool:
        """Wait for the background drops; False if some still run after `timeout` seconds."""
        finished, running = self._background.wait(timeout)
        for future in finished:
            future.result()
        return not running

    def close(self) -> None:
        """Close what was opened, for good: work still under way on another thread gets
        `LakeClosed` where it would open something again (a store, a drop thread, a KV
        connection). The stores are taken under the lock that opens them, so none opens
        after; the KV store is closed whatever closing the others raised."""
        try:
            self.wait_for_background()
            self._background.close()
            with self._lock:
                self._closed = True
                committed, objects = list(self._committed.values()), list(self._objects.values())
            for store in committed:
                store.close()
            for opened in objects:
                opened.close()
        finally:
            self.kv.close()


def token_partitions(branches: Iterable[BranchRecord]) -> list[bytes]:
    """The staging token partitions `branches` name, current and sealed."""
    return [t.encode() for b in branches for t in (b.staging_token, *b.sealed_tokens)]
