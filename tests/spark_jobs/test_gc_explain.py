"""`explain`: why an object was or was not collected, from the saved runs and the refs."""

from __future__ import annotations

from datetime import timedelta

import pytest

from branchwater.engine import InvalidAddress
from branchwater.engine.gc.runs.explain import explain
from tests.helpers.gc import GCLake

pytestmark = [pytest.mark.spark, pytest.mark.slow]

NONE = timedelta(0)


def test_explain_names_the_run_the_commit_the_branch_or_the_age(local_gc: GCLake) -> None:
    repo = local_gc.repo
    committed = repo.branch("main").upload("tables/a", b"a").address
    repo.branch("main").commit("load a")
    staged = repo.create_branch("dev", source="main").upload("tables/b", b"b").address
    [deleted] = local_gc.put_garbage()
    swept = local_gc.run()
    [marked] = local_gc.put_garbage()
    mark = local_gc.run(dry_run=True)
    [young] = local_gc.put_garbage()

    answer = explain(repo, deleted, min_age=NONE)
    assert answer.verdict == f"deleted by GC run {swept.run_id}" and not answer.exists

    answer = explain(repo, marked, min_age=NONE)
    assert answer.verdict == f"marked by GC run {mark.run_id}, not deleted yet"
    assert "dry run" in answer.text() and f"--sweep {mark.run_id}" in answer.text()

    answer = explain(repo, committed, min_age=NONE)
    assert answer.verdict == "kept: committed" and answer.commits_holding == 1
    [commit] = answer.references
    assert commit.kind == "commit" and commit.path == "tables/a" and "load a" in answer.text()

    answer = explain(repo, staged, min_age=NONE)
    assert answer.verdict == "kept: uncommitted"
    assert "uncommitted on branch dev as tables/b (added)" in answer.text()
    assert f"run {mark.run_id} saw it uncommitted on branch dev (staged" in answer.text()

    answer = explain(repo, young, min_age=timedelta(hours=1))
    assert answer.verdict == "kept: too young" and answer.exists
    answer = explain(repo, young, min_age=NONE)
    assert answer.verdict == "unreferenced: the next run collects it"
    assert "did not consider it: modified after its cutoff" in answer.text()

    answer = explain(repo, marked, swept.run_id, min_age=NONE)
    assert answer.verdict == "unreferenced: the next run collects it"
    assert f"run {swept.run_id} did not consider it" in answer.text()


def test_explain_takes_absolute_addresses_inside_the_namespace_and_refuses_others(
    local_gc: GCLake,
) -> None:
    [garbage] = local_gc.put_garbage()
    inside = f"{local_gc.repo.storage_namespace}/{garbage}"

    assert explain(local_gc.repo, inside, min_age=NONE).address == garbage
    for foreign in ("s3://another/data/x", "file:///elsewhere/" + garbage):
        with pytest.raises(InvalidAddress, match="outside this repository's namespace"):
            explain(local_gc.repo, foreign, min_age=NONE)
    for malformed in ("tables/a", "_branchwater/ranges/x", "data/../x", ""):
        with pytest.raises(InvalidAddress, match="not a data address"):
            explain(local_gc.repo, malformed, min_age=NONE)


def test_explain_names_the_copy_or_link_that_made_a_reference(local_gc: GCLake) -> None:
    repo = local_gc.repo
    dev = repo.create_branch("dev", source="main")
    copied = dev.upload("tables/a", b"a").address
    dev.copy("tables/a", "tables/b")
    dev.delete("tables/a")
    physical = dev.get_physical_address()
    local_gc.objects.put(physical.address, b"by spark")
    dev.link_physical_address("tables/c", physical.token, size=8, checksum="c")

    local_gc.objects.delete([copied])
    answer = explain(repo, copied, min_age=NONE)
    assert answer.verdict == "no object at this address"
    assert "yet branch dev refers to it now: its data is gone" in answer.text()
    assert "referenced by a shallow copy on branch dev at " in answer.text()

    answer = explain(repo, physical.address, min_age=NONE)
    assert answer.verdict == "kept: uncommitted"
    assert "referenced by a link with a token valid until " in answer.text()
    assert answer.to_json()["made_by"] == [p.text() for p in repo.provenance(physical.address)]
