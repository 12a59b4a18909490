"""Typed errors for every layer.

Each carries a message a person can act on; callers catch the class, users read the text.
"""

from __future__ import annotations


class BranchwaterError(Exception):
    """Base of every error Branchwater raises on purpose."""


class NotFound(BranchwaterError):
    """A repository, branch, ref, path, key or object does not exist."""


class AlreadyExists(BranchwaterError):
    """Something with that name exists already."""


class Conflict(BranchwaterError):
    """Two sides changed the same thing; the operation cannot decide alone."""


class NoChanges(BranchwaterError):
    """The operation would record nothing new (an empty commit, an up-to-date merge)."""


class PredicateFailed(BranchwaterError):
    """A compare-and-swap found a value other than the one it expected."""


class TooManyTries(BranchwaterError):
    """An optimistic operation kept losing races and gave up after its bounded retries."""


class InvalidName(BranchwaterError, ValueError):
    """A repository, branch or tag name breaks the naming rules."""


class InvalidArgument(BranchwaterError, ValueError):
    """An argument has the wrong type or an impossible value."""


class ConfigurationError(BranchwaterError):
    """A URL or setting cannot be used (unknown scheme, malformed, missing part)."""


class Unavailable(BranchwaterError):
    """A database or object store could not be reached or refused our credentials."""


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


def redact_url(url: str) -> str:
    """Return `url` with any password replaced by `***`, for error messages and logs."""
    scheme_sep = url.find("://")
    if scheme_sep < 0:
        return url
    rest = url[scheme_sep + 3 :]
    at = rest.rfind("@", 0, _authority_end(rest))
    if at < 0:
        return url
    userinfo = rest[:at]
    if ":" not in userinfo:
        return url
    user = userinfo.split(":", 1)[0]
    return f"{url[: scheme_sep + 3]}{user}:***{rest[at:]}"


def _authority_end(rest: str) -> int:
    ends = [i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0]
    return min(ends) if ends else len(rest)
