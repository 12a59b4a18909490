"""`revert`, `cherry-pick`, `branch reset --to` and `restore` from the command line."""

from __future__ import annotations

import json

from tests.helpers.cli import Bw, CliLake, assert_user_error, local_file, make_repo, ok


def write(bw: Bw, lake: CliLake, branch: str, path: str, data: bytes, message: str) -> str:
    """Upload one file and commit it; the commit's id."""
    ok(bw("upload", "sales", branch, path, local_file(lake, path.replace("/", "_"), data)))
    return json.loads(ok(bw("--json", "commit", "sales", branch, "-m", message)).out)["id"]


def test_revert_and_cherry_pick_commit_and_record_their_source(bw: Bw, lake: CliLake) -> None:
    make_repo(bw, lake)
    write(bw, lake, "main", "a", b"1", "one")
    bad = write(bw, lake, "main", "a", b"2", "two")
    out = ok(bw("revert", "sales", "main", bad)).out
    assert out.startswith("[main ") and f"reverted {bad}" in out
    assert ok(bw("cat", "sales", "main", "a")).out == "1"
    picked = json.loads(ok(bw("--json", "cherry-pick", "sales", "main", bad, "--meta", "k=v")).out)
    assert picked["metadata"] == {"branchwater.cherry_pick": bad, "k": "v"}
    assert picked["attempts"] == 1
    assert ok(bw("cat", "sales", "main", "a")).out == "2"


def test_pick_errors_are_one_line(bw: Bw, lake: CliLake) -> None:
    make_repo(bw, lake)
    write(bw, lake, "main", "a", b"1", "one")
    bad = write(bw, lake, "main", "a", b"2", "two")
    write(bw, lake, "main", "a", b"3", "three")
    assert_user_error(bw("revert", "sales", "main", bad), 2, "conflicts on 1 path(s): a")
    assert_user_error(bw("revert", "sales", "main", bad, "--parent", "2"), 1, "is not a merge")
    assert_user_error(bw("cherry-pick", "sales", "main", "main"), 1, "changes nothing")
    ok(bw("upload", "sales", "main", "b", local_file(lake, "b", b"b")))
    assert_user_error(bw("revert", "sales", "main", "main"), 1, "uncommitted changes")
    ok(bw("revert", "sales", "main", "main", "--allow-dirty"))
    assert ok(bw("uncommitted", "sales", "main")).out == "+ b\n"
    assert_user_error(bw("revert", "sales", "main", "nope"), 1, "'nope' not found")


def test_branch_reset_to_a_ref_and_restore(bw: Bw, lake: CliLake) -> None:
    make_repo(bw, lake)
    first = write(bw, lake, "main", "d/a", b"1", "one")
    write(bw, lake, "main", "d/b", b"2", "two")
    out = ok(bw("branch", "reset", "sales", "main", "--to", "main~1")).out
    assert out == f"Branch 'main' reset to 'main~1' ({first[:12]}): uncommitted changes dropped\n"
    assert ok(bw("ls", "sales", "main")).out.split()[-1] == "d/a"
    ok(bw("branch", "reset", "sales", "main", "--to", "main~1"))
    restored = json.loads(ok(bw("--json", "restore", "sales", "main", "--source", first, "d")).out)
    assert restored["staged"] == 1
    assert ok(bw("uncommitted", "sales", "main")).out == "+ d/a\n"
    assert_user_error(bw("restore", "sales", "main", "d", "--source", "nope"), 1, "not found")
    unknown = bw("restore", "sales", "main", "--source", first, "d", "--bogus")
    assert_user_error(unknown, 1, "unrecognized arguments: d --bogus")
    assert_user_error(bw("branch", "reset", "sales", "main", "--to", "nope"), 1, "not found")


def test_restore_refuses_an_empty_path_and_restores_every_path_with_all(
    bw: Bw, lake: CliLake
) -> None:
    """An empty PATH (an unset shell variable) would be the prefix of every path: refused,
    as git refuses an empty pathspec, with the branch's uncommitted changes kept."""
    make_repo(bw, lake)
    first = write(bw, lake, "main", "d/a", b"1", "one")
    write(bw, lake, "main", "e/b", b"2", "two")
    ok(bw("upload", "sales", "main", "d/a", local_file(lake, "mine", b"mine")))
    for paths, said in (([""], "--all"), (["d/a", ""], "--all"), ([], "PATHs, or --all")):
        restore = bw("restore", "sales", "main", *paths, "--source", first)
        assert_user_error(restore, 1, said)
        after_the_option = bw("restore", "sales", "main", "--source", first, *paths)
        assert_user_error(after_the_option, 1, said)
    both = bw("restore", "sales", "main", "d", "--all", "--source", first)
    assert_user_error(both, 1, "not both")
    assert ok(bw("uncommitted", "sales", "main")).out == "~ d/a\n"
    restored = json.loads(
        ok(bw("--json", "restore", "sales", "main", "--all", "--source", first)).out
    )
    assert restored["staged"] == 2
    assert ok(bw("uncommitted", "sales", "main")).out == "- e/b\n"
    assert ok(bw("cat", "sales", "main", "d/a")).out == "1"
