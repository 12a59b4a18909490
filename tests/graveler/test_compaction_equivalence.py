"""Compaction changes how a branch is stored, never what it shows (hypothesis).

Two repositories of one lake run the same randomized history of writes, deletes, commits,
resets and merges; one of them also compacts at random points. After every step, reads,
listings (with prefixes and `after`), `stat`, `uncommitted()` and the outcome of every
commit and merge (its metarange id, or the error) must be the same in both.

Each write stores a new object (its own address), as uploads do, and a version's content
has one identity: a write can bring back HEAD's content at another address. Entries are
compared by what they hold, not where: between a compaction and the next commit, a path
written back to HEAD's content shows HEAD's object on the compacted branch and the new
one on the other. Commits compare whole metarange ids, addresses included.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from branchwater.engine import BranchwaterError, Lake
from branchwater.engine.graveler import reads, uncommitted
from branchwater.engine.graveler.committed import RangePolicy
from branchwater.engine.graveler.model import Entry
from branchwater.engine.graveler.writes import stage_entry

PATHS = [f"{d}/{i}" for d in ("a", "b", "c") for i in range(4)] + ["d"]
BRANCHES = ("main", "dev")
PROBES = ["", "a/", "b/1", "c/", "x"]
T0 = datetime(2026, 11, 1, tzinfo=timezone.utc)

branches = st.sampled_from(BRANCHES)
steps = st.one_of(
    st.tuples(st.just("put"), branches, st.sampled_from(PATHS), st.integers(0, 3)),
    st.tuples(st.just("delete"), branches, st.sampled_from(PATHS)),
    st.tuples(st.just("commit"), branches),
    st.tuples(st.just("reset"), branches),
    st.tuples(st.just("merge"), branches, branches),
    st.tuples(st.just("compact"), branches),
)


BACK_TO_HEAD = [
    ("put", "main", "d", 0),
    ("commit", "main"),
    ("put", "main", "d", 1),
    ("compact", "main"),
    ("put", "main", "d", 0),
    ("commit", "main"),
]
"""A path changed, compacted, and written back to HEAD's content: no change to commit."""


def content(path: str, version: int, write: int) -> Entry:
    """The same entry in both repositories, stored at the address of the `write`-th step."""
    return Entry(
        path, f"data/{path}/{write}", version + 1, f"sum{version}", T0 + timedelta(version)
    )


def outcome(call: Any) -> object:
    """What a step returned, as something comparable across repositories, or its error type."""
    try:
        result = call()
    except BranchwaterError as exc:
        return type(exc).__name__
    if hasattr(result, "commit"):
        return result.commit.metarange_id
    if isinstance(result, Entry):
        return held(result)
    return getattr(result, "metarange_id", None)


def held(entry: Entry) -> tuple[object, ...]:
    """What an entry holds, wherever it is stored."""
    return (entry.path, entry.identity(), entry.mtime)


def run(lake: Lake, repo, step: tuple, number: int, compacting: bool) -> object:
    kind, branch = step[0], step[1]
    handle = repo.branch(branch)
    if kind == "put":
        entry = content(step[2], step[3], number)
        return outcome(lambda: stage_entry(lake.graveler, repo.record, branch, entry))
    if kind == "delete":
        return outcome(lambda: handle.delete(step[2]))
    if kind == "commit":
        return outcome(lambda: handle.commit("step"))
    if kind == "reset":
        return outcome(handle.reset)
    if kind == "merge":
        return outcome(lambda: repo.merge(step[2], into=branch))
    if compacting:
        handle.compact()
    return None


def view(repo) -> Iterator[object]:
    """Everything a user can read of both branches."""
    for name in BRANCHES:
        branch = repo.branch(name)
        yield [held(e) for e in branch.list()]
        for probe in PROBES:
            yield [held(e) for e in branch.list(prefix=probe)]
            yield [held(e) for e in branch.list(after=probe)]
        for path in PATHS:
            yield outcome(lambda b=branch, p=path: b.stat(p))
        yield [(c.path, c.type, held(c.entry)) for c in branch.uncommitted()]


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(history=st.lists(steps, min_size=1, max_size=25))
@example(history=BACK_TO_HEAD)
def test_compaction_never_changes_what_a_branch_shows(
    history: list[tuple], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(reads, "PAGE_SIZE", 3)
    monkeypatch.setattr(reads, "CHANGES_PAGE_SIZE", 3)
    monkeypatch.setattr(uncommitted, "BATCH", 2)
    policy = RangePolicy(target_entries=3, max_entries=5)
    with (
        tempfile.TemporaryDirectory() as tmp,
        Lake.connect("memory://", range_policy=policy, range_cache_bytes=0) as lake,
    ):
        plain = lake.create_repository("plain", storage_namespace=f"file://{tmp}/plain")
        packed = lake.create_repository("packed", storage_namespace=f"file://{tmp}/packed")
        for repo in (plain, packed):
            repo.create_branch("dev", source="main")
        for number, step in enumerate(history):
            plain_outcome = run(lake, plain, step, number, False)
            assert plain_outcome == run(lake, packed, step, number, True), step
            assert list(view(plain)) == list(view(packed)), step
        for name in BRANCHES:
            final = [
                outcome(lambda r=r, n=name: r.branch(n).commit("final")) for r in (plain, packed)
            ]
            assert final[0] == final[1]
