"""A repository's to-delete list and the cleanup that finishes lists left behind
(`Graveler.collect_dropped_partitions`): a list whose record still names the partition (a
delete killed before its record went) is taken off and drops nothing; one whose record is
gone or re-created under a new unique id drops; a creation lists its partition first, so a
killed one is dropped too. Cleanups are run with no ages, at the worst moment of a delete
or a creation under way. On SQLite and on PostgreSQL."""

from __future__ import annotations

from pathlib import Path

import pytest

from branchwater.engine import Conflict, Lake, NotFound, failpoints
from branchwater.engine.api import Repository
from branchwater.engine.failpoints import FailpointHit
from branchwater.engine.graveler.graveler import Graveler
from tests.graveler.test_failpoint_steps import killed_at, paths, prepare

NAME = "failpoints"
"""The repository `prepare` makes and `killed_at` operates on."""


def _raise() -> None:
    raise FailpointHit("forced")


def shown(repo: Repository) -> dict[str, tuple[str, dict[str, bytes], list[str]]]:
    """Each branch's HEAD, what it shows (staged changes included) and its log."""
    return {
        b.name: (b.head().id, paths(repo, b.name), [c.id for c in repo.log(b.name)])
        for b in repo.branches()
    }


def rows(g: Graveler, partitions: list[bytes]) -> list[bytes]:
    """The partitions that still hold a row."""
    return [p for p in partitions if list(g.kv.scan(p))]


def test_a_delete_killed_before_its_record_goes_leaves_the_repository_whole(
    race_kv: str, tmp_path: Path
) -> None:
    """Killed between listing the partitions and removing the record: the repository is
    live and worked on; the cleanup takes the list off and drops nothing, and a later
    delete, killed before its drop, is finished by the cleanup."""
    prepare(race_kv, f"file://{tmp_path}/ns")
    killed_at(race_kv, "repository.before_remove", "delete")
    with Lake.connect(race_kv) as lake:
        g, repo = lake.graveler, lake.repository(NAME)
        [listed] = g.refs.partitions_to_delete()
        assert listed.partitions[0] == repo.record.partition
        repo.branch("main").commit("after the killed delete")
        assert lake.wait_for_cleanup(30), "the commit's own drop of its tokens would count"
        before = shown(repo)
        assert g.collect_dropped_partitions() == 0
        assert list(g.refs.partitions_to_delete()) == []
        assert shown(lake.repository(NAME)) == before
        assert sorted(before) == ["feature", "main", "target"]
    killed_at(race_kv, "repository.before_drop", "delete")
    with Lake.connect(race_kv) as lake:
        g = lake.graveler
        with pytest.raises(NotFound):
            lake.repository(NAME)
        [listed] = g.refs.partitions_to_delete()
        assert rows(g, listed.partitions)
        assert g.collect_dropped_partitions() == 1
        assert rows(g, listed.partitions) == []
        assert list(g.refs.partitions_to_delete()) == []


def test_a_cleanup_during_a_delete_drops_no_live_repository_and_loses_no_list(
    race_kv: str, tmp_path: Path
) -> None:
    """The cleanup runs between the delete's listing and its removal of the record, then
    the delete dies before its drop: the cleanup left the live repository whole, the
    delete (its list taken off) listed again before removing the record, and the next
    cleanup drops every partition."""
    with Lake.connect(race_kv) as lake, Lake.connect(race_kv) as other:
        repo = lake.create_repository("sales", storage_namespace=f"file://{tmp_path}/sales")
        repo.branch("main").upload("a", b"a")
        repo.branch("main").commit("a")
        repo.create_branch("dev", source="main").upload("b", b"b")
        assert lake.wait_for_cleanup(30)
        during: list[int] = []

        def cleanup_meanwhile() -> None:
            if not during:
                during.append(other.graveler.collect_dropped_partitions())
                assert paths(other.repository("sales"), "dev") == {"a": b"a", "b": b"b"}

        with (
            failpoints.armed("repository.before_remove", cleanup_meanwhile),
            failpoints.armed("repository.before_drop", _raise),
            pytest.raises(FailpointHit),
        ):
            lake.delete_repository("sales")
        assert during == [0]
        g = lake.graveler
        with pytest.raises(NotFound):
            lake.repository("sales")
        [listed] = g.refs.partitions_to_delete()
        assert listed.partitions[0] == repo.record.partition and rows(g, listed.partitions)
        assert g.collect_dropped_partitions() == 1
        assert rows(g, listed.partitions) == []
        assert list(g.refs.partitions_to_delete()) == []


def test_a_list_left_by_a_delete_is_finished_after_its_name_is_created_again(
    race_kv: str, tmp_path: Path
) -> None:
    """The record of the name now names another partition: the old list still drops, and
    the new repository stays whole."""
    with Lake.connect(race_kv) as lake:
        old = lake.create_repository("sales", storage_namespace=f"file://{tmp_path}/old")
        old.branch("main").upload("a", b"a")
        with failpoints.armed("repository.before_drop", _raise), pytest.raises(FailpointHit):
            lake.delete_repository("sales")
        new = lake.create_repository("sales", storage_namespace=f"file://{tmp_path}/new")
        new.branch("main").upload("b", b"b")
        g = lake.graveler
        [listed] = g.refs.partitions_to_delete()
        assert listed.partitions[0] == old.record.partition and rows(g, listed.partitions)
        assert g.collect_dropped_partitions() == 1
        assert rows(g, listed.partitions) == []
        assert list(g.refs.partitions_to_delete()) == []
        assert paths(lake.repository("sales"), "main") == {"b": b"b"}


def test_a_creation_killed_before_its_record_is_dropped_by_the_cleanup(
    race_kv: str, tmp_path: Path
) -> None:
    namespace = f"file://{tmp_path}/ns"
    killed_at(race_kv, "repository.before_insert", "create", namespace)
    with Lake.connect(race_kv) as lake:
        g = lake.graveler
        assert lake.repositories() == []
        [listed] = g.refs.partitions_to_delete()
        assert listed.partitions[0].startswith(f"{NAME}-".encode()) and rows(g, listed.partitions)
        assert g.collect_dropped_partitions() == 1
        assert rows(g, listed.partitions) == []
        assert list(g.refs.partitions_to_delete()) == []
        lake.create_repository(NAME, storage_namespace=namespace)
        assert list(g.refs.partitions_to_delete()) == []
        assert [b.name for b in lake.repository(NAME).branches()] == ["main"]


def test_a_cleanup_during_a_creation_fails_it_and_leaves_nothing(
    race_kv: str, tmp_path: Path
) -> None:
    """The cleanup takes the creation, its partition written and its record not yet, for
    abandoned: the creation is refused (`Conflict`), nothing of it is left, and creating
    it again works."""
    namespace = f"file://{tmp_path}/ns"
    with Lake.connect(race_kv) as lake, Lake.connect(race_kv) as other:
        listed: list[bytes] = []

        def cleanup_meanwhile() -> None:
            listed.extend(
                p for m in other.graveler.refs.partitions_to_delete() for p in m.partitions
            )
            assert other.graveler.collect_dropped_partitions() == 1

        with (
            failpoints.armed("repository.before_insert", cleanup_meanwhile),
            pytest.raises(Conflict, match="create it again"),
        ):
            lake.create_repository("sales", storage_namespace=namespace)
        assert lake.wait_for_cleanup(30)
        g = lake.graveler
        assert lake.repositories() == [] and len(listed) == 1
        assert rows(g, listed) == []
        assert list(g.refs.partitions_to_delete()) == []
        assert list(g.refs.namespace_claims()) == []
        lake.create_repository("sales", storage_namespace=namespace)
        assert [b.name for b in lake.repository("sales").branches()] == ["main"]
