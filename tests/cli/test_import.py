"""`branchwater import REPO BRANCH SOURCE_URI --prefix P [-m MSG]`: one commit of entries
pointing at the objects, `cat` reads them from the source, a re-run commits nothing, and
bad sources are one-line user errors."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers.cli import Bw, CliLake, assert_user_error, make_repo, ok


def source_dir(lake: CliLake) -> str:
    root = lake.root / "existing"
    (root / "dir").mkdir(parents=True)
    (root / "a.csv").write_bytes(b"a,b\n")
    (root / "dir" / "b.csv").write_bytes(b"c,d\n1,2\n")
    return root.as_uri() + "/"


def test_import_commits_and_cat_reads_the_source(bw: Bw, lake: CliLake) -> None:
    make_repo(bw, lake)
    source = source_dir(lake)

    done = ok(bw("import", "sales", "main", source, "--prefix", "raw/", "-m", "bring in"))

    assert "imported 2 object(s)" in done.out
    assert ok(bw("cat", "sales", "main", "raw/dir/b.csv")).out == "c,d\n1,2\n"
    log = json.loads(ok(bw("log", "sales", "main", "--json")).out)
    assert log[0]["message"] == "bring in"
    assert log[0]["metadata"]["branchwater.import.source"] == source
    again = json.loads(ok(bw("import", "sales", "main", source, "--prefix", "raw/", "--json")).out)
    assert (again["count"], again["bytes"], again["commit"]) == (2, 12, None)
    assert again["folder_markers"] == 0


def test_bad_sources_are_user_errors(bw: Bw, lake: CliLake, tmp_path: Path) -> None:
    make_repo(bw, lake)
    namespace = f"{lake.namespace}/sales"
    assert_user_error(bw("import", "sales", "main", namespace), 1, "overlaps the storage")
    assert_user_error(bw("import", "sales", "main", "ftp://x/y"), 1, "must be an s3://")
    missing = (tmp_path / "missing").as_uri()
    assert_user_error(bw("import", "sales", "main", missing), 1, "not a directory")
    (tmp_path / "empty").mkdir()
    empty = (tmp_path / "empty").as_uri()
    assert_user_error(bw("import", "sales", "main", empty), 1, "no objects to import")
    assert_user_error(bw("import", "sales", "nope", source_dir(lake)), 1, "nope")
