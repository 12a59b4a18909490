"""`branchwater log --where K=V --path P --depth N --limit N`: a search through history that
prints each commit as the walk finds it, in git log's layout."""

from __future__ import annotations

import json

from tests.helpers.cli import Bw, CliLake, assert_user_error, local_file, make_repo, ok


def test_log_searches_by_metadata_path_and_depth(bw: Bw, lake: CliLake) -> None:
    make_repo(bw, lake)
    for run in ("1", "2", "3"):
        ok(bw("upload", "sales", "main", f"tables/{run}", local_file(lake, run, run.encode())))
        ok(bw("commit", "sales", "main", "-m", f"run {run}", "--meta", f"airflow.run_id={run}"))

    text = ok(bw("log", "sales", "main", "--where", "airflow.run_id=2")).out
    assert text.startswith("commit ") and text.count("commit ") == 1 and "    run 2\n" in text
    both = ok(bw("log", "sales", "main", "--path", "tables/", "--limit", "2")).out
    blocks = both.split("\n\ncommit ")
    assert len(blocks) == 2 and both.endswith("    run 2\n") and "\n\n\n" not in both

    def ids(*args: str) -> list[str]:
        return [
            c["message"] for c in json.loads(ok(bw("--json", "log", "sales", "main", *args)).out)
        ]

    assert ids("--path", "tables/1") == ["run 1"]
    assert ids("--depth", "2") == ["run 3", "run 2"]
    assert ids("--depth", "2", "--where", "airflow.run_id=1") == []
    assert ok(bw("log", "sales", "main", "--depth", "1", "--path", "tables/1")).out == ""
    assert_user_error(bw("log", "sales", "main", "--depth", "0"), 1, "positive integer")
