"""Lookups and listings on a branch whose layers change while they read (the in-memory KV,
one process).

A lookup reads the branch's tokens one by one, a listing scans them; here the branch changes
between two of those reads, exactly where a concurrent committer or compactor would change
it. The multi-process races of `test_consistency` and `test_compaction_concurrency` cover the
real thing.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest

from branchwater.engine import Lake, NotFound
from branchwater.engine.api import Branch, Repository
from branchwater.engine.graveler import commit as commit_ops
from branchwater.engine.graveler import reads
from branchwater.engine.graveler.commit import sealing
from branchwater.engine.graveler.staging import StagingArea


class Interfering(StagingArea):
    """The lake's staging area, running `before` ahead of each probe or scan of `token`."""

    def __init__(self, inner: StagingArea, token: str, before: Callable[[], None]) -> None:
        self.__dict__.update(inner.__dict__)
        self.token, self.before, self.probes, self.scans = token, before, 0, 0

    def get(self, token: str, path: str):  # type: ignore[no-untyped-def]
        if token == self.token:
            self.probes += 1
            self.before()
        return super().get(token, path)

    def scan(self, token: str, after: str = "", prefix: str = ""):  # type: ignore[no-untyped-def]
        if token == self.token:
            self.scans += 1
            self.before()
        return super().scan(token, after, prefix)


def seal(lake: Lake, repo: Repository) -> str:
    """Seal main's staging token as the first step of a commit or compaction does; the token."""
    g = lake.graveler
    branch, predicate = g.refs.get_branch(repo.record, "main")
    assert g.try_update_branch(repo.record, sealing(repo.record, branch), predicate)
    return branch.staging_token


def commit(lake: Lake, branch: Branch, message: str) -> None:
    """Commit, and drop the tokens it took before going on, as a fast committer would."""
    branch.commit(message)
    assert lake.graveler.wait_for_background(timeout=30)


def interfere(lake: Lake, token: str, before: Callable[[], None]) -> Interfering:
    staging = Interfering(lake.graveler.staging, token, before)
    lake.graveler.staging = staging
    return staging


def once(action: Callable[[], object]) -> Callable[[], None]:
    """`action` on the first call only; it may itself probe the token it interferes with."""
    calls: list[None] = []

    def run() -> None:
        if not calls:
            calls.append(None)
            action()

    return run


@pytest.fixture
def main(repo: Repository) -> Branch:
    main = repo.branch("main")
    main.upload("base", b"committed")
    main.commit("base")
    return main


def test_a_path_in_a_sealed_token_reads_while_tokens_keep_being_sealed_above_it(
    lake: Lake, repo: Repository, main: Branch
) -> None:
    address = main.upload("p", b"v1").address
    sealed = seal(lake, repo)
    staging = interfere(lake, sealed, lambda: seal(lake, repo))

    assert main.stat("p").address == address
    assert staging.probes == 1, "a token sealed above the answer is probed alone"


def test_a_write_landing_above_the_answer_while_it_is_looked_up_is_the_one_read(
    lake: Lake, repo: Repository, main: Branch
) -> None:
    main.upload("p", b"old")
    sealed = seal(lake, repo)
    interfere(lake, sealed, once(lambda: (seal(lake, repo), main.upload("p", b"new"))))

    assert main.read("p") == b"new"


def test_a_token_a_commit_takes_while_it_is_looked_up_is_read_again_from_the_commit(
    lake: Lake, repo: Repository, main: Branch
) -> None:
    address = main.upload("p", b"v1").address
    sealed = seal(lake, repo)
    staging = interfere(lake, sealed, once(lambda: commit(lake, main, "takes the sealed token")))

    assert main.stat("p").address == address
    assert lake.graveler.read_branch(repo.record, "main").sealed_tokens == ()
    assert staging.probes == 1


def test_a_read_in_another_process_sees_a_write_made_after_its_branch_was_cached(
    tmp_path,
) -> None:
    """Read-after-write across processes: the branch cache may serve a read's first look at
    the branch, never its answer. Here the old token's rows are kept (its drop held back), so
    a lookup trusting the cached record would find the old value in it."""
    url = f"sqlite:///{tmp_path}/lake.db"
    with Lake.connect(url) as writer, Lake.connect(url) as reader:
        writer.create_repository("cached", storage_namespace=f"file://{tmp_path}/ns")
        written = writer.repository("cached").branch("main")
        written.upload("p", b"v1")
        read = reader.repository("cached").branch("main")
        assert read.read("p") == b"v1"
        writer.graveler.drop_listed_later = lambda mark, partitions: None  # type: ignore[method-assign]
        written.commit("seals the token the reader has cached")
        written.upload("p", b"v2")

        assert read.read("p") == b"v2"


def test_a_missing_path_is_not_found_while_tokens_keep_being_sealed(
    lake: Lake, repo: Repository, main: Branch
) -> None:
    main.upload("other", b"x")
    sealed = seal(lake, repo)
    interfere(lake, sealed, lambda: seal(lake, repo))

    with pytest.raises(NotFound, match="'p' not found on branch 'main'"):
        main.stat("p")
    assert main.stat("base").address


def test_a_delete_over_a_late_tombstone_in_a_sealed_token_leaves_a_tombstone(
    lake: Lake, repo: Repository, main: Branch, monkeypatch
) -> None:
    """A writer that saw the branch before a commit sealed its token can still delete into
    that token after the commit has read it (and then deletes again in the new token). A later
    delete must not take that late tombstone for what lies below and just drop its staged
    entry: the commit lands without the tombstone, and HEAD's older copy would show again."""
    main.upload("p", b"old")
    main.commit("p is old in HEAD")
    main.upload("p", b"v1")
    g, apply_sealed = lake.graveler, commit_ops.apply_sealed

    def late_writes_while_the_commit_builds(*args, **kwargs):
        applied = apply_sealed(*args, **kwargs)
        branch = g.read_branch(repo.record, "main")
        for token in (branch.sealed_tokens[0], branch.staging_token):
            g.staging.put(token, "p", None)
        main.upload("p", b"v2")
        main.delete("p")
        return applied

    monkeypatch.setattr(commit_ops, "apply_sealed", late_writes_while_the_commit_builds)
    commit = main.commit("read its token before the late tombstone")

    assert repo.ref(commit.id).read("p") == b"v1"
    with pytest.raises(NotFound):
        main.stat("p")
    assert [e.path for e in main.list()] == ["base"]


def test_an_upload_of_what_a_late_write_in_a_sealed_token_shows_is_staged(
    lake: Lake, repo: Repository, main: Branch, monkeypatch
) -> None:
    """Another writer's late write in a sealed token shows while that writer is still on its
    way to the new token; an upload of the same content must not be skipped for it, or the
    upload vanishes with the sealed token when the commit that missed the row lands."""
    main.upload("p", b"old")
    main.commit("p is old in HEAD")
    main.upload("q", b"q")
    g, apply_sealed = lake.graveler, commit_ops.apply_sealed
    uploaded: list[str] = []

    def a_late_write_while_the_commit_builds(*args, **kwargs):
        applied = apply_sealed(*args, **kwargs)
        main.upload("elsewhere", b"new")
        branch = g.read_branch(repo.record, "main")
        _, new = g.staging.get(branch.staging_token, "elsewhere")
        assert new is not None
        g.staging.put(branch.sealed_tokens[0], "p", new._replace(path="p"))
        uploaded.append(main.upload("p", b"new").address)
        return applied

    monkeypatch.setattr(commit_ops, "apply_sealed", a_late_write_while_the_commit_builds)
    main.commit("read its token before the late write")

    assert main.read("p") == b"new"
    assert main.stat("p").address == uploaded[0]


def listing(branch: Branch) -> list[tuple[str, bytes]]:
    return [(entry.path, branch.read(entry.path)) for entry in branch.list()]


def test_a_listing_completes_while_tokens_keep_being_sealed_above_its_pages(
    lake: Lake, repo: Repository, main: Branch
) -> None:
    for path in ("a", "b", "c"):
        main.upload(path, path.encode())
    sealed = seal(lake, repo)
    staging = interfere(lake, sealed, lambda: seal(lake, repo))

    assert [e.path for e in main.list()] == ["a", "b", "base", "c"]
    assert staging.scans == 1, "a token sealed above the page is read alone"


def test_writes_and_deletes_landing_above_a_page_while_it_is_read_are_in_it(
    lake: Lake, repo: Repository, main: Branch, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Pages of two: what lands above a full page counts only within its span, and the next
    page starts after that span, so nothing shows twice or is skipped."""
    monkeypatch.setattr(reads, "PAGE_SIZE", 2)
    for path in ("a", "c", "e", "g"):
        main.upload(path, b"old")
    sealed = seal(lake, repo)

    def land_above() -> None:
        seal(lake, repo)
        main.upload("b", b"new")
        main.upload("c", b"new")
        main.delete("e")
        main.upload("f", b"new")

    interfere(lake, sealed, once(land_above))

    assert listing(main) == [
        ("a", b"old"),
        ("b", b"new"),
        ("base", b"committed"),
        ("c", b"new"),
        ("f", b"new"),
        ("g", b"old"),
    ]


def test_a_page_whose_tokens_a_commit_takes_while_it_is_read_is_read_again(
    lake: Lake, repo: Repository, main: Branch
) -> None:
    main.upload("p", b"v1")
    sealed = seal(lake, repo)
    staging = interfere(lake, sealed, once(lambda: commit(lake, main, "takes the sealed token")))

    assert listing(main) == [("base", b"committed"), ("p", b"v1")]
    assert lake.graveler.read_branch(repo.record, "main").sealed_tokens == ()
    assert staging.scans == 1
