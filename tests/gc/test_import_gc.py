"""GC and imported objects (the model): objects an import points at lie outside the namespace,
so prepare leaves their addresses out, no run counts them as candidates, and after every
sweep they are still there: while committed, while only staged (restored from a commit), and
once every entry naming them is deleted and committed away."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest

from branchwater.engine.api import Repository
from branchwater.engine.graveler import imports
from tests.gc_model import assert_references_intact, gc_candidates, sweep
from tests.helpers.failpoints import held_at
from tests.helpers.gc import put_garbage, run_addresses


def source_files(root: Path, count: int) -> dict[str, bytes]:
    root.mkdir()
    files = {f"part-{i}.csv": f"row {i}\n".encode() for i in range(count)}
    for name, data in files.items():
        (root / name).write_bytes(data)
    return files


def test_no_run_ever_deletes_an_imported_object(repo: Repository, tmp_path: Path) -> None:
    files = source_files(tmp_path / "existing", 5)
    main = repo.branch("main")
    main.import_objects((tmp_path / "existing").as_uri(), prefix="raw/")
    main.upload("own.txt", b"own")
    main.commit("own")
    garbage = set(put_garbage(repo.lake, repo, 2))
    time.sleep(0.01)  # run ids hold milliseconds: the garbage is then older than the run

    def run_and_sweep() -> set[str]:
        run = repo.prepare_uncommitted_for_gc()
        assert not [a for a in run_addresses(repo, run) if "://" in a]
        assert not [a for a in gc_candidates(repo, run, timedelta(0)) if "://" in a]
        return sweep(repo, run)

    assert run_and_sweep() == garbage
    assert_references_intact(repo)

    dev = repo.create_branch("dev")
    dev.restore(["raw/"], source="main")
    dev.delete("raw/part-0.csv")
    dev.copy("raw/part-1.csv", "copied.csv")
    assert run_and_sweep() == set()
    assert_references_intact(repo)

    for name in files:
        main.delete(f"raw/{name}")
    main.commit("imported entries deleted")
    repo.delete_branch("dev")
    assert run_and_sweep() == set()
    assert_references_intact(repo)
    assert {p.name: p.read_bytes() for p in (tmp_path / "existing").iterdir()} == files


def test_a_run_between_an_imports_ranges_and_its_commit_deletes_nothing_it_needs(
    repo: Repository, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = source_files(tmp_path / "existing", 6)
    monkeypatch.setattr(imports, "BATCH", 2)
    main = repo.branch("main")
    importing = lambda: main.import_objects((tmp_path / "existing").as_uri())  # noqa: E731
    with held_at("import.after_record", importing) as held:
        run = repo.prepare_uncommitted_for_gc()
        swept = sweep(repo, run)

    assert swept == set() and held.result.count == len(files)
    assert_references_intact(repo)
    assert {p.name: p.read_bytes() for p in (tmp_path / "existing").iterdir()} == files
