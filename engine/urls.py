"""URL redaction, in a module of its own so every layer (`kv`, `objects`, ...) can import it
for its error messages and logs without pulling in anything else.

Redaction never trusts a URL to be well formed: a password may hold unencoded `/`, `#`, `?`,
`@` or `:`, so the secret is taken to run from the first `:` of the authority to the *last*
`@` of the URL. That may hide more than the password (an `@` in a query), never less.
Query parameters named like secrets (`password=`, `aws_secret_access_key=`, `token=`) are
hidden too.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import unquote

MASK = "***"
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*")
_SECRET_PARAM = re.compile(r"([?&;][^=&;#]*(?:pass|secret|token)[^=&;#]*=)([^&;#]*)", re.I)
_RESERVED = re.compile(r"[:/?#@\[\]%&;=]+")
MIN_SECRET_FRAGMENT = 4
"""Pieces of a secret at least this long are scrubbed from messages on their own: a parser
that cut the URL at a reserved character echoes such a piece (`failed to resolve host
'cretXw7@…'`). Shorter ones would mask ordinary words and digits."""


def url_scheme(url: str) -> str:
    """The scheme before `:` (lowercase, "" if none), without parsing the rest: unlike
    `urlsplit`, it cannot fail on a malformed authority (an unclosed IPv6 bracket)."""
    scheme, sep, _ = url.partition(":")
    return scheme.lower() if sep and _SCHEME.fullmatch(scheme) else ""


def redact_url(url: str) -> str:
    """Return `url` with any password (and secret query parameter) replaced by `***`, for
    error messages and logs."""
    span = _secret_span(url)
    if span is not None:
        url = f"{url[: span[0]]}{MASK}{url[span[1] :]}"
    return _SECRET_PARAM.sub(lambda m: m.group(1) + MASK, url)


def url_password(url: str) -> str | None:
    """The password as redaction sees it (percent-decoded), `None` if there is none: a
    parser that finds another one was misled by an unencoded reserved character."""
    span = _secret_span(url)
    return None if span is None else unquote(url[span[0] : span[1]])


def url_secrets(url: str) -> list[str]:
    """Every form in which `url`'s secrets might be echoed, longest first: each secret as
    written and percent-decoded, and its pieces between reserved characters."""
    found: set[str] = set()
    span = _secret_span(url)
    raw = [url[span[0] : span[1]]] if span is not None else []
    raw += [m.group(2) for m in _SECRET_PARAM.finditer(url[span[1] if span else 0 :])]
    for secret in raw:
        for form in (secret, unquote(secret)):
            found.add(form)
            found.update(p for p in _RESERVED.split(form) if len(p) >= MIN_SECRET_FRAGMENT)
    found.discard("")
    return sorted(found, key=len, reverse=True)


def scrub(text: str, secrets: Iterable[str]) -> str:
    """`text` (a driver's message) with every one of `secrets` (`url_secrets`) masked."""
    for secret in secrets:
        text = text.replace(secret, MASK)
    return text


def _secret_span(url: str) -> tuple[int, int] | None:
    """Where the password is: from after the first `:` of the authority to the last `@`."""
    start = _authority_start(url)
    at = url.rfind("@", start)
    colon = url.find(":", start, at)
    if at < 0 or colon < 0:
        return None
    return colon + 1, at


def _authority_start(url: str) -> int:
    scheme = url_scheme(url)
    if not scheme:
        return 0
    return len(scheme) + (3 if url.startswith("://", len(scheme)) else 1)
