"""One GC run per repository at a time: an expiring lease in the repository's KV partition.

Two GC runs on one repository (two Airflow runs, a CLI run racing a DAG) would compute their
candidates from each other's half-written state and chain optimized runs on a base the other
is still sweeping. There is no server to hold a lock, so the lease is one KV value taken and
renewed with compare-and-swap: whoever's `set_if` lands holds it. It expires, so a run that
crashed (or was killed) blocks the next one only until its lease runs out; a live run keeps
renewing it in the background. Releasing also goes through `set_if`, so a run whose lease
expired and was taken over never removes its successor's.
"""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from types import TracebackType

from branchwater.engine.errors import GCRunLocked, InvalidArgument, NotFound, PredicateFailed
from branchwater.engine.gc.records import from_millis, to_millis
from branchwater.engine.gc.settings import check_duration
from branchwater.engine.gc.tokens import Clock
from branchwater.engine.graveler.model import RepositoryRecord
from branchwater.engine.kv import Store

RUN_LOCK_KEY = b"gc/run-lock"
DEFAULT_LEASE = timedelta(minutes=5)
"""A crashed run blocks the next for at most this long; a live one renews every third of it."""
SHORTEST_LEASE = timedelta(seconds=1)
"""A shorter lease would renew faster than a remote KV store answers: always looking
lapsed, and its renewal thread writing without pause."""


def check_lease(ttl: object) -> timedelta:
    """`ttl` if it is a lease's life: a duration from `SHORTEST_LEASE` on; else
    `InvalidArgument`."""
    checked = check_duration("a GC run lease", ttl)
    if checked < SHORTEST_LEASE:
        raise InvalidArgument(
            f"a GC run lease must last at least {SHORTEST_LEASE.total_seconds():g} s, not "
            f"{checked}: it is renewed every third of it"
        )
    return checked


@dataclass(frozen=True)
class LeaseRecord:
    """Who holds (or last held) the lease, and until when."""

    holder: str
    token: str
    acquired: datetime
    expires: datetime
    released: bool = False

    def encode(self) -> bytes:
        return json.dumps(
            {
                "holder": self.holder,
                "token": self.token,
                "acquired": to_millis(self.acquired),
                "expires": to_millis(self.expires),
                "released": self.released,
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def decode(cls, value: bytes) -> LeaseRecord:
        raw = json.loads(value)
        return cls(
            raw["holder"],
            raw["token"],
            from_millis(raw["acquired"]),
            from_millis(raw["expires"]),
            bool(raw.get("released", False)),
        )

    def live(self, now: datetime) -> bool:
        return not self.released and now < self.expires


class GCRunLease:
    """A held lease: renewed in the background while the `with` block runs, released after.

    `check()` raises `GCRunLocked` once the lease was lost (not renewed in time and taken
    over); a run calls it before it deletes anything."""

    def __init__(self, kv: Store, repo: RepositoryRecord, clock: Clock, ttl: timedelta) -> None:
        self._kv = kv
        self._repo = repo
        self._clock = clock
        self.ttl = check_lease(ttl)
        self.record: LeaseRecord | None = None
        self._value: bytes | None = None
        self._lost: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._renewer: threading.Thread | None = None

    @property
    def holder(self) -> str:
        assert self.record is not None
        return self.record.holder

    def acquire(self, holder: str) -> GCRunLease:
        """Take the lease if nobody holds a live one, else raise `GCRunLocked` naming them."""
        if not isinstance(holder, str):
            raise InvalidArgument(f"a GC run lease's holder is a text, not {type(holder).__name__}")
        partition = self._repo.partition
        try:
            current, predicate = self._kv.get(partition, RUN_LOCK_KEY)
        except NotFound:
            current, predicate = None, None
        now = self._clock()
        if current is not None:
            held = LeaseRecord.decode(current)
            if held.live(now):
                raise _locked(self._repo, held)
        record = LeaseRecord(holder, uuid.uuid4().hex, now, now + self.ttl)
        try:
            self._kv.set_unique_if(partition, RUN_LOCK_KEY, record.encode(), predicate)
        except PredicateFailed:
            raise _locked(self._repo, self.current() or record) from None
        self.record, self._value = record, record.encode()
        return self

    def current(self) -> LeaseRecord | None:
        """The lease as stored now (live or not), or None when no run ever took it."""
        try:
            value, _ = self._kv.get(self._repo.partition, RUN_LOCK_KEY)
        except NotFound:
            return None
        return LeaseRecord.decode(value)

    def renew(self) -> None:
        """Push the expiry one `ttl` ahead; raises `GCRunLocked` if the lease was lost."""
        with self._lock:
            if self._lost is not None:
                raise GCRunLocked(self._lost)
            assert self.record is not None and self._value is not None
            record = replace(self.record, expires=self._clock() + self.ttl)
            try:
                self._kv.set_unique_if(
                    self._repo.partition, RUN_LOCK_KEY, record.encode(), self._value
                )
            except PredicateFailed:
                now_held = self.current()
                taker = ""
                if now_held is not None and now_held.live(self._clock()):
                    taker = f" by {now_held.holder!r}"
                self._lost = (
                    f"GC run lease of {self.record.holder!r} on repository {self._repo.name!r} "
                    f"expired and was taken over{taker}; this run stops before deleting more"
                )
                raise GCRunLocked(self._lost) from None
            self.record, self._value = record, record.encode()

    def check(self) -> None:
        """Raise `GCRunLocked` unless the lease is still this run's (renewing it)."""
        self.renew()

    def release(self) -> None:
        """Mark the lease released, unless it was taken over meanwhile (then leave it)."""
        self._stop_renewing()
        with self._lock:
            if self.record is None or self._value is None or self._lost is not None:
                return
            released = replace(self.record, released=True)
            try:
                self._kv.set_if(self._repo.partition, RUN_LOCK_KEY, released.encode(), self._value)
            except PredicateFailed:
                return
            self.record, self._value = released, released.encode()

    def _renew_in_background(self) -> None:
        interval = self.ttl.total_seconds() / 3

        def loop() -> None:
            while not self._stop.wait(interval):
                try:
                    self.renew()
                except GCRunLocked:
                    return

        self._renewer = threading.Thread(target=loop, name="gc-run-lease", daemon=True)
        self._renewer.start()

    def _stop_renewing(self) -> None:
        self._stop.set()
        if self._renewer is not None and self._renewer is not threading.current_thread():
            self._renewer.join()

    def __enter__(self) -> GCRunLease:
        if self.record is None:
            raise InvalidArgument("acquire the GC run lease before entering it")
        self._renew_in_background()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.release()


def _locked(repo: RepositoryRecord, held: LeaseRecord) -> GCRunLocked:
    return GCRunLocked(
        f"another GC run holds repository {repo.name!r}: {held.holder} (since "
        f"{held.acquired.isoformat(timespec='seconds')}, lease until "
        f"{held.expires.isoformat(timespec='seconds')}); wait for it to finish, or for its "
        "lease to expire if it crashed"
    )


def refuse_while_running(kv: Store, repo: RepositoryRecord, clock: Clock) -> None:
    """`GCRunLocked` while a GC run holds the repository's lease, naming it: for an
    operation a run's mark cannot see (a restore of refs) and that must not interleave with
    its sweep."""
    held = GCRunLease(kv, repo, clock, DEFAULT_LEASE).current()
    if held is not None and held.live(clock()):
        raise _locked(repo, held)


def acquire_run_lease(
    kv: Store, repo: RepositoryRecord, clock: Clock, holder: str, ttl: timedelta = DEFAULT_LEASE
) -> GCRunLease:
    return GCRunLease(kv, repo, clock, ttl).acquire(holder)
