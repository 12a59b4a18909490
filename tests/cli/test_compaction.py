"""`branchwater compact` and `branchwater compaction-status`."""

from __future__ import annotations

import json

from tests.helpers.cli import Bw, CliLake, assert_user_error, local_file, make_repo, ok


def staged_tombstones(bw: Bw, lake: CliLake, count: int) -> None:
    make_repo(bw, lake)
    data = local_file(lake, "f", b"x")
    for i in range(count):
        ok(bw("upload", "sales", "main", f"d/{i}", data))
    ok(bw("commit", "sales", "main", "-m", "tree"))
    for i in range(count - 1):
        ok(bw("rm", "sales", "main", f"d/{i}"))


def test_status_table_compact_and_status_again(bw: Bw, lake: CliLake) -> None:
    staged_tombstones(bw, lake, 4)
    ok(bw("branch", "create", "sales", "dev", "--source", "main"))
    table = ok(bw("compaction-status", "sales", "--max-tombstones", "3")).out.splitlines()
    assert table[0].split()[:4] == ["BRANCH", "STAGED", "TOMBSTONES", "SEALED"]
    assert table[1].split()[:5] == ["dev", "0", "0", "0", "no"] and table[1].endswith("ok")
    assert table[2].split()[:5] == ["main", "0", "3", "0", "no"]
    assert "due: 3 staged tombstones >= 3" in table[2]

    assert "not-due" in ok(bw("compact", "sales", "main", "--if-needed")).out
    out = ok(bw("compact", "sales", "main", "--if-needed", "--max-tombstones", "3")).out
    assert out.startswith("Compacted 'main': 0 entries and 3 tombstones from 1 sealed token(s)")
    assert ok(bw("ls", "sales", "main")).out.split()[-1] == "d/3"
    assert ok(bw("uncommitted", "sales", "main")).out == "- d/0\n- d/1\n- d/2\n"

    line = ok(bw("compaction-status", "sales", "main")).out.splitlines()[1]
    assert line.split()[:5] == ["main", "0", "0", "0", "yes"] and "s ago" in line
    again = ok(bw("compact", "sales", "main", "--if-needed", "--max-tombstones", "1"))
    assert "not-due" in again.out
    assert "nothing-staged" in ok(bw("compact", "sales", "main")).out


def test_json_forms(bw: Bw, lake: CliLake) -> None:
    staged_tombstones(bw, lake, 3)
    [status] = json.loads(ok(bw("--json", "compaction-status", "sales", "main")).out)
    assert status["branch"] == "main" and status["staged_tombstones"] == 2
    assert status["due"] is False and status["complete"] is True
    result = json.loads(ok(bw("compact", "sales", "main", "--json")).out)
    assert result["compacted"] is True and result["outcome"] == "compacted"
    assert result["tombstones_removed"] == 2 and result["metarange_id"]
    assert "metrics" not in result


def test_metrics_in_the_exposition_format(bw: Bw, lake: CliLake) -> None:
    staged_tombstones(bw, lake, 3)
    out = ok(bw("compact", "sales", "main", "--metrics")).out
    assert "# TYPE branchwater_compaction_duration_seconds histogram" in out
    assert 'branchwater_compaction_tombstones_total{repository="sales"} 2.0' in out
    assert 'branchwater_sealed_tokens{branch="main",repository="sales"} 0.0' in out
    doc = json.loads(ok(bw("compact", "sales", "main", "--metrics", "--json")).out)
    assert doc["outcome"] == "nothing-staged"
    assert 'outcome="nothing-staged"' in doc["metrics"]


def test_bad_input(bw: Bw, lake: CliLake) -> None:
    make_repo(bw, lake)
    assert_user_error(bw("compact", "nope", "main"), 1, "repository 'nope'")
    assert_user_error(bw("compact", "sales", "nope"), 1, "branch 'nope'")
    assert_user_error(bw("compaction-status", "sales", "nope"), 1, "branch 'nope'")
    assert_user_error(bw("compact", "sales", "main", "--max-tombstones", "-3"), 1, "positive")
    assert_user_error(
        bw("compaction-status", "sales", "--max-tombstones", "500", "--scan-budget", "10"),
        1,
        "scan_budget",
    )
    assert_user_error(bw("compact", "sales", "main", "--guard-seconds", "-1"), 1, "guard")
