"""Creating repositories against each other, across processes: a storage namespace belongs to
one repository, whatever the interleaving."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from branchwater.engine import (
    AlreadyExists,
    ConfigurationError,
    Lake,
    NotFound,
    Unavailable,
    failpoints,
)
from branchwater.engine.graveler.model import RepositoryRecord
from branchwater.engine.graveler.namespaces import location_of
from tests.helpers.failpoints import PAUSE_TIMEOUT, held_at, paused_at
from tests.helpers.servers import forked_pool


def _create(kv_url: str, name: str, namespace: str, point: str, barrier: Any) -> str:
    """Create `name` on `namespace`, each creator held at `point` until all reached it."""
    with Lake.connect(kv_url) as lake, failpoints.armed(point, lambda: barrier.wait(60)):
        try:
            lake.create_repository(name, storage_namespace=namespace)
        except AlreadyExists as refused:
            return f"refused: {refused}"
    return "created"


def _race(
    creations: list[tuple[str, str, str]], point: str = "repository.before_claim"
) -> list[str]:
    """Each (lake's KV URL, name, namespace) created in a process of its own, all held at
    `point` until each reached it (by default before the claim: whatever one read of the
    namespace before, it read before another claimed)."""
    for kv_url in {kv_url for kv_url, _, _ in creations}:
        with Lake.connect(kv_url):
            pass
    with forked_pool(len(creations)) as (manager, pool):
        barrier = manager.Barrier(len(creations))
        jobs = [pool.apply_async(_create, (*creation, point, barrier)) for creation in creations]
        return [job.get(120) for job in jobs]


def test_two_repositories_never_share_a_namespace_created_at_once(
    race_kv: str, tmp_path: Path
) -> None:
    namespace = f"file://{tmp_path}/shared"
    outcomes = _race([(race_kv, "alpha", namespace), (race_kv, "beta", namespace)])
    assert sorted(o.split(":")[0] for o in outcomes) == ["created", "refused"], outcomes
    winner = ("alpha", "beta")[outcomes.index("created")]
    with Lake.connect(race_kv) as lake:
        assert [r.name for r in lake.repositories()] == [winner]
    assert "already used by repository" in next(o for o in outcomes if o != "created")


def test_two_lakes_never_mark_one_namespace_at_once(tmp_path: Path) -> None:
    """Lakes of their own share no claims: held with the marker's bytes made, each past any
    look at the namespace, the marker's conditional write alone lets one of two creators
    through."""
    namespace = f"file://{tmp_path}/shared"
    creations = [(f"sqlite:///{tmp_path}/{name}.db", name, namespace) for name in ("alpha", "beta")]
    outcomes = _race(creations, "repository.before_mark")
    assert sorted(o.split(":")[0] for o in outcomes) == ["created", "refused"], outcomes
    assert "already used by repository" in next(o for o in outcomes if o != "created")


def test_nested_namespaces_created_at_once_never_both_pass(race_kv: str, tmp_path: Path) -> None:
    outer, inner = f"file://{tmp_path}/outer", f"file://{tmp_path}/outer/data/inner"
    outcomes = _race([(race_kv, "alpha", outer), (race_kv, "beta", inner)])
    assert outcomes.count("created") <= 1, outcomes
    assert all("overlaps" in o for o in outcomes if o != "created"), outcomes
    with Lake.connect(race_kv) as lake:
        created = [r.name for r in lake.repositories()]
        assert len(created) == outcomes.count("created")
        if not created:
            lake.create_repository("gamma", storage_namespace=inner)


def test_a_namespace_inside_or_around_another_is_refused(lake: Lake, tmp_path: Path) -> None:
    lake.create_repository("outer", storage_namespace=f"file://{tmp_path}/lake/outer")
    for namespace in (f"file://{tmp_path}/lake/outer/sub", f"file://{tmp_path}/lake"):
        with pytest.raises(AlreadyExists, match="used by repository 'outer'"):
            lake.create_repository("other", storage_namespace=namespace)
    lake.create_repository("sibling", storage_namespace=f"file://{tmp_path}/lake/outer-2")
    assert sorted(r.name for r in lake.repositories()) == ["outer", "sibling"]


def test_a_deleted_repository_frees_the_namespaces_around_its_own(
    lake: Lake, tmp_path: Path
) -> None:
    namespace = f"file://{tmp_path}/outer"
    lake.create_repository("outer", storage_namespace=namespace)
    lake.delete_repository("outer")
    with pytest.raises(AlreadyExists, match="already used by repository 'outer'"):
        lake.create_repository("other", storage_namespace=namespace)
    lake.create_repository("inner", storage_namespace=f"{namespace}/inner")
    lake.delete_repository("inner")
    lake.create_repository("outer", storage_namespace=namespace)


def test_a_refused_creation_leaves_no_claim(lake: Lake, tmp_path: Path) -> None:
    """Another lake's marker refuses the namespace after this lake's claim was made: the
    claim goes with the refusal, so it blocks no namespace inside that one."""
    namespace = f"file://{tmp_path}/theirs"
    with Lake.connect(f"sqlite:///{tmp_path}/their-lake.db") as theirs:
        theirs.create_repository("theirs", storage_namespace=namespace)
    with pytest.raises(AlreadyExists, match="already used by repository 'theirs'"):
        lake.create_repository("mine", storage_namespace=namespace)
    lake.create_repository("nested", storage_namespace=f"{namespace}/nested")


def test_a_creation_failing_after_its_claim_leaves_no_claim(
    lake: Lake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unreachable(*args: object, **kwargs: object) -> None:
        raise Unavailable("the KV store went away")

    monkeypatch.setattr(lake.graveler.refs, "add_commit", unreachable)
    with pytest.raises(Unavailable):
        lake.create_repository("alpha", storage_namespace=f"file://{tmp_path}/alpha")
    assert list(lake.graveler.refs.namespace_claims()) == []
    monkeypatch.undo()
    lake.create_repository("beta", storage_namespace=f"file://{tmp_path}/alpha/inner")


@pytest.mark.parametrize("odd", ["\udc80", "\n", "\x1b[31m", "\x00"])
def test_a_namespace_that_is_not_printable_text_is_refused(
    lake: Lake, tmp_path: Path, odd: str
) -> None:
    with pytest.raises(ConfigurationError, match="printable characters"):
        lake.create_repository("alpha", storage_namespace=f"file://{tmp_path}/a{odd}b")
    assert list(lake.graveler.refs.namespace_claims()) == []
    assert lake.repositories() == []


def test_a_claim_left_by_a_killed_creator_lets_its_name_create_again(
    lake: Lake, tmp_path: Path
) -> None:
    namespace = f"file://{tmp_path}/alpha"
    left = RepositoryRecord("alpha", namespace, "main", "0" * 16, datetime.now(UTC))
    assert lake.graveler.refs.claim_namespace(location_of(namespace), left) is None
    with pytest.raises(AlreadyExists, match="already used by repository 'alpha'"):
        lake.create_repository("beta", storage_namespace=namespace)
    lake.create_repository("alpha", storage_namespace=namespace)
    lake.delete_repository("alpha")
    assert list(lake.graveler.refs.namespace_claims()) == []


def _claims(lake: Lake) -> list[tuple[str, str]]:
    return [(c.repository, c.unique_id) for c in lake.graveler.refs.namespace_claims()]


def test_a_name_created_again_during_its_delete_keeps_its_claim(lake: Lake, tmp_path: Path) -> None:
    """The delete of `alpha` held after removing its record, before freeing the claim, while
    `alpha` is created again on its namespace: the claim the creation took over is the new
    repository's, and the delete, which frees only its own repository's, leaves it. Freed,
    it would let a repository on a namespace inside this one pass a check made before the
    new record was in."""
    namespace = f"file://{tmp_path}/alpha"
    lake.create_repository("alpha", storage_namespace=namespace)
    with held_at("repository.before_release", lambda: lake.delete_repository("alpha")) as deleting:
        again = lake.create_repository("alpha", storage_namespace=namespace)
    assert deleting.raised is None
    assert _claims(lake) == [("alpha", again.record.unique_id)]
    lake.delete_repository("alpha")
    assert _claims(lake) == []


def test_of_two_creations_of_one_name_the_loser_puts_back_the_claim_it_took_over(
    lake: Lake, tmp_path: Path
) -> None:
    """The first creator claims and is held before marking; the second takes the claim over
    and is held; the first finishes, the second is refused by the name and puts the first's
    claim back, so the repository that exists holds its namespace and its delete frees it."""
    namespace = f"file://{tmp_path}/alpha"
    create = lambda: lake.create_repository("alpha", storage_namespace=namespace)  # noqa: E731
    with ThreadPoolExecutor(2) as pool, paused_at("repository.before_mark") as marking:
        first = pool.submit(create)
        marking.wait()
        with paused_at("repository.after_claim") as taking:
            second = pool.submit(create)
            taking.wait()
            marking.release()
            created = first.result(PAUSE_TIMEOUT)
            assert _claims(lake) != [("alpha", created.record.unique_id)]
            taking.release()
            with pytest.raises(AlreadyExists, match="repository 'alpha' already exists"):
                second.result(PAUSE_TIMEOUT)
    assert _claims(lake) == [("alpha", created.record.unique_id)]
    lake.delete_repository("alpha")
    assert _claims(lake) == []


def test_overlap_is_judged_on_where_a_namespace_lies_not_how_it_is_spelled(
    lake: Lake, tmp_path: Path
) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    lake.create_repository("outer", storage_namespace=f"file://{tmp_path}/real/outer")
    for namespace in (f"file://{tmp_path}/link/outer/sub", f"file://{tmp_path}/real//outer/"):
        with pytest.raises(AlreadyExists, match="used by repository 'outer'"):
            lake.create_repository("other", storage_namespace=namespace)


def test_a_delete_frees_its_claim_though_the_link_it_was_made_through_moved(
    lake: Lake, tmp_path: Path
) -> None:
    for name in ("first", "second"):
        (tmp_path / name).mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "first")
    lake.create_repository("outer", storage_namespace=f"file://{tmp_path}/link/outer")
    (tmp_path / "link").unlink()
    (tmp_path / "link").symlink_to(tmp_path / "second")
    lake.delete_repository("outer")
    assert list(lake.graveler.refs.namespace_claims()) == []
    lake.create_repository("inner", storage_namespace=f"file://{tmp_path}/first/outer/inner")


def test_a_deleted_repository_leaves_no_row_of_a_process_still_holding_it(
    race_kv: str, tmp_path: Path
) -> None:
    """Another process holding the repository commits after the delete listed its branches'
    tokens (a token the listing never saw) and writes to the new token, then writes again
    once the delete is done: every partition of the repository ends empty."""
    with Lake.connect(race_kv) as lake, Lake.connect(race_kv) as other:
        repo = lake.create_repository("sales", storage_namespace=f"file://{tmp_path}/sales")
        repo.branch("main").upload("a.txt", b"a")
        stale = other.repository("sales")
        listed = other.graveler.read_branch(stale.record, "main").staging_token
        with held_at("repository.before_drop", lambda: lake.delete_repository("sales")) as deleting:
            stale.branch("main").commit("sealed after the listing")
            stale.branch("main").upload("b.txt", b"b")
            unlisted = other.graveler.read_branch(stale.record, "main").staging_token
        assert deleting.raised is None
        with pytest.raises(NotFound):
            stale.branch("main").upload("c.txt", b"c")
        assert lake.wait_for_cleanup(30) and other.wait_for_cleanup(30)
        kv = lake.graveler.kv
        for partition in (repo.record.partition, listed.encode(), unlisted.encode()):
            assert list(kv.scan(partition)) == [], partition


def test_a_branch_created_through_a_deleted_repository_is_taken_back(
    race_kv: str, tmp_path: Path
) -> None:
    """The creation reads its source before the delete and inserts its branch after the
    delete fenced the branches it found: it finds the repository gone, removes its branch
    and is refused, so the dropped partition keeps no record."""
    with Lake.connect(race_kv) as lake, Lake.connect(race_kv) as other:
        repo = lake.create_repository("sales", storage_namespace=f"file://{tmp_path}/sales")
        stale = other.repository("sales")
        late = lambda: stale.create_branch("late", source="main")  # noqa: E731
        with held_at("branch.before_insert", late) as creating:
            lake.delete_repository("sales")
            assert lake.wait_for_cleanup(30)
        assert isinstance(creating.raised, NotFound)
        assert str(creating.raised) == "repository 'sales' not found: it was deleted"
        assert list(lake.graveler.kv.scan(repo.record.partition)) == []
