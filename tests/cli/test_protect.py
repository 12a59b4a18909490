"""`protect` and `checks` from the command line: rules set, listed, removed and logged;
checks recorded and listed; refusals and bad input as one line, never a traceback."""

from __future__ import annotations

import json

import pytest

from branchwater.engine.failpoints import FailpointHit, armed
from tests.helpers.cli import Bw, CliLake, assert_user_error, local_file, make_repo, ok


def commit_file(bw: Bw, lake: CliLake, branch: str, path: str, data: bytes) -> str:
    ok(bw("upload", "sales", branch, path, local_file(lake, path, data)))
    return json.loads(ok(bw("--json", "commit", "sales", branch, "-m", path)).out)["id"]


def test_protect_sets_lists_logs_and_removes_rules(bw: Bw, lake: CliLake) -> None:
    make_repo(bw, lake)
    out = ok(bw("protect", "sales", "main", "--no-direct-writes", "--require-check", "quality"))
    assert out.out == "Protected 'main': no_direct_writes, require quality\n"
    ok(bw("protect", "sales", "release/*", "--no-delete", "--no-reset", "--by", "ops"))
    listing = ok(bw("protect", "sales")).out.splitlines()
    assert listing[0].split() == ["PATTERN", "RULES"]
    assert listing[1].split(None, 1) == ["main", "no_direct_writes, require quality"]
    assert listing[2].split(None, 1) == ["release/*", "no_delete, no_reset"]
    rules = json.loads(ok(bw("--json", "protect", "sales")).out)
    assert rules[0] == {
        "pattern": "main",
        "no_direct_writes": True,
        "required_checks": ["quality"],
        "no_delete": False,
        "no_reset": False,
        "pending": False,
    }
    ok(bw("protect", "sales", "main", "--remove"))
    assert [r["pattern"] for r in json.loads(ok(bw("--json", "protect", "sales")).out)] == [
        "release/*"
    ]
    log = json.loads(ok(bw("--json", "protect", "sales", "--log")).out)
    assert [(c["action"], c["pattern"], c["by"]) for c in log] == [
        ("protect", "main", "tester"),
        ("protect", "release/*", "ops"),
        ("unprotect", "main", "tester"),
    ]
    text = ok(bw("protect", "sales", "--log")).out.splitlines()
    assert text[0].split() == ["VERSION", "WHEN", "BY", "ACTION", "PATTERN", "RULES"]
    assert len(text) == 4 and "unprotect" in text[3]


def test_a_protected_branch_refuses_writes_as_one_line(bw: Bw, lake: CliLake) -> None:
    make_repo(bw, lake)
    commit_file(bw, lake, "main", "a", b"1")
    ok(bw("protect", "sales", "main", "--no-direct-writes", "--no-reset"))
    assert_user_error(
        bw("upload", "sales", "main", "b", local_file(lake, "b", b"2")),
        1,
        "protected by rule no_direct_writes (pattern 'main')",
    )
    assert_user_error(bw("revert", "sales", "main", "main"), 1, "no_direct_writes")
    assert_user_error(bw("branch", "reset", "sales", "main", "--to", "main~1"), 1, "no_reset")


def test_checks_gate_a_merge_and_are_listed(bw: Bw, lake: CliLake, tmp_path) -> None:
    make_repo(bw, lake)
    ok(bw("branch", "create", "sales", "etl", "--source", "main"))
    source = commit_file(bw, lake, "etl", "a", b"1")
    ok(bw("protect", "sales", "main", "--no-direct-writes", "--require-check", "quality"))
    assert_user_error(
        bw("merge", "sales", "etl", "main"), 1, "requires checks quality", "missing quality"
    )
    details = tmp_path / "gx.json"
    details.write_text(json.dumps({"success_percent": 100.0}))
    out = ok(
        bw(
            "checks",
            "record",
            "sales",
            source,
            "quality",
            "--passed",
            "--details-file",
            str(details),
        )
    )
    assert out.out == f"Recorded 'quality' (passed) on {source[:12]} of 'sales'\n"
    ok(bw("merge", "sales", "etl", "main"))
    listing = ok(bw("checks", "sales", source)).out.splitlines()
    assert listing[0].split() == ["CHECK", "RESULT", "BY", "WHEN", "DETAILS"]
    assert listing[1].split()[:3] == ["quality", "passed", "tester"]
    assert listing[1].endswith('{"success_percent": 100.0}')
    recorded = json.loads(ok(bw("--json", "checks", "sales", "main")).out)
    assert [(c["name"], c["passed"], c["details"]) for c in recorded] == [
        ("quality", True, {"success_percent": 100.0})
    ]


def test_protect_and_checks_refuse_bad_input_as_one_line(bw: Bw, lake: CliLake) -> None:
    make_repo(bw, lake)
    assert_user_error(bw("protect", "sales", "main"), 1, "say what to protect")
    assert_user_error(bw("protect", "sales", "main", "--remove"), 1, "no protection rule")
    assert_user_error(bw("protect", "sales", "a b", "--no-delete"), 1, "matches no valid branch")
    assert_user_error(bw("protect", "sales", "--remove"), 1, "takes no PATTERN")
    assert_user_error(bw("protect", "sales", "main", "--log"), 1, "takes no PATTERN")
    assert_user_error(
        bw("protect", "sales", "main", "--require-check", "a b"), 1, "invalid check name"
    )
    assert_user_error(bw("checks", "sales"), 1, "usage: branchwater checks REPO COMMIT")
    assert_user_error(bw("checks", "record", "sales", "main", "q"), 1, "--passed or --failed")
    assert_user_error(
        bw("checks", "record", "sales", "main", "q", "--failed", "--details", "{"),
        1,
        "--details is not JSON",
    )
    assert_user_error(
        bw("checks", "record", "sales", "main", "q", "--failed", "--details", "[1]"),
        1,
        "must be a JSON object",
    )
    assert_user_error(bw("checks", "sales", "main", "--passed"), 1, "go with 'checks record'")
    ok(bw("checks", "record", "sales", "main", "q", "--failed"))
    assert_user_error(
        bw("checks", "record", "sales", "main", "q", "--passed"), 1, "cannot be rewritten"
    )
    assert_user_error(bw("checks", "sales", "nope"), 1, "not found")


def _killed() -> None:
    raise FailpointHit("killed")


def test_the_listing_shows_rules_whose_fence_is_pending(bw: Bw, lake: CliLake) -> None:
    """A protect (or unprotect) killed between its rule change and the end of its fence:
    the rule is listed, but branches that existed before may not enforce it yet (or still
    enforce a removed one). Any later rule change finishes it."""
    make_repo(bw, lake)
    ok(bw("protect", "sales", "gone", "--no-delete"))
    with armed("protect.before_fence", _killed), pytest.raises(FailpointHit):
        bw("protect", "sales", "main", "--no-direct-writes")
    listing = ok(bw("protect", "sales")).out.splitlines()
    assert listing[2].split(None, 1) == [
        "main",
        "no_direct_writes (pending: not yet enforced on existing branches: run protect again)",
    ]
    rules = json.loads(ok(bw("--json", "protect", "sales")).out)
    assert [(r["pattern"], r["pending"]) for r in rules] == [("gone", False), ("main", True)]
    with armed("protect.before_fence", _killed), pytest.raises(FailpointHit):
        bw("protect", "sales", "gone", "--remove")
    listing = ok(bw("protect", "sales")).out.splitlines()
    assert [line.split(None, 1) for line in listing[1:]] == [
        [
            "gone",
            "- (removed, pending: still enforced on some existing branches: run protect "
            "--remove again)",
        ],
        ["main", "no_direct_writes"],
    ]
    rules = json.loads(ok(bw("--json", "protect", "sales")).out)
    assert rules[0] == {"pattern": "gone", "removed": True, "pending": True}
    ok(bw("protect", "sales", "release/*", "--no-reset"))
    listing = ok(bw("protect", "sales")).out.splitlines()
    assert [line.split(None, 1) for line in listing[1:]] == [
        ["main", "no_direct_writes"],
        ["release/*", "no_reset"],
    ]
    assert_user_error(
        bw("upload", "sales", "main", "b", local_file(lake, "b", b"2")), 1, "no_direct_writes"
    )
