"""Physical addresses of data objects: `data/<slice>/<object id>`.

Slice names start with the inverted creation time, so listing a namespace yields the newest
slices first and GC can stop early at slices older than what it already swept. A process
opens a new slice every `slice_seconds` or every `objects_per_slice` objects.
"""

from __future__ import annotations

import secrets
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timezone

from branchwater.engine.errors import InvalidArgument

DATA_PREFIX = "data/"
_MAX_MILLIS = 16**12 - 1


def slice_name(created: datetime) -> str:
    inverted = _MAX_MILLIS - int(created.timestamp() * 1000)
    return f"{inverted:012x}-{secrets.token_hex(3)}"


def slice_created(name: str) -> datetime:
    """The creation time encoded in a slice name."""
    try:
        inverted = int(name.split("-", 1)[0], 16)
    except ValueError:
        raise InvalidArgument(f"{name!r} is not a slice name") from None
    return datetime.fromtimestamp((_MAX_MILLIS - inverted) / 1000, timezone.utc)


@dataclass
class _Slice:
    name: str
    opened: float
    objects: int = 0


class AddressAllocator:
    """Hands out fresh addresses; thread-safe, one current slice per allocator."""

    def __init__(self, slice_seconds: float = 3600, objects_per_slice: int = 100_000) -> None:
        self.slice_seconds = slice_seconds
        self.objects_per_slice = objects_per_slice
        self._current: _Slice | None = None
        self._lock = threading.Lock()

    def next_address(self) -> str:
        with self._lock:
            now = time.time()
            current = self._current
            if (
                current is None
                or now - current.opened >= self.slice_seconds
                or current.objects >= self.objects_per_slice
            ):
                current = _Slice(slice_name(datetime.fromtimestamp(now, timezone.utc)), now)
                self._current = current
            current.objects += 1
            return f"{DATA_PREFIX}{current.name}/{uuid.uuid4().hex}"
