"""Name rules: repositories as S3 buckets and lakeFS name them, branches and tags as git does,
and what any name or object path must be to become a KV key (a string of valid Unicode).

A branch or tag may not be named like a full commit id (git refuses such refs too): it would
shadow the commit a reader pins. Resolution reads a full commit id as the commit first."""

from __future__ import annotations

import re
import unicodedata

from branchwater.engine.errors import InvalidArgument, InvalidName

REPOSITORY_NAME_PATTERN = "^[a-z0-9][a-z0-9-]{1,61}[a-z0-9]$"
"""What a repository name matches (also the DAGs' params' JSON-schema `pattern`)."""
_REPOSITORY = re.compile(REPOSITORY_NAME_PATTERN)
_REF_FORBIDDEN = re.compile(r"[\x00-\x20\x7f~^:?*\[\\]")
_HEX_ID = re.compile(r"[0-9a-f]{64}")
_UNSEEN = frozenset({"Cc", "Cf", "Zl", "Zp", "Zs"})
"""Unicode categories of characters a name may not hold beyond ASCII: controls, format
characters (zero-width, direction overrides), line and paragraph breaks, and spaces: a name
must read as it is, on a terminal and in a listing."""


def is_hex_id(text: str) -> bool:
    """Whether `text` has the form of a commit, range or metarange id: a SHA-256 in
    lowercase hex."""
    return _HEX_ID.fullmatch(text) is not None


def name_key(name: object, kind: str) -> bytes:
    """`name` as key bytes; a name that cannot be a key (not a string, a lone surrogate) is
    an `InvalidName` rather than a crash deep in the store."""
    problem = _unicode_problem(name)
    if problem:
        raise InvalidName(f"invalid {kind} {name!r}: {problem}")
    assert isinstance(name, str)
    return name.encode()


def check_path(path: object, what: str = "object path", *, empty: bool = False) -> str:
    """An object path (or a listing's prefix or start, which may be `empty`) that can be a
    key: a string of valid Unicode without NUL."""
    problem = _path_problem(path, empty)
    if problem:
        raise InvalidArgument(f"invalid {what} {path!r}: {problem}")
    assert isinstance(path, str)
    return path


MAX_PATH_BYTES = 1024
"""The longest object path a write takes, in UTF-8 bytes: S3's limit on a key, and
DynamoDB's on a sort key, which a staged path is."""


def check_new_path(path: object, what: str = "object path") -> str:
    """`check_path` for a path a write creates, at most `MAX_PATH_BYTES` long. Reads and
    deletes take any path that can be a key, so one written before the limit stays readable
    and removable."""
    checked = check_path(path, what)
    size = len(checked.encode())
    if size > MAX_PATH_BYTES:
        raise InvalidArgument(
            f"invalid {what} {checked[:60]!r}…: it is {size:,} bytes long, and a path may be "
            f"at most {MAX_PATH_BYTES:,} (as an S3 key)"
        )
    return checked


def _path_problem(path: object, empty: bool) -> str | None:
    problem = _unicode_problem(path)
    if problem or not isinstance(path, str):
        return problem
    if "\x00" in path:
        return "it must not contain NUL"
    if not path and not empty:
        return "it must not be empty"
    return None


def _unicode_problem(text: object) -> str | None:
    if not isinstance(text, str):
        return f"it must be a string, not {type(text).__name__}"
    try:
        text.encode()
    except UnicodeEncodeError:
        return "it must be valid Unicode: no lone surrogates (non-UTF-8 bytes from a shell)"
    return None


def _unseen_character(name: str) -> str | None:
    for char in name:
        if char > "\x7f" and unicodedata.category(char) in _UNSEEN:
            return f"U+{ord(char):04X} {unicodedata.name(char, '')}".rstrip()
    return None


def check_repository_name(name: object) -> str:
    if not isinstance(name, str) or not _REPOSITORY.fullmatch(name):
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
    problem = _unicode_problem(name)
    if problem:
        return problem
    if is_hex_id(name):
        return "it must not be a full commit id (64 hex digits), which names that commit"
    if len(name.encode()) > 255:
        return "it must be at most 255 bytes"
    if _REF_FORBIDDEN.search(name):
        return "it must not contain spaces, control characters or any of ~ ^ : ? * [ \\"
    unseen = _unseen_character(name)
    if unseen:
        return f"it must not contain invisible, spacing or line-breaking characters ({unseen})"
    if unicodedata.normalize("NFC", name) != name:
        return (
            "it must be in Unicode's composed form (NFC), so that two names that look alike "
            f"are one name: use {unicodedata.normalize('NFC', name)!r}"
        )
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
