"""`branchwater merge --preview` and `branchwater publish`: a merge built without moving the
destination, landed only while the destination has not moved (else exit 2, nothing moved)."""

from __future__ import annotations

import json
import shlex

from tests.helpers.cli import Bw, CliLake, assert_user_error, local_file, make_repo, ok


def head(bw: Bw, ref: str) -> str:
    return json.loads(ok(bw("--json", "log", "sales", ref, "--limit", "1")).out)[0]["id"]


def test_a_preview_is_published_only_onto_the_head_it_was_built_on(bw: Bw, lake: CliLake) -> None:
    make_repo(bw, lake)
    ok(bw("branch", "create", "sales", "etl", "--source", "main"))
    ok(bw("upload", "sales", "etl", "a.csv", local_file(lake, "a", b"a")))
    ok(bw("commit", "sales", "etl", "-m", "etl"))
    before = head(bw, "main")

    text = ok(bw("merge", "sales", "etl", "main", "--preview")).out
    assert "(main not moved)" in text and "branchwater publish sales" in text
    stale = json.loads(ok(bw("--json", "merge", "sales", "etl", "main", "--preview")).out)
    assert head(bw, "main") == before and stale["parents"][0] == before

    ok(bw("upload", "sales", "main", "b.csv", local_file(lake, "b", b"b")))
    ok(bw("commit", "sales", "main", "-m", "meanwhile"))
    moved = head(bw, "main")
    refused = bw("publish", "sales", stale["id"], "main")
    assert_user_error(refused, 2, "preview again", "(from the CLI: merge --preview again with")
    assert head(bw, "main") == moved

    hint = shlex.split(refused.err.rpartition("--hint ")[2].removesuffix(")\n"))[0]
    again = ("--json", "merge", "sales", "etl", "main", "--preview", "--hint", hint)
    fresh = json.loads(ok(bw(*again)).out)
    assert "published the merge preview" in ok(bw("publish", "sales", fresh["id"], "main")).out
    assert head(bw, "main") == fresh["id"]
    assert_user_error(bw("publish", "sales", moved, "main"), 1, "is not a merge preview")
