"""Physical addresses of data objects, and the namespace layout a GC job relies on.

Layout of a repository's storage namespace:

- `data/<slice>/<object id>`: every data object Branchwater writes or links. Addresses are
  stored relative to the namespace, never absolute, so a namespace can be listed and
  compared with the metadata as plain keys.
- A slice name is `<inverted creation time, 12 hex digits>-<6 random hex digits>`, so a
  listing yields the newest slices first, and `slice_created` reads a slice's creation time
  from its name. A process opens a new slice every `slice_seconds` or every
  `objects_per_slice` objects, and only that process writes to it.
- `_branchwater/` (`SPECIAL_PREFIX`): the engine's own state (repository marker, ranges,
  metaranges, GC runs). GC never deletes anything under it, nor anything outside `data/`.
- Imported objects stay where they were: their entries hold the object's full URI
  (`graveler/external.py`), outside every namespace. GC reads such addresses and skips them
  (`external_mask`); an absolute URI into the namespace itself is malformed.

What a GC job may assume: an object younger than the link-token expiry may still be linked,
so it must never be deleted; a slice created after the cutoff holds only such objects and
can be skipped whole, and in older slices the object's own modification time decides.
"""

from __future__ import annotations

import re
import secrets
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone

from branchwater.engine.errors import InvalidAddress, InvalidArgument
from branchwater.engine.per_process import ChildSafeLock

DATA_PREFIX = "data/"
SPECIAL_PREFIX = "_branchwater/"
_MAX_MILLIS = 16**12 - 1
ID_PATTERN = r"[0-9a-f]{12}-[0-9a-f]{6}"
"""A time-ordered id (`newest_first_id`): slice names and GC run ids alike."""
_OBJECT_ID_PATTERN = r"[0-9A-Za-z][0-9A-Za-z_.-]*"
_ID = re.compile(ID_PATTERN)
DATA_ADDRESS_PATTERN = rf"^{DATA_PREFIX}{ID_PATTERN}/{_OBJECT_ID_PATTERN}$"
"""What `check_data_address` accepts, as a regular expression Java (Spark), RE2 (Arrow) and
Python share. Java's and Python's `$` also match before a final newline: match it whole
(`is_data_address`, Java's `matches`) where the text may hold one."""
_DATA_ADDRESS = re.compile(DATA_ADDRESS_PATTERN)


def newest_first_id(created: datetime) -> str:
    """A unique id that sorts newest first and encodes `created` (milliseconds)."""
    inverted = _MAX_MILLIS - int(created.timestamp() * 1000)
    return f"{inverted:012x}-{secrets.token_hex(3)}"


def newest_first_time(name: str) -> datetime:
    """The creation time encoded in an id from `newest_first_id`."""
    malformed = InvalidArgument(
        f"{name!r} is not a time-ordered id such as a slice name or a GC run id "
        "(12 hex digits of a time, '-', 6 hex digits)"
    )
    if not isinstance(name, str) or not _ID.fullmatch(name):
        raise malformed
    inverted = int(name.split("-", 1)[0], 16)
    try:
        return datetime.fromtimestamp((_MAX_MILLIS - inverted) / 1000, timezone.utc)
    except (ValueError, OverflowError, OSError):
        raise InvalidArgument(
            f"{name!r} has the form of a time-ordered id but its first 12 hex digits are no "
            "time between the years 1 and 9999: pass an id a run or slice was given"
        ) from None


slice_name = newest_first_id
slice_created = newest_first_time


def is_data_address(text: object) -> bool:
    """Whether `text` is a data address, end to end (`DATA_ADDRESS_PATTERN` matched whole)."""
    return isinstance(text, str) and _DATA_ADDRESS.fullmatch(text) is not None


def check_data_address(address: object) -> str:
    """Accept only `data/<slice>/<object id>` relative to the namespace; anything else would
    be an object GC cannot account for (or one it might delete under another repository)."""
    if not isinstance(address, str):
        raise InvalidAddress(f"a physical address must be a string, not {type(address).__name__}")
    if "://" in address or address.startswith("/"):
        raise InvalidAddress(
            f"physical address {address!r} is absolute; Branchwater links only addresses it "
            "handed out, relative to the repository's namespace (data/<slice>/<object id>)"
        )
    if not is_data_address(address):
        raise InvalidAddress(
            f"physical address {address!r} is not of the form data/<slice>/<object id>; "
            "get one from get_physical_address()"
        )
    return address


@dataclass
class _Slice:
    name: str
    opened: float
    objects: int = 0


class AddressAllocator:
    """Hands out fresh addresses; thread-safe, one current slice per allocator."""

    def __init__(
        self,
        slice_seconds: float = 3600,
        objects_per_slice: int = 100_000,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.slice_seconds = slice_seconds
        self.objects_per_slice = objects_per_slice
        self._clock = clock
        self._current: _Slice | None = None
        self._lock = ChildSafeLock()

    def next_address(self) -> str:
        with self._lock:
            now = self._clock()
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
