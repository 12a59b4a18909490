"""Name rules: repositories as S3 buckets and lakeFS name them, branches and tags as git does."""

from __future__ import annotations

import re

from branchwater.engine.errors import InvalidName

REPOSITORY_NAME_PATTERN = "^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$"
"""What a repository name matches (also the DAGs' params' JSON-schema `pattern`)."""
_REPOSITORY = re.compile(REPOSITORY_NAME_PATTERN)
_REF_FORBIDDEN = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")


def check_repository_name(name: object) -> str:
    if not isinstance(name, str) or not _REPOSITORY.match(name):
        raise InvalidName(
            f"invalid repository name {name!r}: use 3-63 lowercase letters, digits and hyphens, "
            "starting and ending with a letter or digit"
        )
    return name


def check_ref_name(name: object, kind: str = "branch") -> str:
    """Apply git's check-ref-format rules to a branch or tag name."""
    problem = _ref_name_problem(name)
    if problem:
        raise InvalidName(f"invalid {kind} name {name!r}: {problem}")
    assert isinstance(name, str)
    return name


def _ref_name_problem(name: object) -> str | None:
    if not isinstance(name, str) or not name:
        return "it must be a non-empty string"
    if len(name.encode()) > 255:
        return "it must be at most 255 bytes"
    if _REF_FORBIDDEN.search(name):
        return "it must not contain spaces, control characters or any of ~ ^ : ? * [ \\"
    if name == "@" or "@{" in name:
        return "it must not be '@' or contain '@{'"
    if ".." in name or "//" in name:
        return "it must not contain '..' or '//'"
    if name.startswith(("/", "-")) or name.endswith(("/", ".")):
        return "it must not start with '/' or '-' or end with '/' or '.'"
    for part in name.split("/"):
        if part.startswith(".") or part.endswith(".lock"):
            return "no '/'-separated part may start with '.' or end with '.lock'"
    return None
