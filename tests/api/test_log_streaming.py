"""`Repository.log` streams (issue 39, item 6): commits are read as the iterator reaches them,
so the first match of a filter costs the walk to it, not the history; arguments are checked
when `log` is called, before anything is iterated."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from branchwater.engine import InvalidArgument, NotFound
from branchwater.engine.api import Repository

COMMITS = 40


@pytest.fixture
def history(repo: Repository) -> Repository:
    """`COMMITS` commits on main, the 5th from the top made by DAG run `r5`, touching `runs/5`."""
    main = repo.branch("main")
    for i in range(COMMITS):
        main.upload(f"runs/{i}" if i == COMMITS - 5 else f"other/{i}", str(i).encode())
        main.commit(f"c{i}", {"airflow.run_id": f"r{COMMITS - i}"})
    return repo


@pytest.fixture
def reads(history: Repository, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The ids of the commit records read from the KV, in order (the hook the log walks)."""
    refs = history.lake.graveler.refs
    original = refs.get_commit
    read: list[str] = []

    def counting(record, commit_id):  # type: ignore[no-untyped-def]
        read.append(commit_id)
        return original(record, commit_id)

    monkeypatch.setattr(refs, "get_commit", counting)
    return read


def test_log_is_an_iterator_that_reads_nothing_until_asked(
    history: Repository, reads: list[str]
) -> None:
    commits = history.log("main", where={"airflow.run_id": "r5"})
    assert isinstance(commits, Iterator)
    assert reads == []
    found = next(commits)
    assert found.message == f"c{COMMITS - 5}"
    first_match_reads = len(reads)
    assert first_match_reads <= 7  # the walk to the 5th commit, and its parents' lookahead
    assert list(commits) == []
    assert len(reads) >= COMMITS  # only the rest of the walk reads the whole history


def test_the_first_commit_touching_a_path_is_found_without_reading_the_rest(
    history: Repository, reads: list[str]
) -> None:
    found = next(history.log("main", paths=["runs/"]))
    assert found.message == f"c{COMMITS - 5}"
    assert len(reads) < COMMITS // 2


def test_arguments_are_checked_when_log_is_called(history: Repository) -> None:
    with pytest.raises(InvalidArgument, match="where filters on text"):
        history.log("main", where={"n": 1})  # type: ignore[dict-item]
    with pytest.raises(InvalidArgument, match="list of path prefixes"):
        history.log("main", paths="runs/")  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="limit must be"):
        history.log("main", limit=-1)
    assert len(list(history.log("main", limit=10**30, depth=10**30))) == COMMITS + 1
    with pytest.raises(NotFound):
        history.log("no-such-ref")


def test_a_page_after_a_commit_of_another_line_fails_without_walking_the_history(
    history: Repository, reads: list[str]
) -> None:
    """The walk is in history order: once past where the commit would be, it is not there
    (a `?after=` the web UI passes on costs the commits above it, not the whole history);
    a commit that does not exist is refused when `log` is called."""
    side = history.create_branch("side", "main~5")
    side.upload("s", b"s")
    elsewhere = side.commit("s").id
    reads.clear()
    commits = history.log("main", after=elsewhere)
    with pytest.raises(NotFound, match="not in that history"):
        next(commits)
    assert len(reads) <= 10
    with pytest.raises(NotFound):
        history.log("main", after="0" * 64)
