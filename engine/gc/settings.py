"""The time limits uncommitted GC stands on, in one place so they stay consistent.

A link token lets its holder add an object to the lake until it expires, so GC must leave
alone every object younger than the token expiry, plus the time a link may take between
checking its token and staging its entry: the default minimum age is never shorter.
Copy records must outlive any prepare run, which refuses to finish when it ran longer.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from branchwater.engine.errors import InvalidArgument
from branchwater.engine.graveler.fence import OPERATION_MARGIN

DEFAULT_TOKEN_EXPIRY = timedelta(hours=6)
"""lakeFS's GC minimum age: the longest an upload may take between address and link."""
DEFAULT_COPY_RECORD_TTL = timedelta(days=2)
MIN_COPY_RECORD_TTL = timedelta(hours=1)
"""Shorter and a prepare run could not finish before the records it needs expire."""
DEFAULT_PREPARE_FILE_BYTES = 20 * 1024 * 1024
"""The target size of prepare's Parquet files in lakeFS's GC design."""
LONGEST = timedelta(days=36_500)
"""A century: the longest any GC age, lifetime, lease or retention may be. Dates a run
computes from them stay far from the calendar's ends (years 1 and 9999), so a mistyped
duration is refused where it is given instead of overflowing inside a run."""


def check_duration(what: str, value: object, *, zero: bool = False) -> timedelta:
    """`value` if it is a `timedelta` above 0 (from 0, with `zero`) and at most `LONGEST`;
    else `InvalidArgument` naming `what`."""
    if isinstance(value, timedelta) and timedelta(0) <= value <= LONGEST and (zero or value):
        return value
    shown = str(value) if isinstance(value, timedelta) else repr(value)
    raise InvalidArgument(
        f"{what} must be a duration {'from 0' if zero else 'above 0'} up to "
        f"{LONGEST.days} days, not {shown}"
    )


@dataclass(frozen=True)
class GCSettings:
    """Token expiry, copy-record lifetime and prepare's file size target for one lake."""

    token_expiry: timedelta = DEFAULT_TOKEN_EXPIRY
    copy_record_ttl: timedelta = DEFAULT_COPY_RECORD_TTL
    prepare_file_bytes: int = DEFAULT_PREPARE_FILE_BYTES

    def __post_init__(self) -> None:
        for name in ("token_expiry", "copy_record_ttl"):
            check_duration(f"GC setting {name}", getattr(self, name))
        if self.copy_record_ttl < MIN_COPY_RECORD_TTL:
            raise InvalidArgument(
                f"GC setting copy_record_ttl must be at least {MIN_COPY_RECORD_TTL}: copy "
                "records must outlive any prepare run"
            )
        if not isinstance(self.prepare_file_bytes, int) or self.prepare_file_bytes < 1:
            raise InvalidArgument("GC setting prepare_file_bytes must be a positive integer")

    @property
    def default_min_age(self) -> timedelta:
        """The youngest object GC may delete by default: older than any a live token, or a
        link that checked one within `OPERATION_MARGIN`, can still stage."""
        return max(DEFAULT_TOKEN_EXPIRY, self.token_expiry) + OPERATION_MARGIN
