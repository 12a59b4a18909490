"""What the history checker found, forced so it fails without the fix every time, and the
seeds that found it run again with the others (`test_histories.REGRESSION_SEEDS`).

Seeds 36 and 41 (SQLite, fast settings): a delete on `shared` stopped by a failpoint between
its tombstone and its validating read, then retried, got `NotFound`; once the concurrent
commit landed, the path showed again. The first attempt's branch read came before a commit
sealed the staging token, so its tombstone landed in a sealed token after the commit had
read it; the retry's look found that tombstone and took the path for gone, and the commit
dropped the token with the tombstone it never held. A retried delete (an Airflow task
retried, say) reported the path absent and left it there.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from branchwater.engine import Lake, NotFound, failpoints
from branchwater.engine.api import Repository
from branchwater.engine.graveler import reads, writes
from tests.helpers.failpoints import paused_at
from tests.helpers.servers import unique_name


@pytest.fixture
def two_lakes(race_kv: str, tmp_path: Path) -> Iterator[tuple[Repository, Repository]]:
    """One repository seen through two lakes (two caches): a deleting client, a committer."""
    with Lake.connect(race_kv) as deleting, Lake.connect(race_kv) as committing:
        name = unique_name("regression-")
        repo = deleting.create_repository(name, storage_namespace=f"file://{tmp_path}/{name}")
        yield repo, committing.repository(name)


def test_a_retried_delete_whose_tombstone_a_commit_missed_still_deletes(
    two_lakes: tuple[Repository, Repository], monkeypatch: pytest.MonkeyPatch
) -> None:
    repo, other = two_lakes
    branch = repo.branch("main")
    branch.upload("p", b"committed")
    branch.commit("p")
    branch.upload("q", b"staged, for the commit to take")
    g = repo.lake.graveler
    look_up = reads.find_branch_look

    def commit_seals_and_builds_after_the_look(*args: Any) -> Any:
        """The delete's look, then a commit that seals the token and builds its ranges, held
        before its branch swap; the delete's next read comes from a record cached before
        the seal, so its tombstone goes to the token the commit has already read."""
        found = look_up(*args)
        if not committer.is_alive() and not pause.reached.is_set():
            before = g.read_branch(repo.record, "main")
            committer.start()
            pause.wait()
            g.branch_cache.put(repo.record, before)
        return found

    with paused_at("commit.before_set") as pause:
        committer = threading.Thread(target=lambda: other.branch("main").commit("q"))
        with monkeypatch.context() as patched:
            for module in (reads, writes):
                patched.setattr(module, "find_branch_look", commit_seals_and_builds_after_the_look)
            with (
                failpoints.armed("write.before_validate", _raise),
                pytest.raises(failpoints.FailpointHit),
            ):
                branch.delete("p")
        branch.delete("p")
        pause.release()
        committer.join(30)
    assert not committer.is_alive()
    with pytest.raises(NotFound):
        branch.read("p")
    branch.commit("delete p")
    assert [e.path for e in repo.ref("main").list()] == ["q"]


def _raise() -> None:
    raise failpoints.FailpointHit("write.before_validate")
