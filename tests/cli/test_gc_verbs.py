"""`cp`, `gc prepare` and `gc prune-runs` from the command line."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest

from branchwater.engine import Lake
from branchwater.engine.gc.runs import files, statuses
from branchwater.engine.gc.runs.storage import Namespace
from tests.helpers.cli import Bw, CliLake, assert_user_error, local_file, make_repo, ok
from tests.helpers.gc import saved_run


def test_cp_copies_within_a_branch(bw: Bw, lake: CliLake) -> None:
    make_repo(bw, lake)
    ok(bw("upload", "sales", "main", "a.csv", local_file(lake, "a.csv", b"id\n1\n")))
    out = ok(bw("cp", "sales", "main", "a.csv", "copies/a.csv")).out
    assert "Copied a.csv to copies/a.csv on sales/main" in out
    assert ok(bw("cat", "sales", "main", "copies/a.csv")).out == "id\n1\n"
    copied = json.loads(ok(bw("cp", "sales", "main", "a.csv", "b.csv", "--json")).out)
    (source,) = json.loads(ok(bw("ls", "sales", "main", "a.csv", "--json")).out)
    assert copied["path"] == "b.csv"
    assert copied["address"] == source["address"]


def test_cp_of_a_missing_path_is_a_user_error(bw: Bw, lake: CliLake) -> None:
    make_repo(bw, lake)
    assert_user_error(bw("cp", "sales", "main", "nothing", "x"), 1, "'nothing'")


def test_gc_prepare_reports_the_run(bw: Bw, lake: CliLake) -> None:
    make_repo(bw, lake)
    ok(bw("upload", "sales", "main", "a.csv", local_file(lake, "a.csv", b"1")))
    ok(bw("cp", "sales", "main", "a.csv", "b.csv"))
    ok(bw("branch", "create", "sales", "dev", "--source", "main"))
    ok(bw("upload", "sales", "dev", "d.csv", local_file(lake, "d.csv", b"2")))
    run = json.loads(ok(bw("gc", "prepare", "sales", "--json")).out)
    assert (run["uncommitted"], run["branches"], run["copy_records"]) == (3, 2, 1)
    assert run["location"].startswith(f"{lake.namespace}/sales/_branchwater/retention/gc/")
    assert run["location"].endswith(run["run_id"])
    human = ok(bw("gc", "prepare", "sales", "--run", run["run_id"])).out
    assert run["run_id"] in human and "3 uncommitted entries on 2 branches" in human


def test_gc_prepare_refuses_a_malformed_run_id(bw: Bw, lake: CliLake) -> None:
    make_repo(bw, lake)
    assert_user_error(bw("gc", "prepare", "sales", "--run", "../x"), 1, "'../x'")


@pytest.mark.parametrize(
    ("option", "value", "fragment"),
    [
        ("--min-age", "abc", "'abc' is not a duration"),
        ("--lock-ttl", "5x", "'5x' is not a duration"),
        ("--max-share", "2", "a fraction between 0 and 1, got '2'"),
        ("--max-share", "nan", "a fraction between 0 and 1, got 'nan'"),
    ],
)
def test_gc_run_refuses_a_bad_setting_before_submitting_the_job(
    bw: Bw, lake: CliLake, option: str, value: str, fragment: str
) -> None:
    make_repo(bw, lake)
    assert_user_error(bw("gc", "run", "sales", option, value), 1, f"argument {option}", fragment)


def test_gc_prune_runs_keeps_the_newest_runs_whole(bw: Bw, lake: CliLake) -> None:
    make_repo(bw, lake)
    with Lake.connect(lake.kv) as opened:
        repository_id = opened.repository("sales").record.unique_id
    ns = Namespace.of(f"{lake.namespace}/sales")
    now = datetime.now(UTC)
    old, newer, newest = (
        saved_run(ns, now - timedelta(hours=hours), repository_id, statuses.SWEPT)
        for hours in (3, 2, 1)
    )

    out = ok(bw("gc", "prune-runs", "sales", "--keep-runs", "2")).out
    again = json.loads(ok(bw("gc", "prune-runs", "sales", "--keep-runs", "2", "--json")).out)

    assert "pruned 1 older runs' data, 0 abandoned run folders, 1 prepare outputs" in out
    assert files.read_summary(ns, old).pruned_at is not None
    assert all(files.read_summary(ns, r).pruned_at is None for r in (newer, newest))
    assert again == {"runs": [], "abandoned": [], "prepared": []}
    assert_user_error(bw("gc", "prune-runs", "sales", "--keep-runs", "0"), 1, "positive integer")
