"""`upload` streams a file or stdin; `cat` streams, holding back only its first bytes: a small
damaged object prints nothing, a large one fails after its bytes."""

from __future__ import annotations

import hashlib
import io
import json
import sys
from pathlib import Path

import pytest

from branchwater.engine.cli import objects
from tests.helpers.cli import Bw, CliLake, assert_user_error, local_file, make_repo, ok


def test_upload_streams_stdin_and_cat_gives_it_back(
    bw: Bw, lake: CliLake, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_repo(bw, lake)
    data = b"id,amount\n" + b"".join(b"%d,%d\n" % (i, i * 3) for i in range(200_000))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data)))
    entry = json.loads(ok(bw("--json", "upload", "sales", "main", "orders.csv", "-")).out)
    assert entry["size"] == len(data)
    assert entry["checksum"] == hashlib.sha256(data).hexdigest()
    monkeypatch.setattr(objects, "CAT_HOLD_BACK", 1000)
    assert ok(bw("cat", "sales", "main", "orders.csv")).out == data.decode()


def test_upload_of_an_unreadable_file_is_a_user_error(bw: Bw, lake: CliLake) -> None:
    make_repo(bw, lake)
    missing = str(Path(lake.root) / "missing.csv")
    assert_user_error(bw("upload", "sales", "main", "a.csv", missing), 1, "missing.csv")


def test_cat_of_a_large_damaged_object_fails_after_its_bytes(
    bw: Bw, lake: CliLake, monkeypatch: pytest.MonkeyPatch
) -> None:
    make_repo(bw, lake)
    data = b"0123456789" * 10_000
    source = local_file(lake, "digits.txt", data)
    entry = json.loads(ok(bw("--json", "upload", "sales", "main", "digits.txt", source)).out)
    stored = Path(f"{lake.namespace.removeprefix('file://')}/sales/{entry['address']}")
    stored.write_bytes(data[:-1] + b"!")
    monkeypatch.setattr(objects, "CAT_HOLD_BACK", 100)
    result = bw("cat", "sales", "main", "digits.txt")
    assert result.code == 1
    assert result.out.startswith(data[:100].decode())
    assert "digits.txt" in result.err and entry["address"] in result.err
    assert "rewritten" in result.err
