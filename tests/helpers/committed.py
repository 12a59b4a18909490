"""Committed-layer data: entries, range policies and an object store that counts reads."""

from __future__ import annotations

import random
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone
from typing import TYPE_CHECKING

from branchwater.engine.graveler.committed import RangePolicy
from branchwater.engine.graveler.committed.format import RANGES_PREFIX
from branchwater.engine.graveler.model import Entry
from branchwater.engine.objects import ObjectInfo
from branchwater.engine.objects.local import LocalObjectStore

if TYPE_CHECKING:
    pass


T0 = datetime(2024, 5, 1, 12, 0, tzinfo=UTC)

POLICIES = {
    "hash": RangePolicy(target_entries=7, max_entries=1_000, max_bytes=10**9),
    "tiny": RangePolicy(target_entries=2, max_entries=5, max_bytes=10**9),
    "entry-cap": RangePolicy(target_entries=10**6, max_entries=6, max_bytes=10**9),
    "byte-cap": RangePolicy(target_entries=50, max_entries=1_000, max_bytes=300),
}


class SpyStore(LocalObjectStore):
    """A real local store that records the keys it is asked to write and read."""

    def __init__(self, url: str) -> None:
        super().__init__(url)
        self.puts: list[str] = []
        self.gets: list[str] = []

    def put(self, key: str, data: bytes) -> ObjectInfo:
        self.puts.append(key)
        return super().put(key, data)

    def put_if_absent(self, key: str, encode: Callable[[], bytes]) -> bool:
        def recorded() -> bytes:
            self.puts.append(key)
            return encode()

        return super().put_if_absent(key, recorded)

    def get(self, key: str) -> bytes:
        self.gets.append(key)
        return super().get(key)

    def range_reads(self) -> int:
        return sum(key.startswith(RANGES_PREFIX) for key in self.gets)

    def reset(self) -> None:
        self.puts.clear()
        self.gets.clear()


def entry(
    path: str, n: int = 0, *, tz: timezone = UTC, metadata: dict[str, str] | None = None
) -> Entry:
    return Entry(
        path,
        f"data/g1/{n:08x}-{path}",
        n * 11,
        f"sha-{n}",
        (T0 + timedelta(seconds=n, microseconds=n)).astimezone(tz),
        metadata or {},
    )


def random_entries(rng: random.Random, count: int) -> list[Entry]:
    """Sorted entries with unicode paths, metadata on some, mtimes in several time zones."""
    paths = {f"d{rng.randrange(6)}/é{rng.randrange(100_000):05d}" for _ in range(count)}
    zones = [UTC, timezone(timedelta(hours=2)), timezone(timedelta(hours=-7, minutes=-30))]
    return [
        entry(
            path,
            rng.randrange(10**6),
            tz=rng.choice(zones),
            metadata={"k": str(n), "ü": "v"} if rng.random() < 0.3 else None,
        )
        for n, path in enumerate(sorted(paths))
    ]
