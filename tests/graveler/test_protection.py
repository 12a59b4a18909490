"""Protected branches (issue 39, item 3) and merges gated on checks (item 4).

Every write path into a protected branch refuses with the rule's name and changes nothing,
merges still land (when the source commit carries the required checks as passed), and the
rules hold for handles opened before they were set, in this process and in others: they
travel in the branch record each write reads. Forced interleavings put a `protect` between
a write's first read and the read (or `set_if`) that decides it.
"""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from branchwater.engine import (
    BranchProtected,
    ChecksMissing,
    DirtyBranch,
    InvalidArgument,
    Lake,
    NotFound,
    failpoints,
)
from branchwater.engine.api import Repository
from branchwater.engine.failpoints import FailpointHit, armed
from branchwater.engine.graveler import protection
from branchwater.engine.graveler.graveler import Graveler, RetryPolicy
from branchwater.engine.graveler.model import TEXT_MAX_BYTES
from branchwater.engine.graveler.protection import (
    MAX_BOOK_BYTES,
    MAX_REQUIRED_CHECKS,
    MAX_RULES,
    RULES_KEY,
    ProtectionRule,
    decode_stamp,
    read_book,
)
from tests.graveler.test_refs import CountingStore
from tests.helpers.servers import forked_pool, forked_run, unique_name

Write = Callable[[Repository], object]


def _link(repo: Repository) -> object:
    main = repo.branch("main")
    physical = main.get_physical_address()
    repo.lake.graveler.objects(repo.storage_namespace).put(physical.address, b"linked")
    return main.link_physical_address("linked", physical.token, size=6, checksum="c")


WRITES: dict[str, Write] = {
    "upload": lambda repo: repo.branch("main").upload("new", b"new"),
    "delete": lambda repo: repo.branch("main").delete("a"),
    "copy": lambda repo: repo.branch("main").copy("a", "a-copy"),
    "link": _link,
    "physical address": lambda repo: repo.branch("main").get_physical_address(),
    "restore": lambda repo: repo.branch("main").restore(["a"], source="main~1"),
    "commit": lambda repo: repo.branch("main").commit("direct", allow_empty=True),
    "revert": lambda repo: repo.revert("main", "main"),
    "cherry-pick": lambda repo: repo.cherry_pick("main", "dev"),
    "reset --to": lambda repo: repo.branch("main").reset(to="main~1"),
    "delete branch": lambda repo: repo.delete_branch("dev"),
}
"""Every path that changes a branch (and the address a link would stage), each refused by
one rule (`RULE_OF`)."""

RULE_OF = {name: ("no_direct_writes", "main") for name in WRITES} | {
    "reset --to": ("no_reset", "main"),
    "delete branch": ("no_delete", "dev"),
}
RULES = ("no_direct_writes", "no_reset", "no_delete")


def seeded(repo: Repository) -> None:
    """`main` two commits deep (holding `a`, `b`); `dev` off it one commit ahead."""
    main = repo.branch("main")
    main.upload("a", b"a1")
    main.commit("first")
    main.upload("b", b"b1")
    main.upload("a", b"a2")
    main.commit("second")
    dev = repo.create_branch("dev", source="main")
    dev.upload("c", b"c1")
    dev.commit("dev work")


def snapshot(repo: Repository) -> tuple[str, list[tuple[str, str]], int]:
    """What readers of `main` see: its HEAD, its entries, its uncommitted changes."""
    main = repo.branch("main")
    entries = [(e.path, e.checksum) for e in main.list()]
    return main.head().id, entries, len(list(main.uncommitted()))


def protect_all(repo: Repository) -> None:
    repo.protect("main", no_direct_writes=True, no_delete=True, no_reset=True, by="test")
    repo.protect("dev", no_delete=True, by="test")


@pytest.fixture
def repo(tmp_path: Path):
    with Lake.connect("memory://", retry=RetryPolicy(base_delay=0)) as lake:
        repository = lake.create_repository("guarded", storage_namespace=f"file://{tmp_path}/ns")
        seeded(repository)
        yield repository


@pytest.mark.parametrize("name", WRITES)
def test_every_write_path_refuses_with_the_rule_and_changes_nothing(
    repo: Repository, name: str
) -> None:
    protect_all(repo)
    before = snapshot(repo)
    with pytest.raises(BranchProtected) as refused:
        WRITES[name](repo)
    rule, pattern = RULE_OF[name]
    assert (refused.value.rule, refused.value.pattern, refused.value.branch) == (
        rule,
        pattern,
        pattern,
    )
    assert f"rule {rule} (pattern {pattern!r})" in str(refused.value)
    assert snapshot(repo) == before
    repo.branch("dev")


def test_an_address_handed_out_before_the_rule_links_no_more(repo: Repository) -> None:
    main = repo.branch("main")
    physical = main.get_physical_address()
    repo.lake.graveler.objects(repo.storage_namespace).put(physical.address, b"linked")
    protect_all(repo)
    with pytest.raises(BranchProtected, match="no_direct_writes"):
        main.link_physical_address("linked", physical.token, size=6, checksum="c")


@pytest.mark.parametrize("name", WRITES)
def test_the_other_rules_let_each_write_through(repo: Repository, name: str) -> None:
    rule, pattern = RULE_OF[name]
    repo.protect(pattern, **{other: True for other in RULES if other != rule})
    WRITES[name](repo)


def test_merges_and_fast_forwards_land_on_a_branch_that_refuses_direct_writes(
    repo: Repository,
) -> None:
    protect_all(repo)
    result = repo.merge("dev", into="main")
    assert result.fast_forward and repo.branch("main").head().id == result.commit.id
    dev = repo.branch("dev")
    dev.upload("d", b"d1")
    dev.commit("more")
    repo.branch("main")  # the same handle kind a DAG holds
    merged = repo.merge("dev", into="main", fast_forward=False)
    assert repo.branch("main").stat("d").checksum == dev.stat("d").checksum
    assert merged.commit.parents[1] == dev.head().id


def test_a_merge_into_a_protected_branch_dirty_from_before_the_rule_says_to_reset(
    repo: Repository,
) -> None:
    """Writes acknowledged before the rule stay staged; a commit is refused, so the merge's
    advice is the reset that drops them."""
    repo.branch("main").upload("staged-before", b"x")
    protect_all(repo)
    with pytest.raises(
        DirtyBranch, match=r"reset it \(it takes no direct commits: protected by 'main'\)"
    ):
        repo.merge("dev", into="main", fast_forward=False)
    repo.branch("dev").upload("d", b"d")
    with pytest.raises(DirtyBranch, match="commit or reset it"):
        repo.merge("main", into="dev", fast_forward=False)


def test_revert_lands_on_a_protected_branch_through_a_merge(repo: Repository) -> None:
    """The way to undo on a protected branch (lakeFS's revert bypassed protection)."""
    protect_all(repo)
    bad = repo.branch("main").head().id
    repo.create_branch("fix", source="main")
    repo.revert("fix", bad)
    repo.merge("fix", into="main")
    assert repo.branch("main").stat("a").checksum == repo.ref(f"{bad}~1").stat("a").checksum


def test_dropping_staged_changes_is_allowed_under_every_rule(repo: Repository) -> None:
    main = repo.branch("main")
    main.upload("staged-before", b"x")
    protect_all(repo)
    head = main.head().id
    main.reset()
    assert main.head().id == head and list(main.uncommitted()) == []
    main.reset(to="main")


def test_compaction_is_allowed_and_keeps_the_rules(repo: Repository) -> None:
    main = repo.branch("main")
    main.delete("b")
    protect_all(repo)
    main.compact()
    with pytest.raises(BranchProtected):
        main.upload("x", b"x")
    assert [c.path for c in main.uncommitted()] == ["b"]


def test_branches_created_later_take_their_pattern_rules(repo: Repository) -> None:
    repo.protect("release/*", no_direct_writes=True, no_delete=True)
    release = repo.create_branch("release/1.0", source="main")
    with pytest.raises(BranchProtected, match="release/\\*"):
        release.upload("x", b"x")
    with pytest.raises(BranchProtected, match="no_delete"):
        repo.delete_branch("release/1.0")
    repo.create_branch("release/1.0/hotfix", source="main").upload("x", b"x")


def test_unprotect_lifts_the_rules_from_every_handle(repo: Repository) -> None:
    main = repo.branch("main")
    protect_all(repo)
    with pytest.raises(BranchProtected):
        main.upload("x", b"x")
    repo.unprotect("main")
    main.upload("x", b"x")
    main.commit("allowed again")
    assert decode_stamp(repo.lake.graveler.read_branch(repo.record, "main").protection).rules == ()


def test_overlapping_patterns_all_apply(repo: Repository) -> None:
    repo.protect("*", no_delete=True)
    repo.protect("ma*", no_reset=True)
    with pytest.raises(BranchProtected) as refused:
        repo.branch("main").reset(to="main~1")
    assert refused.value.pattern == "ma*"
    with pytest.raises(BranchProtected) as refused:
        repo.delete_branch("dev")
    assert (refused.value.rule, refused.value.pattern) == ("no_delete", "*")


def test_staged_writes_read_the_rules_from_the_records_they_read_anyway(tmp_path: Path) -> None:
    """No extra round trip for a branch no rule matches, however many rules the repository
    has; one at most (the cached record is read again) for a branch whose rules allow it."""
    kv = CountingStore()
    graveler = Graveler(kv, branch_cache_ttl=600)
    with Lake(graveler) as lake:
        repo = lake.create_repository("guarded", storage_namespace=f"file://{tmp_path}/ns")
        seeded(repo)
        dev = repo.branch("dev")

        def trips(path: str) -> int:
            assert graveler.wait_for_background(timeout=60), "a staging drop is still running"
            kv.calls.clear()
            dev.upload(path, path.encode())
            return len(kv.calls)

        trips("warm")
        unprotected = trips("one")
        assert trips("one more") == unprotected
        repo.protect("main", no_direct_writes=True, required_checks=["quality"])
        repo.protect("release/*", no_direct_writes=True)
        trips("warm again")
        assert trips("two") == unprotected
        repo.protect("dev", no_delete=True)
        trips("warm once more")
        assert trips("three") == unprotected + 1


# checks


def test_merge_refuses_without_the_required_checks_passed_on_the_source(
    repo: Repository,
) -> None:
    repo.protect("main", no_direct_writes=True, required_checks=["quality", "review"])
    source = repo.branch("dev").head().id
    before = snapshot(repo)
    with pytest.raises(ChecksMissing) as refused:
        repo.merge("dev", into="main")
    assert (refused.value.missing, refused.value.failed) == (("quality", "review"), ())
    assert refused.value.rule == "required_checks" and "quality, review" in str(refused.value)
    repo.record_check(source, "quality", False, {"unexpected": 3})
    repo.record_check(source, "review", True)
    with pytest.raises(ChecksMissing) as refused:
        repo.merge("dev", into="main", fast_forward=False)
    assert (refused.value.missing, refused.value.failed) == ((), ("quality",))
    assert "failed quality" in str(refused.value)
    assert snapshot(repo) == before


def test_the_same_merge_passes_once_the_checks_are_recorded(repo: Repository) -> None:
    repo.protect("main", no_direct_writes=True, required_checks=["quality"])
    with pytest.raises(ChecksMissing):
        repo.merge("dev", into="main")
    repo.record_check("dev", "quality", True, {"success_percent": 100.0})
    assert repo.merge("dev", into="main").commit.id == repo.branch("dev").head().id


def test_checks_on_another_commit_do_not_count(repo: Repository) -> None:
    repo.protect("main", required_checks=["quality"])
    repo.record_check("dev~1", "quality", True)
    with pytest.raises(ChecksMissing):
        repo.merge("dev", into="main")


def test_a_preview_publishes_with_the_checks_on_itself_or_on_its_source(
    repo: Repository,
) -> None:
    repo.protect("main", no_direct_writes=True, required_checks=["quality"])
    repo.branch("main")
    preview = repo.merge("dev", into="main", preview=True).commit
    with pytest.raises(ChecksMissing):
        repo.publish(preview.id, into="main")
    repo.record_check(preview.id, "quality", True)
    assert repo.publish(preview.id, into="main").commit.id == preview.id


def test_direct_commits_are_not_gated_by_checks(repo: Repository) -> None:
    """Required checks gate merges; direct writes are `no_direct_writes`'s business."""
    repo.protect("main", required_checks=["quality"])
    main = repo.branch("main")
    main.upload("x", b"x")
    main.commit("direct")


# forced interleavings


@pytest.fixture
def shared(race_kv: str, tmp_path: Path):
    """Two lakes on one KV (a writer's and a rule-changer's), `main` seeded."""
    retry = RetryPolicy(base_delay=0)
    with Lake.connect(race_kv, retry=retry) as one, Lake.connect(race_kv, retry=retry) as two:
        repo = one.create_repository("guarded", storage_namespace=f"file://{tmp_path}/ns")
        seeded(repo)
        yield repo, two.repository("guarded")


def test_a_staged_write_racing_protect_is_taken_back(shared) -> None:
    """The protect's fence lands after the write's first check, before its row: the read
    that comes with the row (the same statement on PostgreSQL) sees the rule, so the write
    refuses and its row is gone."""
    writer, admin = shared
    main = writer.branch("main")
    before = snapshot(writer)
    raced = armed("write.before_stage", lambda: protect_all(admin))
    with raced, pytest.raises(BranchProtected, match="no_direct_writes"):
        main.upload("raced", b"raced")
    assert snapshot(writer) == before
    with pytest.raises(NotFound):
        main.stat("raced")


def test_a_protect_after_the_writes_validating_read_lets_it_stand(shared) -> None:
    """The read that comes with the row is the write's linearization point: a protect
    fenced after it comes after the write, which stays acknowledged and staged."""
    writer, admin = shared
    main = writer.branch("main")
    with armed("write.before_validate", lambda: protect_all(admin)):
        main.upload("first", b"first")
    assert main.read("first") == b"first"
    with pytest.raises(BranchProtected, match="no_direct_writes"):
        main.upload("second", b"second")


def test_a_delete_racing_protect_is_taken_back(shared) -> None:
    writer, admin = shared
    main = writer.branch("main")
    main.upload("staged", b"s")
    before = snapshot(writer)
    with armed("write.before_stage", lambda: protect_all(admin)):
        with pytest.raises(BranchProtected):
            main.delete("a")
        with pytest.raises(BranchProtected):
            main.delete("staged")
    assert snapshot(writer) == before


def test_a_commit_racing_protect_refuses_at_its_set_if(shared) -> None:
    writer, admin = shared
    main = writer.branch("main")
    main.upload("x", b"x")
    head = main.head().id
    raced = armed("commit.before_set", lambda: protect_all(admin))
    with raced, pytest.raises(BranchProtected, match="no_direct_writes"):
        main.commit("raced")
    assert main.head().id == head
    assert [c.path for c in main.uncommitted()] == ["x"]


def test_a_branch_delete_racing_protect_refuses(shared) -> None:
    """The delete removes the record only if it is still the one it checked."""
    writer, admin = shared
    raced = armed("branch.before_delete", lambda: protect_all(admin))
    with raced, pytest.raises(BranchProtected, match="no_delete"):
        writer.delete_branch("dev")
    assert writer.branch("dev").head().id


def test_a_branch_created_while_a_protect_fences_gets_its_rules(shared) -> None:
    """The protect changes the book and fences after the new branch read the book and
    before it exists: the create stamps it again from the newer book."""
    writer, admin = shared

    def protect_releases() -> None:
        admin.protect("release/*", no_direct_writes=True)

    with armed("branch.before_insert", protect_releases):
        release = writer.create_branch("release/1", source="main")
    with pytest.raises(BranchProtected, match="release/\\*"):
        release.upload("x", b"x")


def test_a_branch_created_while_a_protect_fences_is_protected_from_its_insert_on(
    shared, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No moment between the insert and a second stamp lets work through (a creator that
    died there left the branch unprotected for good): right after the record is written,
    before the create returns, a write through another connection is refused."""
    writer, admin = shared
    kv = writer.lake.graveler.kv
    key = b"branches/release/1"
    refused: list[bool] = []

    def then_write(write: Callable[..., object]) -> Callable[..., object]:
        def written(
            partition: bytes, written_key: bytes, *args: object, **kwargs: object
        ) -> object:
            result = write(partition, written_key, *args, **kwargs)
            if written_key == key and not refused:
                try:
                    admin.branch("release/1").upload("x", b"x")
                    refused.append(False)
                except BranchProtected:
                    refused.append(True)
            return result

        return written

    for name in ("set_if", "create_guarded"):
        monkeypatch.setattr(kv, name, then_write(getattr(kv, name)))
    protected = armed(
        "branch.before_insert", lambda: admin.protect("release/*", no_direct_writes=True)
    )
    with protected:
        writer.create_branch("release/1", source="main")
    assert refused == [True]


def test_a_branch_restored_while_a_protect_fences_gets_its_rules(shared, tmp_path: Path) -> None:
    writer, admin = shared
    writer.create_branch("release/1", source="main")
    dump = tmp_path / "refs.json"
    writer.dump_refs(dump)
    namespace = writer.storage_namespace
    writer.lake.delete_repository(writer.name)
    assert writer.lake.wait_for_cleanup(30)
    bare = writer.lake.create_repository(writer.name, storage_namespace=namespace)
    rules = admin.lake.repository(writer.name)
    protected = armed("branch.before_insert", lambda: rules.protect("release/*", no_delete=True))
    with protected:
        bare.restore_refs(dump)
    with pytest.raises(BranchProtected, match="no_delete"):
        bare.delete_branch("release/1")


def test_a_protect_killed_before_its_fence_is_finished_by_running_it_again(shared) -> None:
    writer, admin = shared

    def die() -> None:
        raise FailpointHit("killed")

    with armed("protect.before_fence", die), pytest.raises(FailpointHit):
        protect_all(admin)
    assert [r.pattern for r in admin.protections()] == ["main"]
    protect_all(admin)
    with pytest.raises(BranchProtected):
        writer.branch("main").upload("x", b"x")


def test_an_unprotect_killed_before_its_fence_is_finished_by_running_it_again(shared) -> None:
    """The retry finds no rule but a branch still stamped with it: it frees the branch and
    returns as done, so an automatically retried task succeeds. A pattern with no rule and
    no branch stamped with one is still `NotFound`."""
    writer, admin = shared
    admin.protect("dev", no_direct_writes=True)

    def die() -> None:
        raise FailpointHit("killed")

    with armed("protect.before_fence", die), pytest.raises(FailpointHit):
        admin.unprotect("dev")
    with pytest.raises(BranchProtected):
        writer.branch("dev").upload("x", b"x")
    admin.unprotect("dev")
    writer.branch("dev").upload("x", b"x")
    for pattern in ("dev", "never/*"):
        with pytest.raises(
            NotFound, match=re.escape(f"no protection rule for pattern {pattern!r}")
        ):
            admin.unprotect(pattern)


# several processes


def _writes_after_protect(kv_url: str, ready, protected) -> dict[str, tuple[str, str]]:
    """Open the lake and every handle first, then try every write once the parent protected
    `main`: what each raised."""
    with Lake.connect(kv_url) as lake:
        repo = lake.repository("guarded")
        repo.branch("main").head()
        ready.set()
        assert protected.wait(120)
        outcome: dict[str, tuple[str, str]] = {}
        for name, write in WRITES.items():
            try:
                write(repo)
                outcome[name] = ("done", "")
            except BranchProtected as refused:
                outcome[name] = (refused.rule, refused.pattern)
        return outcome


def test_processes_that_loaded_the_repository_before_protect_refuse(
    race_kv: str, tmp_path: Path
) -> None:
    with Lake.connect(race_kv) as lake:
        repo = lake.create_repository("guarded", storage_namespace=f"file://{tmp_path}/ns")
        seeded(repo)
        before = snapshot(repo)
        with forked_pool(2) as (manager, pool):
            ready, protected = manager.Event(), manager.Event()
            children = [
                pool.apply_async(_writes_after_protect, (race_kv, ready, protected))
                for _ in range(2)
            ]
            assert ready.wait(120)
            protect_all(repo)
            protected.set()
            outcomes = [child.get(300) for child in children]
        assert outcomes == [RULE_OF, RULE_OF]
        assert snapshot(repo) == before


def _toggle(kv_url: str, pattern: str, rounds: int) -> None:
    with Lake.connect(kv_url, retry=RetryPolicy(attempts=50)) as lake:
        repo = lake.repository("guarded")
        for i in range(rounds):
            if i % 2:
                repo.unprotect(pattern)
            else:
                repo.protect(pattern, no_direct_writes=True, required_checks=[f"c{i}"])


def test_concurrent_rule_changes_leave_every_branch_stamped_from_the_latest_rules(
    race_kv: str, tmp_path: Path
) -> None:
    """Fences of overlapping patterns race: a stamp only moves to a newer book, so none is
    left behind by an older one."""
    with Lake.connect(race_kv) as lake:
        repo = lake.create_repository("guarded", storage_namespace=f"file://{tmp_path}/ns")
        for name in ("release/1", "release/2", "main-x"):
            repo.create_branch(name, source="main")
        patterns = ["release/*", "*", "release/1", "ma*"]
        with forked_pool(len(patterns)) as (_, pool):
            runs = [pool.apply_async(_toggle, (race_kv, p, 5)) for p in patterns]
            for run in runs:
                run.get(600)
        book, _ = read_book(lake.graveler.kv, repo.record)
        assert book.version == len(patterns) * 5
        for branch in lake.graveler.refs.branches(repo.record):
            assert decode_stamp(branch.protection).rules == book.matching(branch.name)
        assert {r.pattern for r in book.rules} == set(patterns)
        assert book.pending == ()


# write-audit-publish: the preview's own checks decide


def test_a_preview_whose_own_check_failed_is_not_published_though_its_source_passed(
    repo: Repository,
) -> None:
    """The check recorded on the commit that lands decides: the source passing on its own
    says nothing of the merged result."""
    repo.protect("main", no_direct_writes=True, required_checks=["quality"])
    source = repo.branch("dev").head().id
    repo.record_check(source, "quality", True)
    preview = repo.merge("dev", into="main", preview=True).commit
    repo.record_check(preview.id, "quality", False, {"unexpected": 12})
    before = snapshot(repo)
    with pytest.raises(ChecksMissing) as refused:
        repo.publish(preview.id, into="main")
    assert (refused.value.missing, refused.value.failed) == ((), ("quality",))
    assert preview.id[:12] in str(refused.value) and "cannot be rewritten" in str(refused.value)
    assert snapshot(repo) == before


def test_a_preview_takes_from_its_source_only_the_checks_not_recorded_on_it(
    repo: Repository,
) -> None:
    repo.protect("main", no_direct_writes=True, required_checks=["quality", "review"])
    source = repo.branch("dev").head().id
    repo.record_check(source, "quality", False)
    repo.record_check(source, "review", True)
    preview = repo.merge("dev", into="main", preview=True).commit
    with pytest.raises(ChecksMissing) as refused:
        repo.publish(preview.id, into="main")
    assert (refused.value.missing, refused.value.failed) == ((), ("quality",))
    repo.record_check(preview.id, "quality", True)
    assert repo.publish(preview.id, into="main").commit.id == preview.id


def test_an_ordinary_merge_is_still_judged_on_the_commit_merged(repo: Repository) -> None:
    repo.protect("main", required_checks=["quality"])
    repo.record_check("dev", "quality", True)
    assert repo.merge("dev", into="main", fast_forward=False).commit.parents[1] == (
        repo.branch("dev").head().id
    )


# the book: bounded, its log filed entry by entry


def _book_value(repo: Repository) -> bytes:
    return repo.lake.graveler.kv.get(repo.record.partition, RULES_KEY).value


def test_the_book_stays_small_however_many_changes_are_logged(repo: Repository) -> None:
    """Each change is filed under its own key: the book holds the rules and one change, so
    it neither grows with the history nor is rewritten whole for it."""
    checks = [f"check-{i:02d}" for i in range(MAX_REQUIRED_CHECKS)]
    sizes = []
    for i in range(120):
        if i % 2:
            repo.unprotect("main", by="ops")
        else:
            repo.protect("main", no_direct_writes=True, required_checks=checks, by="ops")
        sizes.append(len(_book_value(repo)))
    assert max(sizes) < 8 * 1024, sizes[-1]
    log = repo.protection_log()
    assert [c.version for c in log] == list(range(1, 121))
    assert [c.action for c in log[:2]] == ["protect", "unprotect"]
    assert log[0].rule == ProtectionRule("main", True, tuple(checks))
    assert {c.by for c in log} == {"ops"}


@pytest.mark.s3
def test_protect_keeps_working_on_dynamodb_past_its_item_size(
    dynamodb_endpoint: str, tmp_path: Path
) -> None:
    """DynamoDB refuses an item over 400 KB: a book embedding its log failed every protect
    for good after about 80 changes of a rule requiring 64 checks."""
    url = f"dynamodb://{unique_name('protect-')}?endpoint_url={dynamodb_endpoint}&region=us-east-1"
    checks = [f"{'c' * 61}-{i:02d}" for i in range(MAX_REQUIRED_CHECKS)]
    with Lake.connect(url, retry=RetryPolicy(base_delay=0)) as lake:
        repo = lake.create_repository("guarded", storage_namespace=f"file://{tmp_path}/ns")
        for i in range(110):
            required = checks[i % 2 :]
            repo.protect("main", no_direct_writes=True, required_checks=required, by="ops")
        assert len(repo.protection_log()) == 110
        with pytest.raises(BranchProtected):
            repo.branch("main").upload("x", b"x")


def _legacy_book(versions: int) -> bytes:
    """A book as earlier versions wrote it: its whole log embedded."""
    log = []
    for version in range(1, versions + 1):
        action = "protect" if version % 2 else "unprotect"
        rule = {"pattern": "main", "no_direct_writes": True, "required_checks": [],
                "no_delete": False, "no_reset": False}  # fmt: skip
        log.append(
            {
                "version": version,
                "action": action,
                "pattern": "main",
                "rule": rule if action == "protect" else None,
                "by": f"user{version}",
                "at": f"2024-01-01T00:00:{version:02d}+00:00",
            }
        )
    rules = [log[-1]["rule"]] if versions % 2 else []
    document = {"version": versions, "rules": rules, "log": log}
    return json.dumps(document, sort_keys=True, separators=(",", ":")).encode()


def test_a_book_with_an_embedded_log_reads_and_sheds_it_on_the_next_change(
    repo: Repository,
) -> None:
    kv = repo.lake.graveler.kv
    kv.set(repo.record.partition, RULES_KEY, _legacy_book(5))
    assert repo.protections() == [ProtectionRule("main", no_direct_writes=True)]
    assert [(c.version, c.by) for c in repo.protection_log()] == [
        (v, f"user{v}") for v in range(1, 6)
    ]
    repo.protect("dev", no_delete=True, by="new")
    assert "log" not in json.loads(_book_value(repo))
    log = repo.protection_log()
    assert [(c.version, c.by) for c in log] == [(v, f"user{v}") for v in range(1, 6)] + [(6, "new")]
    assert log[0].at == datetime(2024, 1, 1, 0, 0, 1, tzinfo=timezone.utc)
    repo.unprotect("dev", by="newer")
    assert [c.version for c in repo.protection_log()] == list(range(1, 8))
    repo.protect("main", no_direct_writes=True)  # the rule it has: fenced, not logged
    assert len(repo.protection_log()) == 7
    with pytest.raises(BranchProtected):
        repo.branch("main").upload("x", b"x")


def test_a_change_killed_while_filing_an_embedded_log_loses_no_entry(
    repo: Repository, monkeypatch: pytest.MonkeyPatch
) -> None:
    kv = repo.lake.graveler.kv
    kv.set(repo.record.partition, RULES_KEY, _legacy_book(5))
    real = kv.create_guarded
    filed: list[bytes] = []

    def killed_after_two(*args: Any, **kwargs: Any) -> bool:
        if len(filed) == 2:
            raise FailpointHit("killed")
        filed.append(args[1])
        return real(*args, **kwargs)

    monkeypatch.setattr(kv, "create_guarded", killed_after_two)
    with pytest.raises(FailpointHit):
        repo.protect("dev", no_delete=True)
    monkeypatch.undo()
    assert [c.version for c in repo.protection_log()] == [1, 2, 3, 4, 5]
    repo.protect("dev", no_delete=True)
    assert [c.version for c in repo.protection_log()] == [1, 2, 3, 4, 5, 6]


@pytest.mark.parametrize(
    ("by", "said"),
    [
        pytest.param("x" * (TEXT_MAX_BYTES + 1), "96 KiB", id="too-long"),
        pytest.param("ana\udcff", "lone surrogate", id="surrogate"),
        pytest.param(7, "must be a string", id="not-text"),
    ],
)
def test_who_changed_a_rule_or_recorded_a_check_is_bounded(
    repo: Repository, by: object, said: str
) -> None:
    with pytest.raises(InvalidArgument, match=said):
        repo.protect("main", no_delete=True, by=by)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=said):
        repo.unprotect("main", by=by)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=said):
        repo.record_check("main", "quality", True, by=by)  # type: ignore[arg-type]
    assert repo.protections() == [] and repo.protection_log() == []
    assert repo.checks("main") == []
    repo.protect("main", no_delete=True, by="x" * TEXT_MAX_BYTES)
    repo.record_check("main", "quality", True, by="y" * TEXT_MAX_BYTES)


def test_rules_that_would_outgrow_the_book_are_refused_with_what_to_do(
    repo: Repository,
) -> None:
    """Far fewer than `MAX_RULES` rules requiring 64 long check names each would make a book
    (and the records of branches they all match) larger than a DynamoDB item."""
    checks = [f"{'c' * 60}-{i:02d}" for i in range(MAX_REQUIRED_CHECKS)]
    added = 0
    with pytest.raises(InvalidArgument, match="KiB") as refused:
        for added in range(100):
            repo.protect(f"team-{added}/*", required_checks=checks, by="ops")
    assert "require fewer checks" in str(refused.value)
    assert len(repo.protections()) == added and added < MAX_RULES
    repo.unprotect("team-0/*", by="x" * TEXT_MAX_BYTES)
    repo.protect("team-0/*", required_checks=checks[:1], by="x" * TEXT_MAX_BYTES)
    assert len(_book_value(repo)) <= MAX_BOOK_BYTES


# pending fences


def _die() -> None:
    raise FailpointHit("killed")


def test_a_protect_killed_before_its_fence_is_listed_as_pending_and_finished_by_any_change(
    shared,
) -> None:
    writer, admin = shared
    with armed("protect.before_fence", _die), pytest.raises(FailpointHit):
        admin.protect("main", no_direct_writes=True)
    (rule,) = admin.protections()
    assert rule.pending and rule == ProtectionRule("main", no_direct_writes=True)
    writer.branch("main").upload("through", b"the rule is not enforced yet")
    admin.protect("other/*", no_delete=True)
    assert [(r.pattern, r.pending) for r in admin.protections()] == [
        ("main", False),
        ("other/*", False),
    ]
    with pytest.raises(BranchProtected):
        writer.branch("main").upload("x", b"x")
    book, _ = read_book(writer.lake.graveler.kv, writer.record)
    assert book.pending == ()


def test_an_unprotect_killed_before_its_fence_is_listed_and_finished_by_any_change(
    shared,
) -> None:
    writer, admin = shared
    admin.protect("dev", no_direct_writes=True)
    with armed("protect.before_fence", _die), pytest.raises(FailpointHit):
        admin.unprotect("dev")
    assert admin.protections() == [] and admin.pending_unprotects() == ["dev"]
    with pytest.raises(BranchProtected):
        writer.branch("dev").upload("x", b"x")
    admin.protect("main", no_delete=True)
    assert admin.pending_unprotects() == []
    writer.branch("dev").upload("x", b"x")


def test_an_unprotect_killed_after_its_fence_is_done_when_run_again(
    shared, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its fence freed every branch but its mark stayed: the retry, which frees nothing
    more, still returns as done (a retried task succeeds)."""
    _, admin = shared
    admin.protect("dev", no_direct_writes=True)
    monkeypatch.setattr(protection, "_settle", lambda *args: None)
    admin.unprotect("dev")
    monkeypatch.undo()
    assert admin.pending_unprotects() == ["dev"]
    admin.unprotect("dev")
    assert admin.pending_unprotects() == []
    with pytest.raises(NotFound):
        admin.unprotect("dev")


def test_a_fence_leaves_the_mark_of_a_later_change_it_did_not_cover(
    shared, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A protect's fence ends after another protect of the same pattern changed the book
    and was killed before fencing: the first must not clear the second's mark, whose rule
    the branch does not carry."""
    writer, admin = shared
    real = protection.fence
    raced: list[bool] = []

    def fence_then_another_protect(g: Graveler, record: Any, pattern: str) -> bool:
        freed = real(g, record, pattern)
        if not raced:
            raced.append(True)
            with armed("protect.before_fence", _die), pytest.raises(FailpointHit):
                admin.protect("main", no_direct_writes=True)
        return freed

    monkeypatch.setattr(protection, "fence", fence_then_another_protect)
    writer.protect("main", no_delete=True)
    monkeypatch.undo()
    assert [(r.pattern, r.no_direct_writes, r.pending) for r in writer.protections()] == [
        ("main", True, True)
    ]
    writer.branch("main").upload("through", b"not enforced yet")
    admin.protect("main", no_direct_writes=True)
    assert not writer.protections()[0].pending
    with pytest.raises(BranchProtected):
        writer.branch("main").upload("x", b"x")


def _protect_killed_before_fence(kv_url: str) -> None:
    with Lake.connect(kv_url) as lake:
        lake.repository("guarded").protect("release/*", no_direct_writes=True)


def test_a_protect_killed_in_another_process_is_pending_until_a_change_elsewhere(
    race_kv: str, tmp_path: Path
) -> None:
    with Lake.connect(race_kv, retry=RetryPolicy(base_delay=0)) as lake:
        repo = lake.create_repository("guarded", storage_namespace=f"file://{tmp_path}/ns")
        release = repo.create_branch("release/1", source="main")
        killed = forked_run(
            _protect_killed_before_fence,
            race_kv,
            env={failpoints.ENV: "protect.before_fence=kill"},
        )
        assert killed.code == -signal.SIGKILL, killed
        assert [(r.pattern, r.pending) for r in repo.protections()] == [("release/*", True)]
        release.upload("through", b"not enforced yet")
        with forked_pool(1) as (_, pool):
            pool.apply(_protect_main, (race_kv,))
        assert [(r.pattern, r.pending) for r in repo.protections()] == [
            ("main", False),
            ("release/*", False),
        ]
        with pytest.raises(BranchProtected):
            release.upload("x", b"x")


def _protect_main(kv_url: str) -> None:
    with Lake.connect(kv_url) as lake:
        lake.repository("guarded").protect("main", no_delete=True)
