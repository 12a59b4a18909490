"""Units as people read them, for every layer's messages, reports and views."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MICROSECOND = timedelta(microseconds=1)


def human_size(size: int) -> str:
    """Sizes as `ls -lh` and lakectl show them: exact bytes below 1 KiB, one decimal above."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{size} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def timestamp(when: datetime) -> str:
    """UTC, second precision: fixed width keeps streamed `ls` columns aligned."""
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def epoch_micros(when: datetime) -> int:
    """Microseconds since the epoch, exactly: `timestamp() * 10**6` in floats is off by one
    for about one time in a hundred. A naive time is local, as `timestamp()` takes it."""
    aware = when if when.tzinfo is not None else when.astimezone()
    return (aware - EPOCH) // MICROSECOND


def from_epoch_micros(micros: int) -> datetime:
    return EPOCH + micros * MICROSECOND
