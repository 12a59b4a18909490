"""How an address came to be referenced, as far as GC's own records remember: the shallow
copies recorded for it and the link tokens used on it. `gc explain` names these beside the
commits holding an address, so a user learns which operation made a reference it sees."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from branchwater.engine.gc.context import GCContext
from branchwater.engine.graveler.model import RepositoryRecord


@dataclass(frozen=True)
class Provenance:
    """One recorded operation: a shallow `copy` on `branch` at `at`, or a `link` made before
    its token expired at `at` (a used token records its address, not its branch)."""

    operation: Literal["copy", "link"]
    at: datetime
    branch: str | None = None

    def text(self) -> str:
        if self.operation == "copy":
            return f"a shallow copy on branch {self.branch} at {self.at.isoformat()}"
        return f"a link with a token valid until {self.at.isoformat()}"


def provenance(gc: GCContext, repo: RepositoryRecord, address: str) -> list[Provenance]:
    """The copies and links recorded for `address`, oldest first (records are kept until
    they expire: a copy record `copy_record_ttl`, a used token its own expiry)."""
    found = [
        Provenance("copy", record.created, record.branch)
        for record in gc.copies.records(repo)
        if record.address == address
    ]
    found += [
        Provenance("link", record.expires)
        for record in gc.tokens.used.scan(repo)
        if record.value == address.encode()
    ]
    return sorted(found, key=lambda p: p.at)
