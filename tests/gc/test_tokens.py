"""Link tokens against hostile spellings: one token, one spelling, one use."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from branchwater.engine import InvalidToken, TokenAlreadyUsed
from branchwater.engine.api import Repository
from tests.helpers.gc import staged_paths, upload_to
from tests.helpers.hostile import stored

ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_"
HYPOTHESIS = settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


SKIPPED = st.characters(max_codepoint=127, exclude_characters=ALPHABET + "=+/")
"""ASCII a lenient base64 decoder skips."""
RESPELLINGS = st.tuples(
    st.sampled_from(["spare-bits", "padding", "skipped", "standard"]),
    st.integers(1, 3),
    st.floats(0, 1),
    st.text(SKIPPED, min_size=1, max_size=3),
)
"""How to respell a base64 part, drawn apart from any token so each example draws alike."""


def respell(part: str, how: tuple[str, int, float, str]) -> str:
    """Another spelling of a base64 part that a lenient decoder reads as the same bytes."""
    kind, number, where, junk = how
    spare_bits = 6 * len(part) % 8
    if kind == "spare-bits" and spare_bits:
        return part[:-1] + ALPHABET[ALPHABET.index(part[-1]) ^ number % 2**spare_bits or 1]
    if kind == "skipped":
        at = round(where * len(part))
        return part[:at] + junk + part[at:]
    if kind == "standard" and ("-" in part or "_" in part):
        return part.replace("-", "+").replace("_", "/")
    return part + "=" * number


respellings = st.tuples(st.booleans(), RESPELLINGS)


def respelled_token(token: str, choice: tuple[bool, tuple[str, int, float, str]]) -> str:
    version, body, signature = token.split(".")
    in_signature, how = choice
    if in_signature:
        return f"{version}.{body}.{respell(signature, how)}"
    return f"{version}.{respell(body, how)}.{signature}"


def test_respellings_decode_to_the_same_bytes_leniently(repo: Repository) -> None:
    """The strategy is what the issue found: spellings Python's decoder takes as the token."""
    signature = repo.branch("main").get_physical_address().token.split(".")[2]
    lenient = base64.urlsafe_b64decode(signature + "==")

    @given(RESPELLINGS)
    def same_bytes(how: tuple[str, int, float, str]) -> None:
        other = respell(signature, how)
        assert other != signature
        assert base64.urlsafe_b64decode(other + "==") == lenient

    same_bytes()


def test_a_token_whose_body_nests_deeper_than_the_parser_goes_is_malformed(
    repo: Repository,
) -> None:
    """The body is parsed before the signature is checked: a forged one must not raise
    `RecursionError` from the parser."""
    main = repo.branch("main")
    version = main.get_physical_address().token.split(".")[0]
    body = base64.urlsafe_b64encode(b"[" * 100_000 + b"]" * 100_000).decode().rstrip("=")
    with pytest.raises(InvalidToken, match="malformed link token"):
        main.link_physical_address("p", f"{version}.{body}.AAAA", size=1, checksum="c")


@HYPOTHESIS
@given(choice=respellings)
def test_a_respelled_token_is_refused_before_and_after_use_and_never_spent(
    repo: Repository, tmp_path: Path, choice: tuple[bool, tuple[str, int, float, str]]
) -> None:
    main = repo.branch("main")
    physical = main.get_physical_address()
    upload_to(main, physical.address, b"x")
    path = f"linked/{physical.address}"
    respelled = respelled_token(physical.token, choice)
    namespace = tmp_path / "sales"
    before = stored(repo.lake.graveler.kv, namespace)
    with pytest.raises(InvalidToken, match="malformed link token") as refused:
        main.link_physical_address(path, respelled, size=1, checksum="c")
    assert not isinstance(refused.value, TokenAlreadyUsed)
    assert stored(repo.lake.graveler.kv, namespace) == before

    main.link_physical_address(path, physical.token, size=1, checksum="c")
    after_use = stored(repo.lake.graveler.kv, namespace)
    with pytest.raises(InvalidToken):
        main.link_physical_address(path + "-again", respelled, size=1, checksum="c")
    with pytest.raises(TokenAlreadyUsed):
        main.link_physical_address(path + "-again", physical.token, size=1, checksum="c")
    assert stored(repo.lake.graveler.kv, namespace) == after_use
    assert path + "-again" not in staged_paths(main)


@HYPOTHESIS
@given(token=st.text() | st.builds(".".join, st.lists(st.text(), min_size=3, max_size=3)))
def test_any_other_text_is_refused_as_a_token_without_writing(repo: Repository, token: str) -> None:
    main = repo.branch("main")
    before = stored(repo.lake.graveler.kv)
    with pytest.raises(InvalidToken, match="link token"):
        main.link_physical_address("linked", token, size=1, checksum="c")
    assert stored(repo.lake.graveler.kv) == before
