"""The S3 store's one-match key check (`_plain`), which a bulk delete takes for each key
before the full checks: it must accept exactly the keys that `check_object_key` accepts and
obstore can address, so no key skips a refusal and none goes to the wrong client."""

from __future__ import annotations

import pytest

from branchwater.engine.errors import InvalidArgument
from branchwater.engine.objects.s3 import _plain
from branchwater.engine.objects.s3_fallback import addressable
from branchwater.engine.objects.store import check_object_key

KEYS = [
    "a",
    "a/b",
    "data/2026-11-27T03/0f1e2d3c4b5a69788796a5b4c3d2e1f0",
    "..a",
    "a..",
    "...",
    "a/.../b",
    ".hidden",
    "d/.tmp",
    "ä/ü/ß",
    "with space/ trail ",
    "a//b",
    "a/./b",
    "a/../b",
    "./a",
    "../a",
    "a/.",
    "a/..",
    ".",
    "..",
    "/a",
    "a/",
    "",
    "t/tab\tnew\nline",
    "x\x7f",
    "x\x00y",
    "end\n",
]


def _accepted(key: str) -> bool:
    try:
        return addressable(check_object_key(key))
    except InvalidArgument:
        return False


@pytest.mark.parametrize("key", KEYS)
def test_the_one_match_agrees_with_the_full_checks(key: str) -> None:
    assert _plain(key) is _accepted(key)


def test_a_key_that_is_no_string_is_not_plain() -> None:
    assert _plain(b"a/b") is False
    assert _plain(None) is False
