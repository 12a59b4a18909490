"""URL redaction, in a module of its own so every layer (`kv`, `objects`, ...) can import it
for its error messages and logs without pulling in anything else."""

from __future__ import annotations


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
