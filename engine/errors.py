"""Typed errors for every layer.

Each carries a message a person can act on; callers catch the class, users read the text.
"""

from __future__ import annotations


class BranchwaterError(Exception):
    """Base of every error Branchwater raises on purpose.

    It pickles with its attributes, whatever its constructor takes: an error raised in a
    worker process (a `multiprocessing` pool, a Spark task) must reach the caller whole, and
    Python's default rebuilds an exception by calling its class with its message alone."""

    def __reduce__(self) -> tuple[object, ...]:
        return _rebuilt, (type(self), self.args, self.__dict__)


def _rebuilt(
    cls: type[BranchwaterError], args: tuple[object, ...], state: dict[str, object]
) -> BranchwaterError:
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(state)
    return error


class NotFound(BranchwaterError):
    """A repository, branch, ref, path, key or object does not exist."""


class BucketNotFound(NotFound):
    """The bucket itself is missing: a misconfiguration, unlike an absent key."""


class LakeNotFound(NotFound):
    """A lake opened without creating it (`Lake.connect(..., create=False)`, the CLI's
    commands but `repo create`, the `branchwater://` filesystem) is not there: no SQLite file
    (or one without the lake's table), no PostgreSQL table, no DynamoDB table. Nothing was
    created. `where` names the store (a file's path, or a URL with any password masked) and
    `missing` says what is missing there (`the file does not exist`)."""

    def __init__(self, where: str, missing: str) -> None:
        super().__init__(
            f"no lake at {where}: {missing}; check the URL, or create a repository there to "
            "start a lake"
        )
        self.where = where
        self.missing = missing


class AlreadyExists(BranchwaterError):
    """Something with that name exists already."""


class PathExists(AlreadyExists, FileExistsError):
    """An exclusive creation (`upload(..., if_absent=True)`, fsspec's `"xb"`) found the path
    shown on the branch."""


class Conflict(BranchwaterError):
    """Two sides changed the same thing; the operation cannot decide alone."""


class MergeConflict(Conflict):
    """Paths both sides changed differently; `paths` holds the first few, `count` all."""

    def __init__(
        self,
        paths: list[str],
        count: int,
        source: str,
        destination: str,
        *,
        operation: str | None = None,
    ) -> None:
        shown = ", ".join(paths)
        more = f" and {count - len(paths)} more" if count > len(paths) else ""
        what = f"merging {source!r} into {destination!r}" if operation is None else operation
        advice = (
            "resolve them, or merge with strategy 'source-wins' or 'dest-wins'"
            if operation is None
            else f"change or restore those paths on {destination!r} first, then try again"
        )
        super().__init__(f"{what} conflicts on {count} path(s): {shown}{more}; {advice}")
        self.paths = paths
        self.count = count


class DirtyBranch(BranchwaterError):
    """The destination has uncommitted changes; a merge would mix them into its commit."""


class NoChanges(BranchwaterError):
    """The operation would record nothing new (an empty commit, an up-to-date merge)."""


class ChangesDropped(NoChanges):
    """A commit's changes left the branch by a reset (or a delete and re-creation of the
    branch) made while it was under way: they may have been dropped, not recorded, so no
    commit can be named as holding them. Whoever wrote them must check and write again."""


class AlreadyRecorded(NoChanges):
    """A commit found its changes recorded by a concurrent commit on the same branch, which
    took them while this one waited: `commit_id` is the branch's HEAD then, a commit that
    holds them. Nothing of this call's message or metadata is recorded."""

    def __init__(self, message: str, commit_id: str) -> None:
        super().__init__(message)
        self.commit_id = commit_id


class PredicateFailed(BranchwaterError):
    """A compare-and-swap found a value other than the one it expected."""


class TooManyTries(BranchwaterError):
    """An optimistic operation kept losing races and gave up after its bounded retries.

    A staged write that gave up may still land: its row can sit in a token a commit or
    compaction absorbs. Writing again is safe; a delete retried then may find the path gone
    (`NotFound`), which means the first one landed."""


def too_many_tries(what: str, attempts: int, advice: str = "retry later") -> TooManyTries:
    """The one wording of every bounded retry that ran out, so users learn to read one."""
    return TooManyTries(_gave_up(what, attempts, advice))


def _gave_up(what: str, attempts: int, advice: str) -> str:
    return f"{what} gave up after {attempts} attempts: the branch kept changing under it; {advice}"


class MergeRaceLost(TooManyTries):
    """Every attempt lost the race for the destination; `hint` lets a caller resume the work."""

    def __init__(self, what: str, attempts: int, hint: str, *, message: str | None = None) -> None:
        super().__init__(
            message
            or _gave_up(what, attempts, f"retry with hint={hint!r} to reuse this merge's work")
        )
        self.hint = hint


class InvalidName(BranchwaterError, ValueError):
    """A repository, branch or tag name breaks the naming rules."""


class InvalidArgument(BranchwaterError, ValueError):
    """An argument has the wrong type or an impossible value."""


class ReadOnlyRef(BranchwaterError, PermissionError):
    """A write names a tag, a commit id or `ref~N`: only branches take writes."""


class BranchProtected(BranchwaterError):
    """A branch's protection rule refuses the operation; `rule` names the rule
    (`no_direct_writes`, `no_delete`, `no_reset`, `required_checks`) and `pattern` the
    branch pattern it was set on (`Repository.protections()`)."""

    def __init__(self, message: str, *, branch: str, rule: str, pattern: str) -> None:
        super().__init__(message)
        self.branch = branch
        self.rule = rule
        self.pattern = pattern


class ChecksMissing(BranchProtected):
    """A merge into a branch whose rules require checks, from a commit that does not carry
    each as passed: `missing` were never recorded on it, `failed` were recorded as failed."""

    def __init__(
        self,
        message: str,
        *,
        branch: str,
        pattern: str,
        missing: tuple[str, ...],
        failed: tuple[str, ...],
    ) -> None:
        super().__init__(message, branch=branch, rule="required_checks", pattern=pattern)
        self.missing = missing
        self.failed = failed


class ConfigurationError(BranchwaterError):
    """A URL or setting cannot be used (unknown scheme, malformed, missing part)."""


class Unavailable(BranchwaterError):
    """A database or object store could not be reached or refused our credentials."""


class LakeClosed(BranchwaterError):
    """A lake (or a repository, branch or ref handle of it) was used after `Lake.close()`:
    like a closed file, a closed lake opens nothing again; open a new one."""


def lake_closed() -> LakeClosed:
    """The one wording of every use of a closed lake."""
    return LakeClosed("the lake was closed: open a new one (Lake.connect) to go on")


class OutcomeUnknown(Unavailable):
    """A conditional write whose reply was lost: it may or may not have been applied, and may
    still be; nothing is to be undone on it, only a read that shows it settles it."""


class CorruptedData(BranchwaterError):
    """Stored data is missing or unreadable where the metadata says it must be."""


class InvalidAddress(InvalidArgument):
    """A physical address is foreign, absolute or malformed: only `data/<slice>/<id>` inside
    the repository's namespace may be linked, so GC can account for every object."""


class InvalidToken(InvalidArgument):
    """A link token is malformed, forged, or issued for another repository or branch."""


class TokenExpired(InvalidToken):
    """A link token's time is up: GC may already treat its address as garbage."""


class TokenAlreadyUsed(InvalidToken):
    """A link token was already used to link an object; tokens are single-use."""


class RunExpired(BranchwaterError):
    """A GC preparation ran longer than the records it relies on are kept; start a new run."""


class GateFailed(BranchwaterError):
    """A GC run's quality gate refused its candidates: nothing is deleted."""


class StaleGCMark(BranchwaterError):
    """A GC run's mark can no longer be swept safely (its retention fence lapsed or a later
    run took it over): nothing is deleted."""


class GCRunLocked(Conflict):
    """Another GC run holds the repository's run lease; its holder is named in the message."""


class InvalidGCRules(InvalidArgument):
    """A GC retention rules document breaks the schema; nothing was stored."""


class CommitExpired(NotFound):
    """Retention expired this commit and deletes its objects; `commit_id` and `expired`
    (when it was recorded expired, right before its sweep's first delete) say which and
    when."""

    def __init__(self, commit_id: str, expired: str, collecting: str | None = None) -> None:
        if collecting is None:
            said = (
                f"its objects were deleted from {expired} on; use a newer commit, or a tag to "
                "keep one"
            )
        else:
            said = (
                f"GC run {collecting} is collecting its objects now; use a newer commit (set a "
                "tag on a commit before it expires to keep it)"
            )
        super().__init__(
            f"commit {commit_id!r} expired under the repository's GC retention rules: {said}"
        )
        self.commit_id = commit_id
        self.expired = expired
        self.collecting = collecting


class InvalidImportSource(InvalidArgument):
    """An import's source is not an `s3://` or `file://` prefix outside every repository's
    namespace (GC would collect objects imported from inside one)."""
