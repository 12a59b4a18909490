"""Passwords never reach a message: URLs with unencoded reserved characters in the user and
password, for every scheme (hypothesis), and malformed URLs raise typed errors."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from branchwater.engine.errors import BranchwaterError, ConfigurationError
from branchwater.engine.kv import open_store
from branchwater.engine.urls import redact_url, scrub, url_secrets
from tests.helpers.hostile import Credentials, assert_no_secret, credentials, error_chain
from tests.helpers.servers import PG_USER, free_port, unique_name

SCHEMES = ["postgresql", "postgres", "dynamodb", "sqlite", "redis", "s3", "x-unknown"]
AFTER_HOST = ["", "/lake", "/lake?table=t&x=a@b", "#frag", "?endpoint_url=http://h:1"]


@settings(max_examples=200, deadline=None)
@given(
    scheme=st.sampled_from(SCHEMES),
    secret=credentials(),
    host=st.sampled_from(["127.0.0.1", "[::1]", "db.example:5432", "", "[::1"]),
    rest=st.sampled_from(AFTER_HOST),
)
def test_redaction_hides_every_piece_of_the_password(
    scheme: str, secret: Credentials, host: str, rest: str
) -> None:
    url = f"{scheme}://{secret.user}:{secret.password}@{host}{rest}"
    assert_no_secret(redact_url(url), secret)
    assert_no_secret(redact_url(url.replace("://", ":", 1)), secret)


def test_redaction_keeps_what_is_not_secret() -> None:
    assert redact_url("postgresql://bob:p/w#x?y@db:5432/lake?table=t") == (
        "postgresql://bob:***@db:5432/lake?table=t"
    )
    assert redact_url("sqlite:///data@2026/lake.db") == "sqlite:///data@2026/lake.db"
    assert redact_url("postgresql://db/lake?password=hunter2&sslmode=require") == (
        "postgresql://db/lake?password=***&sslmode=require"
    )


def test_driver_messages_lose_every_piece_of_the_secret() -> None:
    url = "postgresql://bob:Zq9se/cretXw7@127.0.0.1:1/lake"
    message = "failed to resolve host 'cretXw7@127.0.0.1'; password Zq9se/cretXw7 refused"
    scrubbed = scrub(message, url_secrets(url))
    assert "cretXw7" not in scrubbed and "Zq9se" not in scrubbed
    assert "127.0.0.1" in scrubbed


@pytest.mark.postgres
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(scheme=st.sampled_from(SCHEMES), secret=credentials())
def test_opening_any_url_raises_a_typed_error_without_the_password(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, scheme: str, secret: Credentials
) -> None:
    monkeypatch.chdir(tmp_path)
    url = f"{scheme}://{secret.user}:{secret.password}@127.0.0.1:{free_port()}/lake"
    with pytest.raises(BranchwaterError) as caught:
        open_store(url).close()
    assert_no_secret(error_chain(caught.value), secret)
    assert "URL" in str(caught.value) or "unavailable" in str(caught.value)
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize(
    ("url", "names"),
    [
        ("postgresql://bob:secret@127.0.0.1:abc/lake", "port"),
        ("postgresql://bob:secret@127.0.0.1:99999/lake", "port"),
        ("postgresql://bob:secret@[::1/lake", "IPv6"),
        ("postgresql://bob:Zq9@secret@127.0.0.1/lake", "percent-encode"),
        ("postgresql://bo/b:secret@127.0.0.1/lake", "percent-encode"),
        ("dynamodb://KEY:secret@table", "credentials"),
        ("dynamodb://tbl?region=us-east-1&endpoint_url=http://[::1", "DynamoDB"),
        ("sqlite://bob:secret@host/lake.db", "path only"),
        ("sqlite://[::1/lake.db", "path only"),
        ("redis://[::1/0", "scheme"),
    ],
)
def test_malformed_urls_are_configuration_errors_naming_the_problem(url: str, names: str) -> None:
    with pytest.raises(ConfigurationError, match=names) as caught:
        open_store(url)
    assert "secret" not in error_chain(caught.value)


@pytest.mark.postgres
def test_a_percent_encoded_password_of_reserved_characters_connects(postgres_url: str) -> None:
    """The way out every refusal names works (the server trusts any password)."""
    password = quote("p@ss:w/o?r#d[]%", safe="")
    url = postgres_url.replace(f"{PG_USER}@", f"{PG_USER}:{password}@", 1)
    with open_store(f"{url}?table={unique_name('kv_')}&application_name=a%40b") as store:
        store.set(b"p", b"k", b"v")
        assert "p@ss" not in store.url and password not in store.url
