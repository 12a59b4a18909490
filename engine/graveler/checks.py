"""Checks: results recorded on commits (a data-quality validation, a review), and the gate
merges into protected branches pass through.

A check lives at `checks/<commit id>/<name>` in the repository's partition, written once with
`set_if` (must not exist): immutable, so a merge gate cannot be satisfied by rewriting a
failed result. Recording the same result again returns the stored one, so a retried task
succeeds; a different one raises `AlreadyExists`. Checks name a commit and hold no object
addresses: GC neither reads them nor keeps anything for them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from branchwater.engine.errors import (
    AlreadyExists,
    ChecksMissing,
    InvalidArgument,
    PredicateFailed,
)
from branchwater.engine.graveler.graveler import Graveler
from branchwater.engine.graveler.model import BranchRecord, RepositoryRecord, check_flag
from branchwater.engine.graveler.protection import (
    check_by,
    check_check_name,
    current_user,
    decode_stamp,
)
from branchwater.engine.graveler.refs import scan_prefix

CHECKS_PREFIX = b"checks/"
MAX_DETAILS_BYTES = 16 * 1024
"""A check's details are a small document (figures, a link), not a report: store that as an
object and link it."""


@dataclass(frozen=True)
class CheckResult:
    """A check recorded on a commit: `passed` or not, with `details` (a small JSON object,
    such as Great Expectations' statistics and a link to its report)."""

    commit_id: str
    name: str
    passed: bool
    details: dict[str, Any] = field(default_factory=dict)
    recorded_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    recorded_by: str = ""

    def encode(self) -> bytes:
        document = {
            "commit_id": self.commit_id,
            "name": self.name,
            "passed": self.passed,
            "details": self.details,
            "recorded_at": self.recorded_at.isoformat(),
            "recorded_by": self.recorded_by,
        }
        return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, value: bytes) -> CheckResult:
        raw = json.loads(value)
        raw["recorded_at"] = datetime.fromisoformat(raw["recorded_at"])
        return cls(**raw)


def check_details(details: object) -> dict[str, Any]:
    """`details` as stored: a JSON object of at most `MAX_DETAILS_BYTES`, else
    `InvalidArgument` saying what to change."""
    if details is None:
        return {}
    if not isinstance(details, Mapping):
        raise InvalidArgument(f"check details must be a JSON object, not {type(details).__name__}")
    try:
        text = json.dumps(dict(details), sort_keys=True, allow_nan=False, default=_refuse)
    except (TypeError, ValueError, RecursionError) as error:
        raise InvalidArgument(f"check details must be plain JSON: {error}") from None
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > MAX_DETAILS_BYTES:
        raise InvalidArgument(
            f"check details take {size} bytes as JSON, more than {MAX_DETAILS_BYTES}: keep "
            "figures and a link to the full report"
        )
    try:
        text.encode()
    except UnicodeEncodeError:
        raise InvalidArgument("check details hold a lone surrogate") from None
    loaded: dict[str, Any] = json.loads(text)
    return loaded


def _refuse(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError("NaN and infinities are not JSON")
    raise TypeError(f"a {type(value).__name__} is not a JSON value")


def _key(commit_id: str, name: str = "") -> bytes:
    return CHECKS_PREFIX + commit_id.encode() + b"/" + name.encode()


def record_check(
    g: Graveler,
    repo: RepositoryRecord,
    commit_ref: str,
    name: str,
    passed: bool,
    details: object = None,
    by: str = "",
) -> CheckResult:
    """Record check `name` on the commit `commit_ref` resolves to, once: see the module."""
    check_check_name(name)
    check_flag("passed", passed)
    check_by(by)
    checked = check_details(details)
    commit_id = g.refs.resolve(repo, commit_ref).commit_id
    g.refs.get_commit(repo, commit_id)
    result = CheckResult(commit_id, name, passed, checked, recorded_by=by or current_user())
    try:
        g.kv.set_if(repo.partition, _key(commit_id, name), result.encode(), None)
    except PredicateFailed:
        existing = _get(g, repo, commit_id, name)
        if (existing.passed, existing.details) == (passed, checked):
            return existing
        verdict = "passed" if existing.passed else "failed"
        raise AlreadyExists(
            f"check {name!r} is already recorded on commit {commit_id[:12]} of {repo.name!r} "
            f"({verdict}, by {existing.recorded_by or 'unknown'} at "
            f"{existing.recorded_at:%Y-%m-%d %H:%M:%S} UTC): checks cannot be rewritten; "
            "record the new result on a new commit"
        ) from None
    return result


def _get(g: Graveler, repo: RepositoryRecord, commit_id: str, name: str) -> CheckResult:
    value, _ = g.kv.get(repo.partition, _key(commit_id, name))
    return CheckResult.decode(value)


def checks(g: Graveler, repo: RepositoryRecord, commit_ref: str) -> list[CheckResult]:
    """The checks recorded on the commit `commit_ref` resolves to, by name."""
    commit_id = g.refs.resolve(repo, commit_ref).commit_id
    return list(_checks_of(g, repo, commit_id))


def _checks_of(g: Graveler, repo: RepositoryRecord, commit_id: str) -> list[CheckResult]:
    rows = scan_prefix(g.kv, repo.partition, _key(commit_id))
    return [CheckResult.decode(value) for _, value in rows]


def check_merge(
    g: Graveler,
    repo: RepositoryRecord,
    branch: BranchRecord,
    candidates: Sequence[str],
    what: str,
) -> None:
    """Refuse a merge into `branch` (the record its `set_if` is judged on) unless every check
    the branch's rules require is passed. `candidates[0]` is the commit that lands (the
    commit merged; for a merge preview, the preview), and a result recorded on it decides;
    only a check not recorded there is taken from the next candidate that has it (for a
    preview, the commit it merged): write-audit-publish judges the merged result, so a
    preview whose own check failed is refused even if its source passed. `ChecksMissing`
    names the checks recorded nowhere and those whose deciding result failed."""
    required = decode_stamp(branch.protection).required_checks
    if not required:
        return
    assert candidates, "a merge has a commit to check"
    decided: dict[str, bool] = {}
    for commit_id in candidates:
        for result in _checks_of(g, repo, commit_id):
            if result.name in required:
                decided.setdefault(result.name, result.passed)
        if len(decided) == len(required):
            break
    missing = tuple(name for name in required if name not in decided)
    failed = tuple(name for name in required if decided.get(name) is False)
    if not missing and not failed:
        return
    pattern = required[(missing or failed)[0]]
    said = [
        f"missing {', '.join(missing)}" if missing else "",
        f"failed {', '.join(failed)}" if failed else "",
    ]
    advice = (
        "record them with record_check (or `branchwater checks record`) and merge again"
        if not failed
        else "a result cannot be rewritten: fix the data in a new commit, record the checks "
        "on it and merge that"
    )
    raise ChecksMissing(
        f"{what} refused: branch {branch.name!r} of {repo.name!r} requires checks "
        f"{', '.join(required)} (pattern {pattern!r}) passed on commit {candidates[0][:12]}: "
        f"{'; '.join(s for s in said if s)}; {advice}",
        branch=branch.name,
        pattern=pattern,
        missing=missing,
        failed=failed,
    )
