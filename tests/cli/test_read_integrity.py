"""`cat` of an object damaged in storage: exit 1 and one line naming path and address, or the
bytes as stored with `--no-verify`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.cli import Bw, CliLake, assert_user_error, local_file, make_repo, ok


@pytest.mark.parametrize("committed", [False, True])
def test_cat_refuses_an_object_rewritten_in_storage(bw: Bw, lake: CliLake, committed: bool) -> None:
    make_repo(bw, lake)
    source = local_file(lake, "orders.csv", b"id,amount\n1,10\n")
    entry = json.loads(ok(bw("--json", "upload", "sales", "main", "orders.csv", source)).out)
    if committed:
        ok(bw("commit", "sales", "main", "-m", "orders"))
    stored = Path(f"{lake.namespace.removeprefix('file://')}/sales/{entry['address']}")
    stored.write_bytes(b"id,amount\n1,99\n")

    result = bw("cat", "sales", "main", "orders.csv")
    assert_user_error(result, 1, "orders.csv", entry["address"], "rewritten")
    assert ok(bw("cat", "sales", "main", "orders.csv", "--no-verify")).out == "id,amount\n1,99\n"
