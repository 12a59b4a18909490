"""Every typed error survives a pickle round trip with its message and attributes: errors
raised in worker processes reach their callers through pickle."""

from __future__ import annotations

import pickle

import pytest

from branchwater.engine import errors
from branchwater.engine.errors import (
    AlreadyRecorded,
    BranchProtected,
    BranchwaterError,
    ChecksMissing,
    CommitExpired,
    MergeConflict,
    MergeRaceLost,
)


def error_classes() -> list[type[BranchwaterError]]:
    found = [getattr(errors, name) for name in dir(errors)]
    return [c for c in found if isinstance(c, type) and issubclass(c, BranchwaterError)]


@pytest.mark.parametrize(
    "error",
    [
        MergeRaceLost("merge of 'a' into 'main'", 5, "hint-123"),
        MergeConflict(["p", "q"], 3, "feature", "main"),
        BranchProtected("no", branch="main", rule="no_delete", pattern="ma*"),
        ChecksMissing("no", branch="main", pattern="main", missing=("lint",), failed=("qa",)),
        CommitExpired("c" * 64, "2026-11-01"),
        AlreadyRecorded("recorded by a concurrent commit", "d" * 64),
        *(cls("plain message") for cls in error_classes() if cls.__init__ is Exception.__init__),
    ],
    ids=lambda e: type(e).__name__,
)
def test_an_error_pickles_whole(error: BranchwaterError) -> None:
    again = pickle.loads(pickle.dumps(error))

    assert type(again) is type(error)
    assert str(again) == str(error)
    assert again.__dict__ == error.__dict__
