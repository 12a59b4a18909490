"""Records that live in a repository's KV partition until they expire.

Keys are `<prefix><expiry in epoch milliseconds, 13 digits>/<id>`, so records sort by expiry:
a sweep reads only the expired ones and stops at the first live one.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import NamedTuple

from branchwater.engine.errors import PredicateFailed
from branchwater.engine.graveler.model import RepositoryRecord
from branchwater.engine.kv import Store
from branchwater.engine.units import EPOCH

SCAN_BATCH = 1000
MILLISECOND = timedelta(milliseconds=1)


def to_millis(moment: datetime) -> int:
    """Exact integer milliseconds since the epoch (float timestamps round unpredictably)."""
    return (moment - EPOCH) // MILLISECOND


def from_millis(millis: int) -> datetime:
    return EPOCH + millis * MILLISECOND


class ExpiringRecord(NamedTuple):
    key: bytes
    expires: datetime
    record_id: str
    value: bytes


class ExpiringRecords:
    """One kind of expiring record (`prefix`) in each repository's partition."""

    def __init__(self, kv: Store, prefix: bytes) -> None:
        self.kv = kv
        self.prefix = prefix

    def key(self, expires: datetime, record_id: str) -> bytes:
        return self.prefix + f"{to_millis(expires):013d}/{record_id}".encode()

    def put(self, repo: RepositoryRecord, expires: datetime, record_id: str, value: bytes) -> None:
        self.kv.set(repo.partition, self.key(expires, record_id), value)

    def create(
        self, repo: RepositoryRecord, expires: datetime, record_id: str, value: bytes
    ) -> bool:
        """Write only if absent; False when the record exists already."""
        try:
            self.kv.set_if(repo.partition, self.key(expires, record_id), value, None)
        except PredicateFailed:
            return False
        return True

    def delete(self, repo: RepositoryRecord, expires: datetime, record_id: str) -> None:
        self.kv.delete(repo.partition, self.key(expires, record_id))

    def scan(self, repo: RepositoryRecord) -> Iterator[ExpiringRecord]:
        """Every record still stored, expired or not, soonest expiry first."""
        for key, value in self.kv.scan(repo.partition, self.prefix, SCAN_BATCH):
            if not key.startswith(self.prefix):
                return
            millis, _, record_id = key[len(self.prefix) :].decode().partition("/")
            yield ExpiringRecord(key, from_millis(int(millis)), record_id, value)

    def sweep(self, repo: RepositoryRecord, now: datetime) -> int:
        """Delete the records that expired before `now`; returns how many."""
        removed = 0
        for record in self.scan(repo):
            if record.expires >= now:
                break
            self.kv.delete(repo.partition, record.key)
            removed += 1
        return removed
