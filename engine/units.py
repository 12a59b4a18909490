"""Units as people read them, for every layer's messages, reports and views."""

from __future__ import annotations

from datetime import UTC, datetime


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
