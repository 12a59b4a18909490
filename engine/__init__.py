"""Branchwater engine: versioned metadata for a data lake on a KV store and an object store.

`from branchwater.engine import Lake` is the entry point. Exports load lazily, so importing
`branchwater.engine.kv` alone (as KV workers do) does not pull in pyarrow.
"""

from __future__ import annotations

from typing import Any

from branchwater.engine.errors import (
    AlreadyExists,
    AlreadyRecorded,
    BranchProtected,
    BranchwaterError,
    BucketNotFound,
    ChangesDropped,
    ChecksMissing,
    CommitExpired,
    ConfigurationError,
    Conflict,
    CorruptedData,
    DirtyBranch,
    GateFailed,
    GCRunLocked,
    InvalidAddress,
    InvalidArgument,
    InvalidGCRules,
    InvalidImportSource,
    InvalidName,
    InvalidToken,
    LakeClosed,
    LakeNotFound,
    MergeConflict,
    MergeRaceLost,
    NoChanges,
    NotFound,
    OutcomeUnknown,
    PathExists,
    PredicateFailed,
    ReadOnlyRef,
    RunExpired,
    StaleGCMark,
    TokenAlreadyUsed,
    TokenExpired,
    TooManyTries,
    Unavailable,
)
from branchwater.engine.urls import redact_url, url_secrets

_LAZY = {
    "Lake": "branchwater.engine.api",
    "Repository": "branchwater.engine.api",
    "Branch": "branchwater.engine.api",
    "Ref": "branchwater.engine.api",
    "Entry": "branchwater.engine.graveler.model",
    "Change": "branchwater.engine.graveler.model",
    "Commit": "branchwater.engine.graveler.model",
    "Tag": "branchwater.engine.graveler.model",
    "MergeResult": "branchwater.engine.graveler.merge",
    "ImportResult": "branchwater.engine.graveler.imports",
    "ProtectionRule": "branchwater.engine.graveler.protection",
    "ProtectionChange": "branchwater.engine.graveler.protection",
    "CheckResult": "branchwater.engine.graveler.checks",
    "CompactionPolicy": "branchwater.engine.graveler.compaction",
    "CompactionResult": "branchwater.engine.graveler.compaction",
    "CompactionStatus": "branchwater.engine.graveler.compaction",
    "MAX_SEALED_TOKENS": "branchwater.engine.graveler.compaction",
    "GCSettings": "branchwater.engine.gc.settings",
    "GCRules": "branchwater.engine.gc.retention.rules",
    "BranchRule": "branchwater.engine.gc.retention.rules",
    "PhysicalAddress": "branchwater.engine.gc.tokens",
    "PreparedRun": "branchwater.engine.gc.prepare",
    "GCRunLease": "branchwater.engine.gc.runlock",
    "CommittedLayout": "branchwater.engine.gc.inputs",
    "UncommittedRun": "branchwater.engine.gc.inputs",
    "BranchwaterFileSystem": "branchwater.engine.filesystem",
    "ObjectStore": "branchwater.engine.objects",
    "open_object_store": "branchwater.engine.objects",
    "check_s3_options": "branchwater.engine.objects",
    "shared_object_store": "branchwater.engine.objects",
    "slice_created": "branchwater.engine.gc.addresses",
    "DATA_ADDRESS_PATTERN": "branchwater.engine.gc.addresses",
    "REPOSITORY_NAME_PATTERN": "branchwater.engine.graveler.names",
    "check_repository_name": "branchwater.engine.graveler.names",
    "check_ref_name": "branchwater.engine.graveler.names",
    "check_flag": "branchwater.engine.graveler.model",
    "imported_version": "branchwater.engine.graveler.checksums",
    "open_source": "branchwater.engine.graveler.sources",
    "verified": "branchwater.engine.graveler.verified",
    "REVERT_KEY": "branchwater.engine.graveler.picks",
    "CHERRY_PICK_KEY": "branchwater.engine.graveler.picks",
    "PARENT_KEY": "branchwater.engine.graveler.picks",
    "human_size": "branchwater.engine.units",
    "timestamp": "branchwater.engine.units",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'branchwater.engine' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = [
    "AlreadyExists",
    "AlreadyRecorded",
    "ChangesDropped",
    "BranchProtected",
    "BranchwaterError",
    "BucketNotFound",
    "ChecksMissing",
    "CommitExpired",
    "ConfigurationError",
    "Conflict",
    "CorruptedData",
    "DirtyBranch",
    "GateFailed",
    "GCRunLocked",
    "InvalidAddress",
    "InvalidArgument",
    "InvalidGCRules",
    "InvalidImportSource",
    "InvalidName",
    "InvalidToken",
    "LakeClosed",
    "LakeNotFound",
    "MergeConflict",
    "MergeRaceLost",
    "NoChanges",
    "NotFound",
    "OutcomeUnknown",
    "PathExists",
    "PredicateFailed",
    "ReadOnlyRef",
    "RunExpired",
    "StaleGCMark",
    "TokenAlreadyUsed",
    "TokenExpired",
    "TooManyTries",
    "Unavailable",
    "redact_url",
    "url_secrets",
    *_LAZY,
]
