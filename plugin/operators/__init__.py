"""Branchwater operators: `from branchwater.plugin.operators import BranchwaterMergeOperator`."""

from __future__ import annotations

from branchwater.plugin.operators.base import BranchwaterOperator
from branchwater.plugin.operators.branches import (
    BranchwaterCreateBranchOperator,
    BranchwaterDeleteBranchOperator,
)
from branchwater.plugin.operators.checks import BranchwaterRecordCheckOperator
from branchwater.plugin.operators.commits import (
    BranchwaterCommitOperator,
    BranchwaterMergeOperator,
    BranchwaterTagOperator,
)
from branchwater.plugin.operators.compaction import BranchwaterCompactOperator
from branchwater.plugin.operators.gc import (
    BranchwaterGCGateOperator,
    BranchwaterGCJobOperator,
    BranchwaterGCMarkOperator,
    BranchwaterGCReportOperator,
    BranchwaterGCSweepOperator,
    BranchwaterPrepareUncommittedOperator,
)
from branchwater.plugin.operators.imports import BranchwaterImportOperator
from branchwater.plugin.operators.objects import BranchwaterUploadOperator
from branchwater.plugin.operators.repositories import BranchwaterCreateRepositoryOperator
from branchwater.plugin.operators.undo import (
    BranchwaterCherryPickOperator,
    BranchwaterResetOperator,
    BranchwaterRevertOperator,
)

__all__ = [
    "BranchwaterCherryPickOperator",
    "BranchwaterCommitOperator",
    "BranchwaterCompactOperator",
    "BranchwaterCreateBranchOperator",
    "BranchwaterCreateRepositoryOperator",
    "BranchwaterDeleteBranchOperator",
    "BranchwaterGCGateOperator",
    "BranchwaterGCJobOperator",
    "BranchwaterGCMarkOperator",
    "BranchwaterGCReportOperator",
    "BranchwaterGCSweepOperator",
    "BranchwaterImportOperator",
    "BranchwaterMergeOperator",
    "BranchwaterOperator",
    "BranchwaterPrepareUncommittedOperator",
    "BranchwaterRecordCheckOperator",
    "BranchwaterResetOperator",
    "BranchwaterRevertOperator",
    "BranchwaterTagOperator",
    "BranchwaterUploadOperator",
]
