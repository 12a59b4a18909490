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

DEFAULT_TOKEN_EXPIRY = timedelta(hours=6)
"""lakeFS's GC minimum age: the longest an upload may take between address and link."""
OPERATION_MARGIN = timedelta(minutes=5)
"""The longest an operation may take between its checks and its write, clock skew between
processes included: what GC's safety argument assumes of clients that keep working."""
DEFAULT_COPY_RECORD_TTL = timedelta(days=2)
MIN_COPY_RECORD_TTL = timedelta(hours=1)
"""Shorter and a prepare run could not finish before the records it needs expire."""
DEFAULT_PREPARE_FILE_BYTES = 20 * 1024 * 1024
"""The target size of prepare's Parquet files in lakeFS's GC design."""


@dataclass(frozen=True)
class GCSettings:
    """Token expiry, copy-record lifetime and prepare's file size target for one lake."""

    token_expiry: timedelta = DEFAULT_TOKEN_EXPIRY
    copy_record_ttl: timedelta = DEFAULT_COPY_RECORD_TTL
    prepare_file_bytes: int = DEFAULT_PREPARE_FILE_BYTES

    def __post_init__(self) -> None:
        for name in ("token_expiry", "copy_record_ttl"):
            value = getattr(self, name)
            if not isinstance(value, timedelta) or value <= timedelta(0):
                raise InvalidArgument(f"GC setting {name} must be a positive timedelta")
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
