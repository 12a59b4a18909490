"""A repository's GC retention rules, stored in the KV with the repository.

The JSON shape is lakeFS's (`default_retention_days`, `branches: [{branch_id,
retention_days}]`) so a lakeFS user recognises it, with two additions: a `branch_id` may be a
glob pattern (`*`, `?`, `[...]`, matched with `fnmatchcase` against the whole name), and an
optional `keep_tags` pattern names tags that keep their commit's whole history. Every tag
keeps the commit it points at, always (lakeFS issue 7621): no rule can expire a tagged commit.

Several patterns may match one branch: the longest retention wins, because keeping more is
the only safe way to settle a doubt. Rules are validated whole before anything is stored, so
a bad document leaves the previous rules in place.
"""

from __future__ import annotations

import itertools
import json
import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from fnmatch import fnmatchcase
from typing import Any

from branchwater.engine.errors import InvalidGCRules, InvalidName, NotFound
from branchwater.engine.gc.settings import LONGEST
from branchwater.engine.graveler.model import RepositoryRecord
from branchwater.engine.graveler.names import check_ref_name
from branchwater.engine.kv import Store

RULES_KEY = b"settings/gc_rules"
"""Where a repository's rules live in its own partition (as lakeFS keeps them in settings):
deleting the repository deletes them with it."""
MAX_RETENTION_DAYS = LONGEST.days
_TOP_KEYS = frozenset({"default_retention_days", "branches", "keep_tags"})
_BRANCH_KEYS = frozenset({"branch_id", "retention_days"})
_GLOB_TOKEN = re.compile(r"\[!?\]?[^\]]*\]|[*?]")
_STAND_INS = "a0-_."
"""Characters tried first for a wildcard or class in the sample name a pattern must match:
a letter, a digit and the punctuation names hold (a name may not start with every one)."""
_CANDIDATES = string.ascii_letters + string.digits + "-_."
SAMPLES_TRIED = 256


@dataclass(frozen=True)
class BranchRule:
    """Commits reachable from a matching branch's HEAD stay `retention_days` days."""

    branch_id: str
    retention_days: int

    def matches(self, branch: str) -> bool:
        return fnmatchcase(branch, self.branch_id)


@dataclass(frozen=True)
class GCRules:
    default_retention_days: int
    branches: tuple[BranchRule, ...] = ()
    keep_tags: str | None = None

    def retention_days(self, branch: str) -> int:
        """The branch's retention: the longest of the rules matching it, else the default."""
        matching = [rule.retention_days for rule in self.branches if rule.matches(branch)]
        return max(matching) if matching else self.default_retention_days

    def keeps_history(self, tag: str) -> bool:
        """Whether `tag` keeps every ancestor of its commit, not only the commit."""
        return self.keep_tags is not None and fnmatchcase(tag, self.keep_tags)

    def to_json(self) -> dict[str, Any]:
        document: dict[str, Any] = {
            "default_retention_days": self.default_retention_days,
            "branches": [
                {"branch_id": r.branch_id, "retention_days": r.retention_days}
                for r in self.branches
            ],
        }
        if self.keep_tags is not None:
            document["keep_tags"] = self.keep_tags
        return document

    @classmethod
    def from_json(cls, document: object, *, stored: bool = False) -> GCRules:
        """Validate a rules document (a mapping, or its JSON text) into rules. `stored` rules
        were checked when set, perhaps by an earlier, laxer check: their patterns are taken
        as they are (one that matches no name protects nothing), so GC is not stopped."""
        if isinstance(document, (str, bytes)):
            try:
                document = json.loads(document)
            except (ValueError, RecursionError) as error:
                raise InvalidGCRules(f"GC rules are not valid JSON: {error}") from None
        if not isinstance(document, Mapping):
            raise InvalidGCRules(f"GC rules must be a JSON object, not {type(document).__name__}")
        _no_unknown_keys(document, _TOP_KEYS, "GC rules")
        if "default_retention_days" not in document:
            raise InvalidGCRules("GC rules need default_retention_days")
        branches = document.get("branches", [])
        if not isinstance(branches, list):
            raise InvalidGCRules("GC rules' branches must be a list of {branch_id, retention_days}")
        keep_tags = document.get("keep_tags")
        if keep_tags is not None:
            keep_tags = check_pattern(keep_tags, "keep_tags", "tag", stored=stored)
        return cls(
            _days(document["default_retention_days"], "default_retention_days"),
            tuple(_branch_rule(rule, i, stored) for i, rule in enumerate(branches)),
            keep_tags,
        )


def _branch_rule(rule: object, index: int, stored: bool) -> BranchRule:
    where = f"branches[{index}]"
    if not isinstance(rule, Mapping):
        raise InvalidGCRules(f"GC rules' {where} must be an object with branch_id, retention_days")
    _no_unknown_keys(rule, _BRANCH_KEYS, where)
    missing = sorted(_BRANCH_KEYS - set(rule))
    if missing:
        raise InvalidGCRules(f"GC rules' {where} lacks {', '.join(missing)}")
    pattern = check_pattern(rule["branch_id"], f"{where}.branch_id", "branch", stored=stored)
    return BranchRule(pattern, _days(rule["retention_days"], f"{where}.retention_days"))


def _no_unknown_keys(document: Mapping[Any, Any], known: frozenset[str], where: str) -> None:
    unknown = sorted(str(key) for key in document if key not in known)
    if unknown:
        raise InvalidGCRules(
            f"{where} has unknown key(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )


def _days(value: object, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidGCRules(f"GC rules' {where} must be a whole number of days, not {value!r}")
    if not 0 <= value <= MAX_RETENTION_DAYS:
        raise InvalidGCRules(
            f"GC rules' {where} must be between 0 and {MAX_RETENTION_DAYS} days, not {value}"
        )
    return value


def check_pattern(pattern: object, where: str, kind: str, *, stored: bool = False) -> str:
    """A glob that can match a valid branch or tag name: some name made of it, each wildcard
    and `[...]` class standing for a character it admits, is valid and matched by it (an
    unclosed `[`, or `[!]`, which `fnmatch` reads as text, never is)."""
    if not isinstance(pattern, str) or not pattern:
        raise InvalidGCRules(f"GC rules' {where} must be a non-empty {kind} name or pattern")
    if stored:
        return pattern
    tokens = list(_GLOB_TOKEN.finditer(pattern))
    first_error: InvalidName | None = None
    choices = itertools.product(*(_admitted(token.group()) for token in tokens))
    for chosen in itertools.islice(choices, SAMPLES_TRIED):
        sample = _sample(pattern, tokens, chosen)
        try:
            check_ref_name(sample, kind)
        except InvalidName as error:
            first_error = first_error or error
            continue
        if fnmatchcase(sample, pattern):
            return pattern
        first_error = first_error or InvalidName(f"it does not match even {sample!r}")
    raise InvalidGCRules(
        f"GC rules' {where} {pattern!r} matches no valid {kind} name: {first_error}"
    )


def _admitted(glob: str) -> list[str]:
    """Characters the wildcard or class admits, a few of each kind: the stand-ins, then any
    other it names (`é` in `[é]`); the class's own text if it admits none (no valid name
    holds it)."""
    named = [c for c in dict.fromkeys(glob) if c not in "[]!*?"]
    tried = list(dict.fromkeys(_STAND_INS + _CANDIDATES + "".join(named)))
    admitted = [c for c in tried if fnmatchcase(c, glob)]
    kinds: dict[str, str] = {}
    for c in admitted:
        kind = "letter" if c.isalpha() and c.isascii() else "digit" if c.isdigit() else c
        kinds.setdefault(kind, c)
    return list(kinds.values()) or [glob]


def _sample(pattern: str, tokens: list[re.Match[str]], chosen: tuple[str, ...]) -> str:
    parts, at = [], 0
    for token, character in zip(tokens, chosen, strict=True):
        parts += [pattern[at : token.start()], character]
        at = token.end()
    return "".join([*parts, pattern[at:]])


def set_rules(kv: Store, repo: RepositoryRecord, rules: object) -> GCRules:
    """Validate and store the repository's rules, replacing any; returns them. `GCRules`
    made in Python are checked as their document is: stored unchecked, rules no GC run can
    read would stop every run of the repository."""
    document = _document(rules) if isinstance(rules, GCRules) else rules
    checked = GCRules.from_json(document)
    kv.set(repo.partition, RULES_KEY, json.dumps(checked.to_json(), sort_keys=True).encode())
    return checked


def _document(rules: GCRules) -> dict[str, object]:
    """The document `rules` stand for, their fields taken as they are, whatever their types
    (a dataclass does not check them), so that `from_json` judges them."""
    branches: object = rules.branches
    if isinstance(branches, (tuple, list)):
        branches = [
            {"branch_id": rule.branch_id, "retention_days": rule.retention_days}
            if isinstance(rule, BranchRule)
            else rule
            for rule in branches
        ]
    return {
        "default_retention_days": rules.default_retention_days,
        "branches": branches,
        "keep_tags": rules.keep_tags,
    }


def get_rules(kv: Store, repo: RepositoryRecord) -> GCRules | None:
    """The repository's rules, `None` when it has none (GC then keeps every commit)."""
    try:
        value, _ = kv.get(repo.partition, RULES_KEY)
    except NotFound:
        return None
    return GCRules.from_json(value, stored=True)


def delete_rules(kv: Store, repo: RepositoryRecord) -> None:
    kv.delete(repo.partition, RULES_KEY)
