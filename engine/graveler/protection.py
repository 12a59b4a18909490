"""Protected branches: rules per branch pattern, kept with the repository in the KV and
stamped on the record of every branch they match.

The rule book (`protection/rules` in the repository's partition) is the source of truth: the
rules, their version, the patterns whose fence is still pending and the change that made the
current version (who, when, what). Writes do not read it. Each branch record carries a
*stamp*, the rules matching it and the book version they come from, so an operation that
moves a branch checks the rules in the very record its `set_if` is conditioned on: a process
that loaded the repository before a rule was added still refuses, as its `set_if` fails once
the stamp changes and the retry reads the new one.

`protect` and `unprotect` change the book (one `set_if`), then *fence* every branch the
pattern matches: each record is re-stamped by `set_if` from the book read after it. A stamp
only ever moves to a newer book version, so concurrent rule changes cannot leave an older
stamp behind. Per branch, the fence's `set_if` is the linearization point: an operation
whose own `set_if` on the record comes before it ran under the old rules, one after it under
the new. A staged write, which writes its row before re-reading the branch (the writer flow),
is judged by that validating read; finding the branch newly protected there, it takes its
row back and refuses (`writes._write_validated`). A new branch (created, or restored from a
dump) is inserted stamped from the book and only while the book is the one it read
(`insert_new_branch`): a rule change comes wholly before the insert and the stamp carries
it, or wholly after and its fence lists the branch, so no branch is ever without the rules
a returned `protect` set, even for a moment, even if its creator dies.

**The log.** Each change is written into the book it makes (`RuleBook.last`), in the same
`set_if`, so a change is never without its entry nor an entry without its change; the next
change files it under a key of its own (`protection/log/<version, 20 digits>`) before its
swap, with `create_guarded` on the book it swaps from (the same bytes every time, so filing
twice or by two processes is harmless, and nothing is written into the partition of a
repository deleted meanwhile). The book therefore holds its rules, its pending marks and one
change, whatever the history: bounded (`MAX_RULES_BYTES`, `MAX_BOOK_BYTES`, `by` as a commit's
committer) and well inside DynamoDB's 400 KB item. A reader reads the book, then the filed
entries: every entry older than the book's own was filed before the book was written, so
none is missed. A book an earlier version wrote (its whole log embedded) reads as it is; the
next change files its entries and drops them from the book.

**Pending fences.** A change marks its pattern pending, with the version it made, in the same
`set_if`; once its fence is done, a `set_if` clears the mark, only while the mark's version is
at most the version the fence covered (the book read before it listed the branches: every
branch then existing is stamped from that version or a newer one, and every branch inserted
later from a book at least as new). A mark with a newer version belongs to a later change of
the same pattern, whose own fence clears it. So a mark is cleared only when every branch the
pattern matches carries the pattern's current rule, and a `protect` killed between its book
change and the end of its fence leaves its mark: `protections()` shows the rule as pending
(not yet enforced on every existing branch), and every later `protect` or `unprotect`, of any
pattern, first fences the pending patterns it finds (marks of the pattern it changes are
covered by its own fence) and clears them the same way. No lock: concurrent changes of one
pattern each mark it with their own version, and only the fence of the newest clears it (an
older fence that ends last finds a newer mark and leaves it); changes of different patterns
mark different patterns, and their fences stamp overlapping branches from whichever book is
newest, never backwards; a finisher and the change's own process may fence one pattern at
once, both idempotent, and whichever clears first clears a mark both fences covered. A lost
`set_if` (a rule change, another clear, a branch creation's empty book) re-reads and tries
again; one that never wins leaves the mark, which only means one more fence later. Clearing
a mark changes the book's bytes, so a branch creation guarded on them retries: harmless.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import getpass
import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Literal

from branchwater.engine import failpoints
from branchwater.engine.errors import (
    BranchProtected,
    InvalidArgument,
    InvalidName,
    NotFound,
    PredicateFailed,
    too_many_tries,
)
from branchwater.engine.graveler.graveler import Graveler
from branchwater.engine.graveler.model import (
    BranchRecord,
    RepositoryRecord,
    check_flag,
    check_record_text,
)
from branchwater.engine.graveler.names import check_ref_name
from branchwater.engine.graveler.refs import scan_prefix
from branchwater.engine.kv import Store

RULES_KEY = b"protection/rules"
LOG_PREFIX = b"protection/log/"
"""Where each change of the book is filed, under its version in 20 digits (see the module)."""
RULE_NAMES = ("no_direct_writes", "required_checks", "no_delete", "no_reset")
MAX_RULES = 1000
"""Patterns one repository may protect: every branch create reads them all."""
MAX_REQUIRED_CHECKS = 64
"""Checks one rule may require: a branch's record carries the rules it matches, and every
staged write reads that record."""
MAX_RULES_BYTES = 160 * 1024
"""The most the rules may take as JSON: a branch's record carries those matching it, and the
book, with one change and the pending marks, must stay inside `MAX_BOOK_BYTES`."""
MAX_BOOK_BYTES = 300 * 1024
"""The most the encoded book may take: well inside DynamoDB's 400 KB item. The rules
(`MAX_RULES_BYTES`) and the change it carries (a rule and `by`, at most 96 KiB) fit it."""

Operation = Literal["write", "commit", "reset", "delete"]
"""What a write path asks the rules about (merges ask `checks.check_merge`)."""

CHECK_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
"""A check's name: what `record_check` and `required_checks` accept."""


def check_check_name(name: object) -> str:
    """A check name, or `InvalidName`."""
    if not isinstance(name, str) or CHECK_NAME.fullmatch(name) is None:
        raise InvalidName(
            f"invalid check name {name!r}: use 1 to 64 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def check_pattern(pattern: object) -> str:
    """A branch pattern: a branch name in which `*` matches within one `/`-separated part,
    `**` across parts and `?` one character (GitHub's branch protection globs)."""
    if not isinstance(pattern, str) or not pattern:
        raise InvalidName(f"invalid branch pattern {pattern!r}: it must be a non-empty string")
    try:
        check_ref_name(re.sub(r"[*?]", "x", pattern), "branch")
    except InvalidName as error:
        raise InvalidName(f"branch pattern {pattern!r} matches no valid branch: {error}") from None
    return pattern


@functools.lru_cache(maxsize=256)
def _glob(pattern: str) -> tuple[str, ...]:
    return tuple(part for part in re.split(r"(\*\*|\*|\?)", pattern) if part)


def pattern_matches(pattern: str, branch: str) -> bool:
    """Whether `pattern` matches all of `branch`, in time proportional to the pattern's parts
    times the name's length: the positions of `branch` the pattern can have reached, one
    part at a time. A regular expression of `*a*a*a…` backtracks exponentially on a name
    that almost matches (seconds at eight stars, for ever at twenty), and rules are matched
    against every branch name."""
    reached = [True] + [False] * len(branch)
    for part in _glob(pattern):
        reached = _advance(reached, part, branch)
        if not any(reached):
            return False
    return reached[-1]


def _advance(reached: list[bool], part: str, branch: str) -> list[bool]:
    """The positions reached after `part` (a literal, `**`, `*` or `?`) from `reached`."""
    after = [False] * len(reached)
    if part in ("**", "*"):
        run = False
        for end, was in enumerate(reached):
            if part == "*" and end and branch[end - 1] == "/":
                run = False
            run = run or was
            after[end] = run
    elif part == "?":
        for start, char in enumerate(branch):
            after[start + 1] = reached[start] and char != "/"
    else:
        for start in range(len(branch) - len(part) + 1):
            if reached[start] and branch.startswith(part, start):
                after[start + len(part)] = True
    return after


@dataclass(frozen=True)
class ProtectionRule:
    """What a branch pattern forbids. `no_direct_writes`: no upload, delete, copy, link,
    restore, commit, revert or cherry-pick: only merges (and publishing a merge preview)
    change the branch. `required_checks`: a merge into it needs each named check recorded
    as passed on the commit merged (`Repository.record_check`). `no_delete`: the branch
    cannot be deleted. `no_reset`: it cannot be reset to another commit (dropping its
    uncommitted changes, `reset()` without `to`, stays allowed: it changes no history).
    `pending` (only as `Repository.protections()` lists it, never stored nor compared): the
    rule's fence has not finished, so branches that existed before it may not enforce it yet
    (a `protect` killed midway); running `protect` again, or any other rule change, does."""

    pattern: str
    no_direct_writes: bool = False
    required_checks: tuple[str, ...] = ()
    no_delete: bool = False
    no_reset: bool = False
    pending: bool = dataclasses.field(default=False, compare=False)

    @classmethod
    def checked(
        cls,
        pattern: object,
        *,
        no_direct_writes: object = False,
        required_checks: object = (),
        no_delete: object = False,
        no_reset: object = False,
    ) -> ProtectionRule:
        """The rule, every argument checked; `InvalidArgument` for one that protects nothing."""
        flags = {"no_direct_writes": no_direct_writes, "no_delete": no_delete, "no_reset": no_reset}
        for name, value in flags.items():
            check_flag(name, value)
        if isinstance(required_checks, str) or not isinstance(required_checks, Iterable):
            raise InvalidArgument(
                f"required_checks must be a list of check names, not {required_checks!r}"
            )
        checks = tuple(sorted({check_check_name(name) for name in required_checks}))
        if len(checks) > MAX_REQUIRED_CHECKS:
            raise InvalidArgument(
                f"a protection rule requires at most {MAX_REQUIRED_CHECKS} checks, not "
                f"{len(checks)}: record one check that sums up the others"
            )
        rule = cls(check_pattern(pattern), no_direct_writes, checks, no_delete, no_reset)  # type: ignore[arg-type]
        if not rule.rule_names:
            raise InvalidArgument(
                f"a protection of {pattern!r} must set at least one of {', '.join(RULE_NAMES)}"
            )
        return rule

    @property
    def rule_names(self) -> tuple[str, ...]:
        """The rules this pattern sets, by name."""
        return tuple(name for name in RULE_NAMES if getattr(self, name))

    def matches(self, branch: str) -> bool:
        return pattern_matches(self.pattern, branch)

    def to_json(self) -> dict[str, object]:
        return {
            "pattern": self.pattern,
            "no_direct_writes": self.no_direct_writes,
            "required_checks": list(self.required_checks),
            "no_delete": self.no_delete,
            "no_reset": self.no_reset,
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, object]) -> ProtectionRule:
        checks = raw.get("required_checks") or ()
        assert isinstance(checks, list | tuple)
        return cls(
            str(raw["pattern"]),
            bool(raw.get("no_direct_writes")),
            tuple(str(c) for c in checks),
            bool(raw.get("no_delete")),
            bool(raw.get("no_reset")),
        )


@dataclass(frozen=True)
class ProtectionChange:
    """One change of the rule book: `action` on `pattern`, by whom and when; `rule` is the
    rule set (`None` for an unprotect)."""

    version: int
    action: Literal["protect", "unprotect"]
    pattern: str
    rule: ProtectionRule | None
    by: str
    at: datetime

    def to_json(self) -> dict[str, object]:
        return {
            "version": self.version,
            "action": self.action,
            "pattern": self.pattern,
            "rule": None if self.rule is None else self.rule.to_json(),
            "by": self.by,
            "at": self.at.isoformat(),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, object]) -> ProtectionChange:
        rule = raw.get("rule")
        action = raw["action"]
        assert action in ("protect", "unprotect")
        return cls(
            int(str(raw["version"])),
            action,
            str(raw["pattern"]),
            None if rule is None else ProtectionRule.from_json(rule),  # type: ignore[arg-type]
            str(raw["by"]),
            datetime.fromisoformat(str(raw["at"])),
        )


def _dumps(document: object) -> bytes:
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def log_key(version: int) -> bytes:
    """Where the change that made book `version` is filed."""
    return LOG_PREFIX + f"{version:020d}".encode()


@dataclass(frozen=True)
class RuleBook:
    """The repository's rules and their version; `pending`, each pattern whose fence has not
    finished and the version whose change marked it; `last`, the change that made this
    version (filed under its own key by the next change); `legacy_log`, the whole log a book
    of an earlier version held, filed by the next change."""

    version: int = 0
    rules: tuple[ProtectionRule, ...] = ()
    pending: tuple[tuple[str, int], ...] = ()
    last: ProtectionChange | None = None
    legacy_log: tuple[ProtectionChange, ...] = ()

    def rule(self, pattern: str) -> ProtectionRule | None:
        return next((rule for rule in self.rules if rule.pattern == pattern), None)

    def matching(self, branch: str) -> tuple[ProtectionRule, ...]:
        return tuple(rule for rule in self.rules if rule.matches(branch))

    def pending_since(self, pattern: str) -> int | None:
        """The version of the change whose fence of `pattern` is pending, if one is."""
        return dict(self.pending).get(pattern)

    @property
    def listed(self) -> tuple[ProtectionRule, ...]:
        """The rules as listed: those whose fence is pending say so."""
        marks = dict(self.pending)
        return tuple(dataclasses.replace(r, pending=r.pattern in marks) for r in self.rules)

    @property
    def removals_pending(self) -> tuple[str, ...]:
        """Patterns whose rule was removed but whose fence is pending: branches that existed
        before may still enforce the rule (an `unprotect` killed midway)."""
        return tuple(pattern for pattern, _ in self.pending if self.rule(pattern) is None)

    @property
    def unfiled(self) -> tuple[ProtectionChange, ...]:
        """The changes this book holds that are not filed under their own keys yet (as far
        as it knows)."""
        return (*self.legacy_log, *([self.last] if self.last is not None else []))

    def changed(self, pattern: str, rule: ProtectionRule | None, by: str) -> RuleBook:
        """The book with `pattern`'s rule set to `rule` (removed for `None`), its fence
        pending, the change carried; the changes this book held are filed by then."""
        version = self.version + 1
        action: Literal["protect", "unprotect"] = "unprotect" if rule is None else "protect"
        change = ProtectionChange(version, action, pattern, rule, by, datetime.now(timezone.utc))
        kept = [r for r in self.rules if r.pattern != pattern]
        rules = tuple(sorted([*kept, *([rule] if rule else [])], key=lambda r: r.pattern))
        pending = tuple(sorted({**dict(self.pending), pattern: version}.items()))
        return RuleBook(version, rules, pending, change)

    def settled(self, pattern: str) -> RuleBook:
        """The book with `pattern`'s fence no longer pending."""
        pending = tuple(mark for mark in self.pending if mark[0] != pattern)
        return dataclasses.replace(self, pending=pending)

    def rules_size(self) -> int:
        """The bytes the rules take in the book."""
        return len(_dumps([rule.to_json() for rule in self.rules]))

    def encode(self) -> bytes:
        document: dict[str, object] = {
            "version": self.version,
            "rules": [rule.to_json() for rule in self.rules],
        }
        if self.pending:
            document["pending"] = dict(self.pending)
        if self.last is not None:
            document["last"] = self.last.to_json()
        if self.legacy_log:
            document["log"] = [change.to_json() for change in self.legacy_log]
        return _dumps(document)

    @classmethod
    def decode(cls, value: bytes) -> RuleBook:
        raw = json.loads(value)
        pending = raw.get("pending") or {}
        last = raw.get("last")
        return cls(
            int(raw["version"]),
            tuple(ProtectionRule.from_json(r) for r in raw["rules"]),
            tuple(sorted((str(p), int(v)) for p, v in pending.items())),
            None if last is None else ProtectionChange.from_json(last),
            tuple(ProtectionChange.from_json(c) for c in raw.get("log") or ()),
        )


EMPTY_BOOKS = (RuleBook().encode(), b'{"log":[],"rules":[],"version":0}')
"""An empty book as this version writes it, and as one that embedded its log would have."""


def read_book(kv: Store, repo: RepositoryRecord) -> tuple[RuleBook, bytes | None]:
    """The rule book and the predicate that changes it (`None`: none yet)."""
    try:
        value, predicate = kv.get(repo.partition, RULES_KEY)
    except NotFound:
        return RuleBook(), None
    return RuleBook.decode(value), predicate


@dataclass(frozen=True)
class Stamp:
    """The rules matching one branch, as of a book version: what its record carries."""

    version: int
    rules: tuple[ProtectionRule, ...]

    def encode(self) -> str:
        if not self.version:
            return ""
        rules = [rule.to_json() for rule in self.rules]
        return json.dumps({"version": self.version, "rules": rules}, sort_keys=True)

    def first(self, rule_name: str) -> ProtectionRule | None:
        """The first rule (by pattern) that sets `rule_name`."""
        return next((rule for rule in self.rules if getattr(rule, rule_name)), None)

    @property
    def required_checks(self) -> dict[str, str]:
        """Each required check and the pattern requiring it."""
        required: dict[str, str] = {}
        for rule in self.rules:
            for name in rule.required_checks:
                required.setdefault(name, rule.pattern)
        return required


@functools.lru_cache(maxsize=1024)
def decode_stamp(text: str) -> Stamp:
    """A record's stamp; decoded once per distinct text, as every write reads one."""
    if not text:
        return Stamp(0, ())
    raw = json.loads(text)
    return Stamp(int(raw["version"]), tuple(ProtectionRule.from_json(r) for r in raw["rules"]))


def stamp_for(book: RuleBook, branch: str) -> str:
    """The stamp a branch gets from `book`: empty where nothing matches a fresh branch."""
    matching = book.matching(branch)
    return Stamp(book.version, matching).encode() if matching else ""


# enforcement


def check(
    repo: RepositoryRecord,
    branch: BranchRecord,
    operation: Operation,
    what: str,
    *,
    to_commit: str | None = None,
) -> None:
    """Refuse `operation` (`what`, in words) if the rules stamped on `branch` forbid it.
    Callers pass the record their `set_if` (or, for staged writes, their validating read)
    is judged on. `to_commit` is where a reset moves the branch."""
    stamp = decode_stamp(branch.protection)
    if not stamp.rules:
        return
    if operation in ("write", "commit"):
        rule, name = stamp.first("no_direct_writes"), "no_direct_writes"
        advice = "write to another branch and merge it in"
    elif operation == "delete":
        rule, name = stamp.first("no_delete"), "no_delete"
        advice = "unprotect it first if it really must go"
    else:
        moves = to_commit is not None and to_commit != branch.commit_id
        rule, name = (stamp.first("no_reset") if moves else None), "no_reset"
        advice = "revert the commits instead (through a merge, if direct writes are refused)"
    if rule is not None:
        raise refusal(repo, branch.name, name, rule.pattern, what, advice)


def refusal(
    repo: RepositoryRecord, branch: str, rule: str, pattern: str, what: str, advice: str
) -> BranchProtected:
    return BranchProtected(
        f"{what} refused: branch {branch!r} of {repo.name!r} is protected by rule {rule} "
        f"(pattern {pattern!r}); {advice}",
        branch=branch,
        rule=rule,
        pattern=pattern,
    )


# changing the rules


def current_user() -> str:
    """Who changes rules, when the caller does not say: the OS user."""
    try:
        return getpass.getuser()
    except (OSError, KeyError):
        return ""


def check_by(by: object) -> str:
    """Who changed a rule or recorded a check: a string a record can hold, as a commit's
    committer (at most `TEXT_MAX_BYTES` as UTF-8, no lone surrogate), else `InvalidArgument`."""
    if not isinstance(by, str):
        raise InvalidArgument(f"by must be a string, not {type(by).__name__}")
    return check_record_text("by", by, "name who made the change (a user, a job), not what it did")


def protect(g: Graveler, repo: RepositoryRecord, rule: ProtectionRule, by: str) -> RuleBook:
    """Set `rule` for its pattern (replacing any), logged, then fence the branches it
    matches. Setting the rule a pattern has already logs nothing but fences again, which
    finishes a protect that was killed midway. Pending fences of other patterns are finished
    first."""
    by = check_by(by)
    finish_pending(g, repo, but=rule.pattern)
    book = _change(g, repo, rule.pattern, rule, by)
    failpoints.hit("protect.before_fence")
    fence(g, repo, rule.pattern)
    _settle(g, repo, rule.pattern, book.version)
    return book


def unprotect(g: Graveler, repo: RepositoryRecord, pattern: str, by: str) -> RuleBook:
    """Remove `pattern`'s rule, logged, then fence the branches it matches. With no rule,
    the branches are fenced anyway: a removal marked pending, or a branch still stamped with
    the pattern's rule, means an unprotect killed before its fence ended, which this finishes
    and returns as done (a retried task succeeds); neither means there was nothing to remove,
    `NotFound`. Pending fences of other patterns are finished first."""
    check_pattern(pattern)
    by = check_by(by)
    finish_pending(g, repo, but=pattern)
    book, _ = read_book(g.kv, repo)
    if book.rule(pattern) is None:
        freed = fence(g, repo, pattern)
        if book.pending_since(pattern) is not None:
            _settle(g, repo, pattern, book.version)
            return book
        if freed:
            return book
        known = ", ".join(repr(r.pattern) for r in book.rules) or "none"
        raise NotFound(
            f"no protection rule for pattern {pattern!r} in {repo.name!r} (patterns: {known})"
        )
    book = _change(g, repo, pattern, None, by)
    failpoints.hit("protect.before_fence")
    fence(g, repo, pattern)
    _settle(g, repo, pattern, book.version)
    return book


def finish_pending(g: Graveler, repo: RepositoryRecord, but: str = "") -> RuleBook:
    """Fence every pattern (but `but`) whose fence the book marks pending, and clear each
    mark the fence covered; the book read before."""
    book, _ = read_book(g.kv, repo)
    for pattern, _since in book.pending:
        if pattern != but:
            fence(g, repo, pattern)
            _settle(g, repo, pattern, book.version)
    return book


def _settle(g: Graveler, repo: RepositoryRecord, pattern: str, covered: int) -> None:
    """Clear `pattern`'s pending mark if a fence that began after the book reached version
    `covered` covered it (the mark is no newer); a newer mark is a later change's to clear.
    A mark still there after every try stays, to be finished by the next rule change."""
    for _ in g.retry:
        book, predicate = read_book(g.kv, repo)
        since = book.pending_since(pattern)
        if predicate is None or since is None or since > covered:
            return
        try:
            g.kv.set_if(repo.partition, RULES_KEY, book.settled(pattern).encode(), predicate)
        except PredicateFailed:
            continue
        return


def _change(
    g: Graveler, repo: RepositoryRecord, pattern: str, rule: ProtectionRule | None, by: str
) -> RuleBook:
    """Change the book (see the module): file the changes it holds, then swap it for the
    changed one, which carries this change and marks `pattern` pending. Returns the book
    the fence starts from: the changed one, or the one read if it already had `rule`."""
    for _ in g.retry:
        book, predicate = read_book(g.kv, repo)
        if book.rule(pattern) == rule:
            return book
        if rule is not None and book.rule(pattern) is None and len(book.rules) >= MAX_RULES:
            raise InvalidArgument(f"{repo.name!r} has {MAX_RULES} protected patterns already")
        changed = book.changed(pattern, rule, by or current_user())
        _check_size(repo, book, changed)
        try:
            if predicate is not None:
                _file(g, repo, book, predicate)
            g.kv.set_if(repo.partition, RULES_KEY, changed.encode(), predicate)
        except PredicateFailed:
            continue
        return changed
    raise too_many_tries(
        f"changing the protection of {pattern!r} in {repo.name!r}", g.retry.attempts
    )


def _check_size(repo: RepositoryRecord, book: RuleBook, changed: RuleBook) -> None:
    """Refuse a change whose book would outgrow its limits (a change that shrinks the rules
    passes: a book from before the limits must still shed them)."""
    size = changed.rules_size()
    if size > MAX_RULES_BYTES and size > book.rules_size():
        raise InvalidArgument(
            f"the protection rules of {repo.name!r} would take {size:,} bytes, over the "
            f"{MAX_RULES_BYTES // 1024} KiB they may: cover several branches with one pattern "
            "(release/*), require fewer checks (record one that sums up the others), or "
            "remove rules no longer needed"
        )
    total = len(changed.encode())
    if total > MAX_BOOK_BYTES:
        raise InvalidArgument(
            f"the protection rule book of {repo.name!r} would take {total:,} bytes, over the "
            f"{MAX_BOOK_BYTES // 1024} KiB it may: give a shorter `by`, or remove rules no "
            "longer needed"
        )


def _file(g: Graveler, repo: RepositoryRecord, book: RuleBook, predicate: bytes) -> None:
    """File the changes `book` holds under their own keys, each written only while the book
    is still `predicate` (`PredicateFailed` otherwise); one already filed is left as it is
    (the same entry: a version's change never changes)."""
    for change in book.unfiled:
        g.kv.create_guarded(
            repo.partition,
            log_key(change.version),
            _dumps(change.to_json()),
            (repo.partition, RULES_KEY),
            predicate,
        )


def fence(g: Graveler, repo: RepositoryRecord, pattern: str) -> bool:
    """Re-stamp every branch `pattern` matches from the current book; True if a stamp
    replaced carried a rule of `pattern` the book no longer has (what an unprotect frees)."""
    freed = False
    for branch in list(g.refs.branches(repo)):
        if not pattern_matches(pattern, branch.name):
            continue
        replaced = stamp_branch(g, repo, branch.name)
        if replaced is not None:
            old, book = replaced
            freed |= book.rule(pattern) is None and any(r.pattern == pattern for r in old.rules)
    return freed


def stamp_branch(g: Graveler, repo: RepositoryRecord, name: str) -> tuple[Stamp, RuleBook] | None:
    """Stamp one branch from the book, read after the branch so that the `set_if` fails
    if another fence stamped it in between; a newer stamp is left as it is. Returns the
    stamp replaced and the book the new one came from; None if nothing was stamped."""
    for _ in g.retry:
        try:
            branch, predicate = g.refs.get_branch(repo, name)
        except NotFound:
            return None
        book, _ = read_book(g.kv, repo)
        old = decode_stamp(branch.protection)
        if old.version >= book.version:
            return None
        stamp = Stamp(book.version, book.matching(name)).encode()
        if g.try_update_branch(repo, dataclasses.replace(branch, protection=stamp), predicate):
            return old, book
    raise too_many_tries(f"protecting branch {name!r} of {repo.name!r}", g.retry.attempts)


def insert_new_branch(g: Graveler, repo: RepositoryRecord, branch: BranchRecord) -> BranchRecord:
    """Create `branch` stamped from the book, inserted only while the book is the one read
    (`Store.create_guarded`): a rule change, a swap of the book, comes wholly before the
    insert, whose stamp then carries it, or wholly after, and its fence then lists the
    branch. (Stamped from a book read before an unguarded insert, a branch created while
    `protect` listed the branches was left unprotected.) A repository without a book gets
    an empty one first, so that there is a value to guard on. `AlreadyExists` where the
    branch is."""
    for _ in g.retry:
        book, predicate = read_book(g.kv, repo)
        if predicate is None:
            with contextlib.suppress(PredicateFailed):
                g.kv.set_if(repo.partition, RULES_KEY, book.encode(), None)
            continue
        stamped = dataclasses.replace(branch, protection=stamp_for(book, branch.name))
        failpoints.hit("branch.before_insert")
        try:
            g.refs.insert_branch(repo, stamped, (RULES_KEY, predicate))
        except PredicateFailed:
            continue
        return stamped
    raise too_many_tries(f"creating branch {branch.name!r} of {repo.name!r}", g.retry.attempts)


def discard_empty_book(g: Graveler, repo: RepositoryRecord) -> None:
    """Remove the empty book a branch creation wrote (`insert_new_branch`) into a repository
    deleted meanwhile, whose partition is being dropped: nothing may stay behind there. A
    book with rules, or none, is left as it is."""
    for empty in EMPTY_BOOKS:
        with contextlib.suppress(NotFound, PredicateFailed):
            g.kv.delete_if(repo.partition, RULES_KEY, empty)


def log_entries(g: Graveler, repo: RepositoryRecord) -> Iterator[ProtectionChange]:
    """Every change of the book, oldest first: the book read first, then the entries filed
    (every change older than the book's own was filed before it was written), with the
    changes the book still holds."""
    book, _ = read_book(g.kv, repo)
    changes = {change.version: change for change in book.unfiled}
    for _key, value in scan_prefix(g.kv, repo.partition, LOG_PREFIX):
        change = ProtectionChange.from_json(json.loads(value))
        changes.setdefault(change.version, change)
    return iter([changes[version] for version in sorted(changes)])
