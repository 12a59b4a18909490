"""Signed, expiring, single-use link tokens (seed: Get/LinkPhysicalAddress).

`get_physical_address` hands out an address with a token that binds it to a repository (by
unique id, so a re-created repository of the same name does not accept it), a branch and an
expiry, signed with HMAC-SHA256. There is no server to hold the key: it is created once per
lake in the KV with `set_if` and read by every process. A token is used up by recording it
in the repository's partition with `set_if`, so two links with one token cannot both win;
the record is swept once the token has expired, as it can no longer be used anyway.

Base64 lets one byte string be spelled many ways (spare bits in the last character, padding,
characters a lenient decoder skips). Only the one spelling `issue` produces is accepted, and
the used-token record is keyed on what the token decodes to, so no respelling is a new token.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from branchwater.engine.errors import (
    InvalidToken,
    TokenAlreadyUsed,
    TokenExpired,
)
from branchwater.engine.gc.addresses import check_data_address
from branchwater.engine.gc.records import ExpiringRecords, from_millis, to_millis
from branchwater.engine.graveler.model import RepositoryRecord
from branchwater.engine.graveler.signing import lake_key, signature
from branchwater.engine.kv import Store
from branchwater.engine.per_process import ChildSafeLock

USED_TOKENS_PREFIX = b"gc/used-link-tokens/"
_VERSION = "v1"
_B64_TEXT = re.compile(r"[A-Za-z0-9_-]*")

Clock = Callable[[], datetime]


def utc_now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class PhysicalAddress:
    """Where to write an object before linking it, and the token that allows the link."""

    address: str
    token: str
    expires: datetime


@dataclass(frozen=True)
class LinkClaim:
    """What a verified token allows: linking `address` on `branch` until `expires`."""

    repository_id: str
    branch: str
    address: str
    expires: datetime
    token_id: str


class LinkTokens:
    """Issues and verifies link tokens with the lake's signing key."""

    def __init__(
        self,
        kv: Store,
        expiry: timedelta,
        clock: Clock = utc_now,
        promising: Callable[[], None] = lambda: None,
    ) -> None:
        """`promising` runs before a token is handed out (`LakeLimits.cover`)."""
        self.kv = kv
        self.expiry = expiry
        self.clock = clock
        self.promising = promising
        self.used = ExpiringRecords(kv, USED_TOKENS_PREFIX)
        self._key: bytes | None = None
        self._lock = ChildSafeLock()

    def signing_key(self) -> bytes:
        with self._lock:
            if self._key is None:
                self._key = lake_key(self.kv)
            return self._key

    def issue(self, repo: RepositoryRecord, branch: str, address: str) -> PhysicalAddress:
        self.promising()
        expires = from_millis(to_millis(self.clock() + self.expiry))
        payload = {"r": repo.unique_id, "b": branch, "a": address, "e": to_millis(expires)}
        body = f"{_VERSION}.{_b64(json.dumps(payload, sort_keys=True).encode())}"
        return PhysicalAddress(address, f"{body}.{_b64(self._sign(body))}", expires)

    def verify(self, repo: RepositoryRecord, branch: str, token: object) -> LinkClaim:
        """Check signature, repository, branch, address and expiry, in that order."""
        if not isinstance(token, str):
            raise InvalidToken(f"a link token must be a string, not {type(token).__name__}")
        payload, canonical = self._signed_payload(token)
        if payload["r"] != repo.unique_id:
            raise InvalidToken(
                f"this link token was issued for another repository, not {repo.name!r}; "
                "get an address from the repository you link into"
            )
        if payload["b"] != branch:
            raise InvalidToken(
                f"this link token was issued for branch {payload['b']!r}, not {branch!r}; "
                "link on the branch that handed out the address"
            )
        token_id = hashlib.sha256(canonical.encode()).hexdigest()[:32]
        claim = LinkClaim(
            repo.unique_id,
            branch,
            check_data_address(payload["a"]),
            from_millis(payload["e"]),
            token_id,
        )
        self.check_live(claim)
        return claim

    def check_live(self, claim: LinkClaim) -> None:
        """`TokenExpired` once the claim has expired. A link checks again right before it
        stages: GC's proof that a linked object is too young to collect needs the stage to
        follow a live check within `OPERATION_MARGIN`, and the steps between the first check
        and the stage (a stat, the token's use, a read of the path) can stall."""
        if self.clock() >= claim.expires:
            raise TokenExpired(
                f"the link token for {claim.address} expired at {claim.expires.isoformat()}; "
                "GC may already treat that object as garbage: write it again at a new address"
            )

    def use(self, repo: RepositoryRecord, claim: LinkClaim) -> None:
        """Use the token up; `TokenAlreadyUsed` if another link used it first."""
        if not self.used.create(repo, claim.expires, claim.token_id, claim.address.encode()):
            raise TokenAlreadyUsed(
                f"the link token for {claim.address} was used already; tokens are single-use: "
                "get a new address for another object"
            )

    def give_back(self, repo: RepositoryRecord, claim: LinkClaim) -> None:
        """Make the token usable again after a link failed before staging anything."""
        self.used.delete(repo, claim.expires, claim.token_id)

    def sweep(self, repo: RepositoryRecord) -> int:
        """Forget used tokens that have expired; returns how many."""
        return self.used.sweep(repo, self.clock())

    def _sign(self, body: str) -> bytes:
        return signature(self.signing_key(), body)

    def _signed_payload(self, token: str) -> tuple[dict[str, Any], str]:
        """The payload, and the token spelled from its decoded bytes (the single-use key)."""
        malformed = InvalidToken(
            "malformed link token; pass the token get_physical_address() returned, unchanged"
        )
        if token.count(".") != 2:
            raise malformed
        version, body, signature = token.split(".")
        if version != _VERSION:
            raise malformed
        try:
            body_bytes, given = _unb64(body), _unb64(signature)
            payload = json.loads(body_bytes)
        except (ValueError, RecursionError, binascii.Error):
            raise malformed from None
        if not hmac.compare_digest(given, self._sign(f"{version}.{body}")):
            raise InvalidToken(
                "link token signature does not match: it was altered, or issued by another lake"
            )
        if not isinstance(payload, dict) or set(payload) != {"r", "b", "a", "e"}:
            raise malformed
        return payload, f"{version}.{_b64(body_bytes)}.{_b64(given)}"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(text: str) -> bytes:
    """Decode only the spelling `_b64` gives (`binascii.Error` otherwise): no padding, no
    characters outside the URL-safe alphabet, no spare bits set."""
    if not _B64_TEXT.fullmatch(text):
        raise binascii.Error("not unpadded URL-safe base64")
    data = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    if _b64(data) != text:
        raise binascii.Error("not the canonical base64 spelling")
    return data
