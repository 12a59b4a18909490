"""The checker fails the histories it must: hand-written logs and final states, each breaking
one guarantee (and its twin that keeps it, which must pass)."""

from __future__ import annotations

from typing import Any

import pytest

from branchwater.engine.graveler.checksums import content_checksum
from tests.history.checker import CommitState, FinalState, check, three_way
from tests.history.operations import IMPORT_FILES, IMPORTED, MAIN, SHARED

ROOT = "c0"


class Log:
    """Records as workers write them, one operation at a time, at the times given."""

    def __init__(self) -> None:
        self.records: list[dict[str, Any]] = []
        self.k = 0

    def op(
        self,
        kind: str,
        args: dict[str, Any],
        start: float,
        end: float,
        result: dict[str, Any] | None = None,
        *,
        worker: int = 0,
        error: str | None = None,
    ) -> None:
        self.k += 1
        self.records.append(
            {"w": worker, "k": self.k, "t": start, "event": "invoke", "op": kind, "args": args}
        )
        status = "refused" if error else "ok"
        self.records.append(
            {"w": worker, "k": self.k, "t": end, "event": "complete", "status": status,
             "result": result, "error": error}
        )  # fmt: skip


def written(data: str) -> str:
    return content_checksum(data.encode())


def state(**changes: Any) -> FinalState:
    base: dict[str, Any] = {
        "initial": ROOT,
        "commits": {ROOT: CommitState([], {}, {})},
        "bases": {},
        "branches": {MAIN: ROOT, SHARED: ROOT, "w0": ROOT, "w1": ROOT},
        "views": {MAIN: {}, SHARED: {}, "w0": {}, "w1": {}},
        "views_after_gc": None,
        "tags": {},
        "broken": [],
        "gc_deleted": 0,
    }
    base.update(changes)
    if base["views_after_gc"] is None:
        base["views_after_gc"] = base["views"]
    return FinalState(**base)


def shared_write(log: Log, data: str, start: float, end: float, worker: int = 1) -> str:
    value = written(data)
    args = {"branch": SHARED, "path": "p/00", "data": data}
    log.op("write", args, start, end, {"value": value}, worker=worker)
    return value


@pytest.mark.parametrize(("read_at", "stale"), [(3.0, True), (1.5, False)])
def test_a_read_after_an_acknowledged_write_must_see_it(read_at: float, stale: bool) -> None:
    """Read started after the write's acknowledgement (3.0) must see it; one overlapping
    the write (1.5) may see the old value."""
    log = Log()
    value = shared_write(log, "v1", 1.0, 2.0)
    log.op("read", {"branch": SHARED, "path": "p/00"}, read_at, read_at + 1, error="NotFound")
    views = {MAIN: {}, SHARED: {"p/00": value}, "w0": {}, "w1": {}}
    found = check(log.records, state(views=views))
    assert bool(found) == stale, found


def test_a_later_acknowledged_write_replaces_what_reads_may_see() -> None:
    log = Log()
    shared_write(log, "v1", 1.0, 2.0)
    second = shared_write(log, "v2", 3.0, 4.0, worker=0)
    log.op("read", {"branch": SHARED, "path": "p/00"}, 5.0, 6.0, {"value": written("v1")})
    views = {MAIN: {}, SHARED: {"p/00": second}, "w0": {}, "w1": {}}
    assert any("shows p/00" in found for found in check(log.records, state(views=views)))


def shared_create(log: Log, data: str, start: float, end: float, worker: int) -> str:
    value = written(data)
    args = {"branch": SHARED, "path": "p/00", "data": data}
    log.op("create", args, start, end, {"value": value}, worker=worker)
    return value


@pytest.mark.parametrize("deleted_between", [True, False])
def test_two_acknowledged_creations_of_a_path_need_a_delete_between(
    deleted_between: bool,
) -> None:
    log = Log()
    shared_create(log, "a", 1.0, 2.0, worker=0)
    if deleted_between:
        log.op("delete", {"branch": SHARED, "path": "p/00"}, 3.0, 4.0, {"value": None})
    second = shared_create(log, "b", 5.0, 6.0, worker=1)
    views = {MAIN: {}, SHARED: {"p/00": second}, "w0": {}, "w1": {}}
    found = check(log.records, state(views=views))
    assert any("created twice" in message for message in found) != deleted_between, found
    assert any("which showed one of" in message for message in found) != deleted_between


def test_an_exclusive_creation_is_refused_only_where_the_path_is_shown() -> None:
    log = Log()
    args = {"branch": SHARED, "path": "p/00", "data": "a"}
    log.op("create", args, 1.0, 2.0, error="PathExists")
    assert any("absent throughout" in message for message in check(log.records, state()))
    private = {"branch": "w0", "path": "p/01", "data": "x"}
    log = Log()
    log.op("create", private, 1, 2, {"value": written("x")})
    log.op("create", {**private, "data": "y"}, 3, 4, {"value": written("y")})
    views = {MAIN: {}, SHARED: {}, "w0": {"p/01": written("y")}, "w1": {}}
    found = check(log.records, state(views=views))
    assert any("created, but the branch shows the path" in message for message in found)


def test_a_commit_of_a_private_branch_must_hold_what_was_staged() -> None:
    log = Log()
    log.op("write", {"branch": "w0", "path": "p/01", "data": "x"}, 1, 2, {"value": written("x")})
    log.op("commit", {"branch": "w0"}, 3, 4, {"commit": "c1", "head": "c1"})
    views = {MAIN: {}, SHARED: {}, "w0": {"p/01": written("x")}, "w1": {}}
    branches = {MAIN: ROOT, SHARED: ROOT, "w0": "c1", "w1": ROOT}
    good = {ROOT: CommitState([], {}, {}), "c1": CommitState([ROOT], {}, {"p/01": written("x")})}
    assert check(log.records, state(commits=good, views=views, branches=branches)) == []
    bad = {ROOT: good[ROOT], "c1": CommitState([ROOT], {}, {})}
    found = check(log.records, state(commits=bad, views=views, branches=branches))
    assert any("commit c1 holds {}" in message for message in found)
    lost = {ROOT: good[ROOT]}
    found = check(log.records, state(commits=lost, views=views, branches=branches))
    assert any("acknowledged commit c1, which is gone" in message for message in found)


IMPORT_META = {"branchwater.import.source": "file:///source/"}
IMPORTED_TREE = {f"{IMPORTED}{name}": f"etag:{i}" for i, name in enumerate(IMPORT_FILES)}


def test_an_import_must_land_its_files_on_head_and_stay_under_what_is_staged() -> None:
    """The import lands on HEAD with the files; a staged write stays above it, in the view."""
    log = Log()
    log.op("write", {"branch": "w0", "path": "p/01", "data": "x"}, 1, 2, {"value": written("x")})
    log.op("import", {"branch": "w0"}, 3, 4, {"commit": "c1", "head": "c1"})
    views = {MAIN: {}, SHARED: {}, "w0": {"p/01": written("x"), **IMPORTED_TREE}, "w1": {}}
    branches = {MAIN: ROOT, SHARED: ROOT, "w0": "c1", "w1": ROOT}
    good = {ROOT: CommitState([], {}, {}), "c1": CommitState([ROOT], IMPORT_META, IMPORTED_TREE)}
    assert check(log.records, state(commits=good, views=views, branches=branches)) == []
    partial = dict(list(IMPORTED_TREE.items())[1:])
    bad = {ROOT: good[ROOT], "c1": CommitState([ROOT], IMPORT_META, partial)}
    found = check(log.records, state(commits=bad, views=views, branches=branches))
    assert any(message.startswith("import commit c1 holds") for message in found), found
    elsewhere = {**good, "c1": CommitState(["c9"], IMPORT_META, IMPORTED_TREE)}
    found = check(log.records, state(commits=elsewhere, views=views, branches=branches))
    assert any("landed c1 on ['c9'], not c0" in message for message in found), found


def test_a_read_of_shared_after_an_acknowledged_import_must_see_its_files() -> None:
    log = Log()
    log.op("import", {"branch": SHARED}, 1, 2, {"commit": "c1", "head": "c1"})
    path = next(iter(IMPORTED_TREE))
    log.op("read", {"branch": SHARED, "path": path}, 3, 4, error="NotFound", worker=1)
    commits = {ROOT: CommitState([], {}, {}), "c1": CommitState([ROOT], IMPORT_META, IMPORTED_TREE)}
    views = {MAIN: {}, SHARED: IMPORTED_TREE, "w0": {}, "w1": {}}
    branches = {MAIN: ROOT, SHARED: "c1", "w0": ROOT, "w1": ROOT}
    found = check(log.records, state(commits=commits, views=views, branches=branches))
    assert any(f"shows {path} as None" in message for message in found), found


@pytest.mark.parametrize(
    ("spec", "after"),
    [
        ("p/", {"q": "y", "p/02": "z", "p/01/a": "z"}),
        ("p/01", {"q": "y", "p/01/a": "z"}),
        ("q", {"p/01": "x"}),
    ],
)
def test_a_restore_makes_the_paths_it_names_its_sources(spec: str, after: dict[str, str]) -> None:
    log = Log()
    for path, data in (("p/01", "x"), ("q", "y")):
        log.op(
            "write", {"branch": "w0", "path": path, "data": data}, 1, 2, {"value": written(data)}
        )
    source = {"p/02": written("z"), "p/01/a": written("z")}
    args = {"branch": "w0", "spec": spec, "source": "c1", "head": ROOT, "parents": []}
    log.op("restore", args, 3, 4, {"staged": 2})
    commits = {ROOT: CommitState([], {}, {}), "c1": CommitState([ROOT], {}, source)}
    views = {MAIN: {}, SHARED: {}, "w0": {p: written(d) for p, d in after.items()}, "w1": {}}
    assert check(log.records, state(commits=commits, views=views)) == []
    unrestored = {**views, "w0": {"p/01": written("x"), "q": written("y")}}
    found = check(log.records, state(commits=commits, views=unrestored))
    assert any(message.startswith("w0 ends showing") for message in found)


def test_a_cherry_pick_must_apply_the_picked_commits_changes_against_its_parent() -> None:
    """`c2` on main changed `a` from 1 to 2 against its parent `c1`; picked onto `w0`, whose
    HEAD holds `a` at 1 and `b`, it must hold `a` at 2 and keep `b`."""
    before, after, own = {"a": "1"}, {"a": "2"}, {"a": "1", "b": "5"}
    args = {"branch": "w0", "head": "w", "parents": [ROOT], "picked": "c2", "parent": None}
    log = Log()
    log.op("cherry_pick", args, 1, 2, {"commit": "p", "attempts": 1})

    def final(picked_tree: dict[str, str]) -> FinalState:
        commits = {
            ROOT: CommitState([], {}, {}),
            "c1": CommitState([ROOT], {}, before),
            "c2": CommitState(["c1"], {}, after),
            "w": CommitState([ROOT], {}, own),
            "p": CommitState(["w"], {}, picked_tree),
        }
        branches = {MAIN: ROOT, SHARED: ROOT, "w0": "p", "w1": ROOT}
        views = {MAIN: {}, SHARED: {}, "w0": picked_tree, "w1": {}}
        return state(commits=commits, branches=branches, views=views)

    good = [m for m in check(log.records, final({"a": "2", "b": "5"})) if "cherry-pick" in m]
    assert good == []
    found = check(log.records, final({"a": "2"}))
    assert any("cherry-pick of c2 is {'a': '2'}" in message for message in found)


def test_a_merge_must_equal_the_three_way_merge_of_its_parents() -> None:
    ours, theirs = {"a": "1", "b": "2"}, {"a": "9", "b": "2", "c": "3"}
    expected = three_way({"a": "1"}, ours, theirs, None)
    assert expected == {"a": "9", "b": "2", "c": "3"}
    commits = {
        ROOT: CommitState([], {}, {"a": "1"}),
        "d": CommitState([ROOT], {}, ours),
        "s": CommitState([ROOT], {}, theirs),
        "m": CommitState(["d", "s"], {"branchwater.merge.bases": ROOT}, {"a": "1", "b": "2"}),
    }
    log = Log()
    log.op("merge", {"source": "w1", "into": MAIN, "strategy": None}, 1, 2,
           {"commit": "m", "fast_forward": False}, worker=1)  # fmt: skip
    found = check(log.records, state(commits=commits, bases={"m": [ROOT]}))
    assert any("the model's is" in message for message in found), found


def test_every_acknowledged_merge_stays_in_mains_history() -> None:
    commits = {ROOT: CommitState([], {}, {}), "s": CommitState([ROOT], {}, {})}
    log = Log()
    log.op("merge", {"source": "w1", "into": MAIN, "strategy": None}, 1, 2,
           {"commit": "s", "fast_forward": True}, worker=1)  # fmt: skip
    found = check(log.records, state(commits=commits))
    assert any("is lost from main" in message for message in found), found


def test_gc_must_leave_every_reference_reading_and_every_view_as_it_was() -> None:
    assert check([], state()) == []
    assert check([], state(broken=["branch w0: p/00 -> data/x is gone"]))
    changed = {MAIN: {}, SHARED: {}, "w0": {"p/00": "x"}, "w1": {}}
    assert check([], state(views_after_gc=changed))


def test_an_operation_that_never_finished_or_raised_is_reported() -> None:
    log = Log()
    log.op("write", {"branch": "w0", "path": "p/00", "data": "x"}, 1, 2, {"value": written("x")})
    log.records[-1].update(status="error", error="CorruptedData: bad range")
    found = check(log.records, state(views={MAIN: {}, SHARED: {}, "w0": {}, "w1": {}}))
    assert any("raised CorruptedData" in message for message in found)


@pytest.mark.parametrize(("held", "flagged"), [("w", True), ("q", True), (None, False)])
def test_a_retried_merge_must_equal_the_merge_of_its_parents(
    held: str | None, flagged: bool
) -> None:
    """A merge that lost a race is held to the same three-way merge as a first attempt: the
    destination's change (`w`) where the parents' merge conflicts, or a value neither parent
    holds (`q`), is wrong; where the merge is clean (the source left `a` alone), its
    result is right whatever attempt landed it."""
    source = {"a": "y"} if held is not None else {"a": "x", "b": "y"}
    merged = {"a": held} if held is not None else {"a": "w", "b": "y"}
    commits = {
        ROOT: CommitState([], {}, {"a": "x"}),
        "d": CommitState([ROOT], {}, {"a": "w"}),
        "s": CommitState([ROOT], {}, source),
        "m": CommitState(["d", "s"], {"branchwater.merge.bases": ROOT}, merged),
    }
    log = Log()
    log.op("merge", {"source": "w1", "into": MAIN, "strategy": None}, 1, 2,
           {"commit": "m", "fast_forward": False, "attempts": 2}, worker=1)  # fmt: skip
    found = check(log.records, state(commits=commits, bases={"m": [ROOT]}))
    assert any("merge of s into d" in message for message in found) == flagged, found


EMPTY_VIEWS = {MAIN: {}, SHARED: {}, "w0": {}, "w1": {}}


@pytest.mark.parametrize(
    ("error", "flagged"),
    [("InvalidArgument", False), ("InvalidName", True), (None, True), ("NotFound", True)],
)
def test_hostile_input_must_be_refused_with_its_error_type(
    error: str | None, flagged: bool
) -> None:
    """A NUL in a path is `InvalidArgument`: another refusal, or an acknowledgement, is a
    finding; the refused write changes no model, so the branch must not show it."""
    log = Log()
    args = {
        "branch": "w0",
        "data": "x",
        "expect": "InvalidArgument",
        "hostile": {"path": "'a\\x00'"},
    }
    log.op("write", args, 1, 2, {"value": written("x")} if error is None else None, error=error)
    found = check(log.records, state(views=EMPTY_VIEWS))
    assert any("must refuse" in m or "not InvalidArgument" in m for m in found) == flagged, found


def test_valid_input_refused_as_hostile_and_commit_expired_off_a_move_are_findings() -> None:
    log = Log()
    log.op("write", {"branch": "w0", "path": "p/00", "data": "x"}, 1, 2, error="InvalidArgument")
    log.op("read", {"branch": "w0", "path": "p/00"}, 3, 4, error="CommitExpired")
    log.op("reset", {"branch": "w1", "back": True, "head": ROOT, "parents": []}, 5, 6,
           error="CommitExpired", worker=1)  # fmt: skip
    found = check(log.records, state(views=EMPTY_VIEWS))
    assert any("refused valid input with InvalidArgument" in m for m in found), found
    assert any("read" in m and "moves onto no commit" in m for m in found), found
    assert not any("reset" in m and "moves onto no commit" in m for m in found), found


def test_a_branch_or_tag_no_operation_made_is_a_finding() -> None:
    assert check([], state(tags={"v1": ROOT}))
    assert check([], state(branches={MAIN: ROOT, SHARED: ROOT, "w0": ROOT, "w1": ROOT, "x": ROOT}))


def test_commit_metadata_comes_back_exactly() -> None:
    log = Log()
    log.op("write", {"branch": "w0", "path": "p/01", "data": "x"}, 1, 2, {"value": written("x")})
    metadata = {"k\u2028": "v\x00"}
    log.op("commit", {"branch": "w0", "metadata": metadata}, 3, 4, {"commit": "c1", "head": "c1"})
    views = {**EMPTY_VIEWS, "w0": {"p/01": written("x")}}
    branches = {MAIN: ROOT, SHARED: ROOT, "w0": "c1", "w1": ROOT}
    for held, flagged in ((metadata, False), ({}, True)):
        commits = {ROOT: CommitState([], {}, {}), "c1": CommitState([ROOT], held, views["w0"])}
        found = check(log.records, state(commits=commits, views=views, branches=branches))
        assert any("commit holds metadata" in m for m in found) == flagged, found


def test_retention_must_record_what_it_expired_and_reads_must_refuse_it() -> None:
    commits = {ROOT: CommitState([], {}, {}), "old": CommitState([ROOT], {}, {})}
    log = Log()
    log.op("retention", {}, 1, 2, {"run": "r", "deleted": 1, "expiring": ["old"]})
    assert check(log.records, state(commits=commits, expired={"old"}, refused={"old"})) == []
    assert check(log.records, state(commits=commits))
    assert check(log.records, state(commits=commits, expired={"old"}))
    named = {MAIN: ROOT, SHARED: ROOT, "w0": ROOT, "w1": ROOT}
    assert check([], state(commits=commits, branches=named, refused={ROOT}))
