"""Branchwater operators: `from branchwater.plugin.operators import BranchwaterMergeOperator`."""

from __future__ import annotations

from branchwater.plugin.operators.base import BranchwaterOperator
from branchwater.plugin.operators.branches import (
    BranchwaterCreateBranchOperator,
    BranchwaterDeleteBranchOperator,
)
from branchwater.plugin.operators.commits import (
    BranchwaterCommitOperator,
    BranchwaterMergeOperator,
    BranchwaterTagOperator,
)
from branchwater.plugin.operators.gc import BranchwaterPrepareUncommittedOperator
from branchwater.plugin.operators.objects import BranchwaterUploadOperator

__all__ = [
    "BranchwaterCommitOperator",
    "BranchwaterCreateBranchOperator",
    "BranchwaterDeleteBranchOperator",
    "BranchwaterMergeOperator",
    "BranchwaterOperator",
    "BranchwaterPrepareUncommittedOperator",
    "BranchwaterTagOperator",
    "BranchwaterUploadOperator",
]
