"""Name and path rules against text of every code point, and names shaped like commit ids."""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from branchwater.engine import InvalidArgument, InvalidName
from branchwater.engine.graveler.names import (
    check_path,
    check_ref_name,
    check_repository_name,
    is_hex_id,
    name_key,
)
from tests.helpers.hostile import any_text, not_text, unencodable_texts

EXAMPLES = settings(max_examples=150, deadline=None)
REPOSITORY_NAMES = st.from_regex(r"[a-z0-9][a-z0-9-]{1,61}[a-z0-9]", fullmatch=True)
LINE_ENDS = st.sampled_from(["\n", "\r", "\r\n", "\x0b", "\x0c", "\x85", "\u2028"])


@EXAMPLES
@given(name=any_text() | not_text())
def test_a_repository_name_is_checked_whole(name: object) -> None:
    try:
        check_repository_name(name)
    except InvalidName as refused:
        assert repr(name) in str(refused)
    else:
        assert isinstance(name, str) and re.fullmatch(r"[a-z0-9-]{3,63}", name)


@EXAMPLES
@given(name=REPOSITORY_NAMES, end=LINE_ENDS)
def test_a_repository_name_with_a_line_end_is_refused(name: str, end: str) -> None:
    assert check_repository_name(name) == name
    with pytest.raises(InvalidName, match="invalid repository name"):
        check_repository_name(name + end)


@EXAMPLES
@given(name=any_text() | not_text())
def test_a_ref_name_of_any_code_point_is_a_key_or_invalid_name(name: object) -> None:
    try:
        check_ref_name(name, "tag")
    except InvalidName as refused:
        assert str(refused).startswith(f"invalid tag name {name!r}: ")
    else:
        assert isinstance(name, str) and name_key(name, "tag name") == name.encode()
        assert "\n" not in name and not is_hex_id(name)


@EXAMPLES
@given(name=unencodable_texts() | not_text())
def test_a_name_that_cannot_be_a_key_is_invalid_name_on_lookup(name: object) -> None:
    with pytest.raises(InvalidName, match=re.escape(f"invalid branch name {name!r}: it must")):
        name_key(name, "branch name")
    with pytest.raises(InvalidName, match=re.escape(repr(name))):
        check_ref_name(name)


@EXAMPLES
@given(commit_id=st.from_regex(r"[0-9a-f]{64}", fullmatch=True))
def test_a_ref_name_shaped_like_a_full_commit_id_is_refused(commit_id: str) -> None:
    assert is_hex_id(commit_id)
    for kind in ("branch", "tag"):
        with pytest.raises(InvalidName, match=f"invalid {kind} name .*full commit id"):
            check_ref_name(commit_id, kind)
    for near in (commit_id[:-1], commit_id + "0", f"{commit_id}~1", f"{commit_id}\n"):
        assert not is_hex_id(near)


@EXAMPLES
@given(path=any_text() | not_text(), empty=st.booleans())
def test_a_path_of_any_code_point_is_a_key_or_invalid_argument(path: object, empty: bool) -> None:
    try:
        check_path(path, "prefix", empty=empty)
    except InvalidArgument as refused:
        assert str(refused).startswith(f"invalid prefix {path!r}: it must")
        assert not isinstance(refused, InvalidName)
    else:
        assert isinstance(path, str) and "\x00" not in path and (path or empty)
        path.encode()


@pytest.mark.parametrize(
    ("name", "shown"),
    [
        ("rtl\u202eniam", "U+202E RIGHT-TO-LEFT OVERRIDE"),
        ("a\u200bb", "U+200B ZERO WIDTH SPACE"),
        ("csi\u009b31m", "U+009B"),
        ("next\u0085line", "U+0085"),
        ("line\u2028break", "U+2028 LINE SEPARATOR"),
        ("no\u00a0break", "U+00A0 NO-BREAK SPACE"),
    ],
)
def test_a_ref_name_with_a_character_that_does_not_show_is_refused(name: str, shown: str) -> None:
    """Such a name lists as another (`rtl‮niam` shows as `rtlmain`), or breaks a listing's
    lines."""
    with pytest.raises(InvalidName, match=re.escape(shown)):
        check_ref_name(name)


def test_a_ref_name_is_taken_only_in_its_composed_form() -> None:
    """Two names that look alike (é composed, and e with a combining accent) are one name."""
    assert check_ref_name("caf\u00e9-ñ") == "caf\u00e9-ñ"
    with pytest.raises(InvalidName, match="NFC"):
        check_ref_name("cafe\u0301")
