"""The GC limits every process of a lake has promised its clients, kept in the KV: the
longest link-token expiry any of them hands out tokens with, and the shortest copy-record
lifetime any of them records copies with.

Both are settings of one connection (`GCSettings`). A GC run must judge ages and its own
duration by what every client was promised, not by its own process's settings: a client
with 24-hour tokens would otherwise see its upload collected at 6 hours, and a prepare run
longer than a client's one-hour copy records would miss them. A process widens the record
before it hands out its first token or records its first copy, so a run that reads it finds
every promise made before the run started. The record only widens: a lake that once handed
out 24-hour tokens keeps GC's minimum age above 24 hours (`--min-age` still overrides it).
"""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta

from branchwater.engine.errors import CorruptedData, NotFound, PredicateFailed
from branchwater.engine.gc.settings import GCSettings
from branchwater.engine.graveler.refs import GRAVELER_PARTITION
from branchwater.engine.kv import Store
from branchwater.engine.per_process import ChildSafeLock

LIMITS_KEY = b"gc/lake-limits"


class LakeLimits:
    """This connection's view of the lake-wide record."""

    def __init__(self, kv: Store, settings: GCSettings) -> None:
        self.kv = kv
        self.settings = settings
        self._covered = False
        self._lock = ChildSafeLock()

    def cover(self) -> None:
        """Widen the record to this process's settings, once per connection, before a
        promise is made under them."""
        with self._lock:
            if self._covered:
                return
            while True:
                stored, predicate = self._read()
                wanted = _encode(_widest(stored, self.settings))
                if stored is not None and _encode(stored) == wanted:
                    break
                try:
                    self.kv.set_if(GRAVELER_PARTITION, LIMITS_KEY, wanted, predicate)
                    break
                except PredicateFailed:
                    continue
            self._covered = True

    def settings_for_runs(self) -> GCSettings:
        """This process's settings with the lake's longest token expiry and shortest copy
        lifetime: what a GC run's minimum age and duration limit are computed from."""
        stored, _ = self._read()
        return _widest(stored, self.settings)

    def _read(self) -> tuple[GCSettings | None, bytes | None]:
        try:
            got = self.kv.get(GRAVELER_PARTITION, LIMITS_KEY)
        except NotFound:
            return None, None
        return _decode(got.value), got.predicate


def _widest(stored: GCSettings | None, ours: GCSettings) -> GCSettings:
    if stored is None:
        return ours
    return dataclasses.replace(
        ours,
        token_expiry=max(stored.token_expiry, ours.token_expiry),
        copy_record_ttl=min(stored.copy_record_ttl, ours.copy_record_ttl),
    )


def _encode(settings: GCSettings) -> bytes:
    document = {
        "token_expiry_seconds": settings.token_expiry.total_seconds(),
        "copy_record_ttl_seconds": settings.copy_record_ttl.total_seconds(),
    }
    return json.dumps(document, sort_keys=True).encode()


def _decode(value: bytes) -> GCSettings:
    try:
        document = json.loads(value)
        return GCSettings(
            token_expiry=timedelta(seconds=document["token_expiry_seconds"]),
            copy_record_ttl=timedelta(seconds=document["copy_record_ttl_seconds"]),
        )
    except (ValueError, TypeError, KeyError, OverflowError) as exc:
        raise CorruptedData(
            f"the lake's GC limits record is unreadable ({exc}): GC cannot know how long "
            "link tokens may live; restore it or delete the key to start over"
        ) from None
