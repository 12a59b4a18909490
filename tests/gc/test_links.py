"""get/link_physical_address: signed, expiring, single-use tokens; a refused link stages nothing."""

from __future__ import annotations

import base64
import json
import threading
from datetime import timedelta
from pathlib import Path

import pytest

from branchwater.engine import (
    InvalidAddress,
    InvalidArgument,
    InvalidToken,
    Lake,
    NoChanges,
    NotFound,
    TokenAlreadyUsed,
    TokenExpired,
    failpoints,
)
from branchwater.engine.api import Branch, Repository
from branchwater.engine.gc.settings import DEFAULT_TOKEN_EXPIRY, GCSettings
from branchwater.engine.gc.tokens import USED_TOKENS_PREFIX, LinkTokens
from branchwater.engine.graveler import writes
from branchwater.engine.graveler.fence import OPERATION_MARGIN
from branchwater.engine.kv import open_store
from tests.helpers.gc import FakeClock, staged_paths, upload_to, use_clock


def test_link_stages_the_object_written_at_the_address(repo: Repository) -> None:
    main = repo.branch("main")
    physical = main.get_physical_address()
    upload_to(main, physical.address, b"written by spark")
    entry = main.link_physical_address(
        "tables/t.parquet", physical.token, size=16, checksum="abc", metadata={"by": "spark"}
    )
    assert entry.address == physical.address
    assert main.read("tables/t.parquet") == b"written by spark"
    assert main.stat("tables/t.parquet").metadata == {"by": "spark"}
    assert main.stat("tables/t.parquet").checksum == "abc"


def test_token_expiry_is_configurable_and_gc_min_age_never_shorter(lake: Lake) -> None:
    assert GCSettings().token_expiry == DEFAULT_TOKEN_EXPIRY == timedelta(hours=6)
    assert GCSettings().default_min_age == GCSettings().token_expiry + OPERATION_MARGIN
    long = GCSettings(token_expiry=timedelta(hours=12))
    assert long.default_min_age == timedelta(hours=12) + OPERATION_MARGIN
    short = GCSettings(token_expiry=timedelta(hours=1))
    assert short.default_min_age == DEFAULT_TOKEN_EXPIRY + OPERATION_MARGIN
    for expiry in (timedelta(0), timedelta(days=10**8), 6):
        with pytest.raises(InvalidArgument, match="token_expiry must be a duration above 0"):
            GCSettings(token_expiry=expiry)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match="outlive"):
        GCSettings(copy_record_ttl=timedelta(minutes=5))


def test_expiry_follows_the_settings(lake: Lake, repo: Repository) -> None:
    clock = FakeClock()
    use_clock(lake, clock, GCSettings(token_expiry=timedelta(hours=1)))
    physical = repo.branch("main").get_physical_address()
    assert physical.expires == clock.now + timedelta(hours=1)


def tamper(token: str, **changes: object) -> str:
    version, body, signature = token.split(".")
    payload = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    payload.update(changes)
    new_body = base64.urlsafe_b64encode(json.dumps(payload).encode()).rstrip(b"=").decode()
    return f"{version}.{new_body}.{signature}"


def refused(branch: Branch, token: str, error: type[Exception], size: int = 1, **kw) -> None:
    with pytest.raises(error) as raised:
        branch.link_physical_address("linked", token, size=size, checksum="c", **kw)
    assert str(raised.value)
    assert staged_paths(branch) == []


def test_forged_signature_is_refused(repo: Repository) -> None:
    main = repo.branch("main")
    physical = main.get_physical_address()
    upload_to(main, physical.address, b"x")
    version, body, signature = physical.token.split(".")
    flipped = signature[:-2] + ("AA" if signature[-2:] != "AA" else "BB")
    refused(main, f"{version}.{body}.{flipped}", InvalidToken)
    refused(main, tamper(physical.token, e=9_999_999_999_999), InvalidToken)
    refused(main, "not a token", InvalidToken)
    refused(main, "v1.@@@.@@@", InvalidToken)


def test_a_token_from_another_lake_is_refused(repo: Repository, tmp_path: Path) -> None:
    with Lake.connect("memory://") as other_lake:
        other = other_lake.create_repository("sales", storage_namespace=f"file://{tmp_path}/o")
        foreign = other.branch("main").get_physical_address()
    main = repo.branch("main")
    upload_to(main, foreign.address, b"x")
    refused(main, foreign.token, InvalidToken)


def test_another_repositorys_token_is_refused(lake: Lake, repo: Repository, tmp_path) -> None:
    other = lake.create_repository("other", storage_namespace=f"file://{tmp_path}/other")
    physical = other.branch("main").get_physical_address()
    main = repo.branch("main")
    upload_to(main, physical.address, b"x")
    refused(main, physical.token, InvalidToken)


def test_another_branchs_token_is_refused(repo: Repository) -> None:
    dev = repo.create_branch("dev")
    physical = dev.get_physical_address()
    main = repo.branch("main")
    upload_to(main, physical.address, b"x")
    refused(main, physical.token, InvalidToken)
    assert staged_paths(dev) == []


def test_an_expired_token_is_refused(lake: Lake, repo: Repository) -> None:
    clock = FakeClock()
    use_clock(lake, clock)
    main = repo.branch("main")
    physical = main.get_physical_address()
    upload_to(main, physical.address, b"x")
    clock.advance(DEFAULT_TOKEN_EXPIRY)
    refused(main, physical.token, TokenExpired)


def test_a_link_stalled_past_its_expiry_before_staging_is_refused(
    lake: Lake, repo: Repository
) -> None:
    """Checked live, then stalled until the token expired: staging now could follow the
    check by more than GC's margin, so the link checks again and stages nothing."""
    clock = FakeClock()
    use_clock(lake, clock)
    main = repo.branch("main")
    physical = main.get_physical_address()
    upload_to(main, physical.address, b"x")
    with failpoints.armed("link.before_stage", lambda: clock.advance(DEFAULT_TOKEN_EXPIRY)):
        refused(main, physical.token, TokenExpired)


def test_a_reused_token_is_refused(repo: Repository) -> None:
    main = repo.branch("main")
    physical = main.get_physical_address()
    upload_to(main, physical.address, b"x")
    main.link_physical_address("first", physical.token, size=1, checksum="c")
    with pytest.raises(TokenAlreadyUsed):
        main.link_physical_address("second", physical.token, size=1, checksum="c")
    assert staged_paths(main) == ["first"]


def test_concurrent_links_with_one_token_stage_once(repo: Repository) -> None:
    main = repo.branch("main")
    physical = main.get_physical_address()
    upload_to(main, physical.address, b"x")
    outcomes: list[str] = []

    def link(i: int) -> None:
        try:
            main.link_physical_address(f"p{i}", physical.token, size=1, checksum="c")
            outcomes.append("linked")
        except TokenAlreadyUsed:
            outcomes.append("refused")

    threads = [threading.Thread(target=link, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["linked"] + ["refused"] * 7
    assert len(staged_paths(main)) == 1


def test_a_signed_address_outside_data_is_refused(lake: Lake, repo: Repository) -> None:
    main = repo.branch("main")
    for address in ("_branchwater/repository", "../elsewhere/x", "s3://bucket/data/x"):
        token = lake.gc.tokens.issue(repo.record, "main", address).token
        refused(main, token, InvalidAddress)


def test_a_given_address_must_be_the_tokens(repo: Repository) -> None:
    main = repo.branch("main")
    physical = main.get_physical_address()
    upload_to(main, physical.address, b"x")
    refused(main, physical.token, InvalidAddress, address="s3://other/data/x")
    refused(main, physical.token, InvalidAddress, address="/abs/path")
    other = main.get_physical_address().address
    refused(main, physical.token, InvalidAddress, address=other)
    entry = main.link_physical_address(
        "ok", physical.token, size=1, checksum="c", address=physical.address
    )
    assert entry.address == physical.address


def test_a_failed_link_does_not_spend_the_token(repo: Repository, monkeypatch) -> None:
    main = repo.branch("main")
    physical = main.get_physical_address()
    refused(main, physical.token, NotFound)
    upload_to(main, physical.address, b"xyz")
    refused(main, physical.token, InvalidArgument, size=2)

    def broken(*args, **kwargs):
        raise NotFound("branch vanished")

    with monkeypatch.context() as patch:
        patch.setattr(writes, "stage_entry", broken)
        refused(main, physical.token, NotFound, size=3)
    main.link_physical_address("finally", physical.token, size=3, checksum="c")
    assert staged_paths(main) == ["finally"]


@pytest.mark.parametrize(
    ("size", "checksum", "metadata"),
    [(-1, "c", None), ("1", "c", None), (1, "", None), (1, "c", {"k": 1})],
)
def test_bad_link_arguments_are_refused(repo: Repository, size, checksum, metadata) -> None:
    main = repo.branch("main")
    physical = main.get_physical_address()
    with pytest.raises(InvalidArgument):
        main.link_physical_address(
            "p", physical.token, size=size, checksum=checksum, metadata=metadata
        )


def test_an_address_for_a_missing_branch_is_refused(repo: Repository) -> None:
    dev = repo.create_branch("dev")
    repo.delete_branch("dev")
    with pytest.raises(NotFound):
        dev.get_physical_address()


def test_the_signing_key_is_created_once_per_lake(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path}/lake.db"
    with Lake.connect(url) as first, Lake.connect(url) as second:
        repo = first.create_repository("sales", storage_namespace=f"file://{tmp_path}/ns")
        physical = repo.branch("main").get_physical_address()
        upload_to(repo.branch("main"), physical.address, b"x")
        other = second.repository("sales").branch("main")
        other.link_physical_address("p", physical.token, size=1, checksum="c")
        assert first.gc.tokens.signing_key() == second.gc.tokens.signing_key()


def test_racing_processes_agree_on_one_signing_key() -> None:
    store = open_store("memory://")
    keys: list[bytes] = []
    barrier = threading.Barrier(8)

    def load() -> None:
        tokens = LinkTokens(store, DEFAULT_TOKEN_EXPIRY)
        barrier.wait()
        keys.append(tokens.signing_key())

    threads = [threading.Thread(target=load) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(keys)) == 1 and len(keys[0]) == 32


def test_used_tokens_are_forgotten_once_expired(lake: Lake, repo: Repository) -> None:
    """The sweep the first link starts in the background reads the fake clock when it runs:
    awaited before the clock passes an expiry, it cannot take the tokens counted here."""
    clock = FakeClock()
    use_clock(lake, clock)
    main = repo.branch("main")
    for i in range(3):
        physical = main.get_physical_address()
        upload_to(main, physical.address, b"x")
        main.link_physical_address(f"p{i}", physical.token, size=1, checksum="c")
        clock.advance(timedelta(hours=1))
    assert lake.gc.housekeeper.wait(30)

    def used() -> int:
        prefix = USED_TOKENS_PREFIX
        keys = lake.graveler.kv.scan(repo.record.partition, prefix)
        return sum(1 for key, _ in keys if key.startswith(prefix))

    assert used() == 3
    clock.advance(DEFAULT_TOKEN_EXPIRY - timedelta(hours=2, minutes=30))
    assert lake.gc.tokens.sweep(repo.record) == 1
    assert used() == 2
    clock.advance(timedelta(days=1))
    assert lake.gc.tokens.sweep(repo.record) == 2
    assert used() == 0


def test_a_retried_link_of_the_same_content_commits_once_then_finds_no_changes(
    repo: Repository,
) -> None:
    """An Airflow task that links its output and commits, run twice: the retry's link stages
    nothing (the branch keeps the first object) and its commit finds nothing to commit."""
    main = repo.branch("main")

    def link_output() -> str:
        physical = main.get_physical_address()
        upload_to(main, physical.address, b"part")
        linked = main.link_physical_address("out/part-0", physical.token, size=4, checksum="9" * 64)
        return linked.address

    first = link_output()
    main.commit("task output")
    head = main.commit_id
    assert link_output() == first
    assert main.stat("out/part-0").address == first
    assert staged_paths(main) == []
    with pytest.raises(NoChanges):
        main.commit("task output")
    assert main.commit_id == head
