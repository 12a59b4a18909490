"""`branchwater gc rules get|set`: the rules as JSON in and out, user errors in one line."""

from __future__ import annotations

import json

import pytest

from tests.helpers.cli import Bw, CliLake, assert_user_error, local_file, make_repo, ok

RULES = {"default_retention_days": 30, "branches": [{"branch_id": "main", "retention_days": 90}]}


def test_get_before_any_rules(bw: Bw, lake: CliLake) -> None:
    make_repo(bw, lake)
    assert "no GC rules" in ok(bw("gc", "rules", "get", "sales")).out
    assert json.loads(ok(bw("gc", "rules", "get", "sales", "--json")).out) is None


def test_set_from_a_file_then_get(bw: Bw, lake: CliLake) -> None:
    make_repo(bw, lake)
    path = local_file(lake, "rules.json", json.dumps(RULES).encode())
    ok(bw("gc", "rules", "set", "sales", "--file", path))
    assert json.loads(ok(bw("gc", "rules", "get", "sales", "--json")).out) == RULES


def test_set_from_stdin(bw: Bw, lake: CliLake, monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    make_repo(bw, lake)
    monkeypatch.setattr("sys.stdin", io.StringIO('{"default_retention_days": 3}'))
    ok(bw("gc", "rules", "set", "sales"))
    assert json.loads(ok(bw("gc", "rules", "get", "sales", "--json")).out) == {
        "default_retention_days": 3,
        "branches": [],
    }


@pytest.mark.parametrize(
    ("document", "fragment"),
    [
        ('{"default_retention_days": -1}', "between 0 and"),
        ('{"default_retention_days": 1, "oops": 1}', "unknown key(s) oops"),
        ("[", "not valid JSON"),
    ],
)
def test_bad_rules_are_one_line_and_store_nothing(
    bw: Bw, lake: CliLake, document: str, fragment: str
) -> None:
    make_repo(bw, lake)
    ok(
        bw(
            "gc",
            "rules",
            "set",
            "sales",
            "--file",
            local_file(lake, "good.json", b'{"default_retention_days": 5}'),
        )
    )
    path = local_file(lake, "bad.json", document.encode())
    assert_user_error(bw("gc", "rules", "set", "sales", "--file", path), 1, fragment)
    assert (
        json.loads(ok(bw("gc", "rules", "get", "sales", "--json")).out)["default_retention_days"]
        == 5
    )


def test_a_missing_file_is_a_user_error(bw: Bw, lake: CliLake) -> None:
    make_repo(bw, lake)
    assert_user_error(
        bw("gc", "rules", "set", "sales", "--file", str(lake.root / "nope.json")), 1, "cannot read"
    )


def test_an_unknown_repository_is_a_user_error(bw: Bw, lake: CliLake) -> None:
    make_repo(bw, lake)
    assert_user_error(bw("gc", "rules", "get", "nosuch"), 1, "nosuch")


def test_gc_run_passes_only_and_keep_runs_to_the_job() -> None:
    import argparse

    from branchwater.engine.cli.gc import submit_command

    args = argparse.Namespace(
        master="local[1]",
        repo="sales",
        conf=[],
        mode="clean",
        dry_run=False,
        sweep=None,
        min_age=None,
        max_share=None,
        lock_ttl=None,
        only="committed",
        keep_runs=3,
    )
    command = submit_command(args)
    assert command[command.index("--only") + 1] == "committed"
    assert command[command.index("--keep-runs") + 1] == "3"
