"""The committed layer: immutable ranges and metaranges in a repository's object store.

One concept per module, each using only those listed before it: `format` (the stored form of
ranges and metaranges, their ids and where ranges end), `range_cache` (verified ranges shared
on local disk by the machine's processes), `storage` (ranges and metaranges by id, verified,
with in-process caches), `writer` (`MetarangeWriter`), `apply` and `diff` (range by range,
reusing or skipping what did not change), and `store` (`CommittedStore`, the facade).
"""

from branchwater.engine.graveler.committed.apply import Replacements
from branchwater.engine.graveler.committed.format import EMPTY_METARANGE_ID, RangeInfo, RangePolicy
from branchwater.engine.graveler.committed.range_cache import (
    CACHE_DIR_ENV,
    DEFAULT_MAX_BYTES,
    RangeCache,
    default_cache_dir,
)
from branchwater.engine.graveler.committed.storage import RangeStorage
from branchwater.engine.graveler.committed.store import CommittedStore
from branchwater.engine.graveler.committed.writer import ChangeItem, MetarangeWriter

__all__ = [
    "CACHE_DIR_ENV",
    "DEFAULT_MAX_BYTES",
    "EMPTY_METARANGE_ID",
    "ChangeItem",
    "CommittedStore",
    "MetarangeWriter",
    "RangeCache",
    "RangeInfo",
    "RangePolicy",
    "RangeStorage",
    "Replacements",
    "default_cache_dir",
]
