"""A KV URL whose user or password holds reserved characters, or that is malformed, ends the
CLI with exit 1 and one line that shows no piece of the password (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.helpers.cli import Bw, assert_user_error
from tests.helpers.hostile import Credentials, assert_no_secret, credentials

HOSTS = ["127.0.0.1:1", "127.0.0.1:abc", "127.0.0.1:99999", "[::1", "[::1]:1", "h/x@y"]


@pytest.mark.postgres
@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    scheme=st.sampled_from(["postgresql", "dynamodb", "sqlite", "mysql"]),
    secret=credentials(),
    host=st.sampled_from(HOSTS),
)
def test_a_hostile_kv_url_fails_in_one_line_without_the_password(
    bw: Bw, scheme: str, secret: Credentials, host: str
) -> None:
    result = bw("repo", "list", kv=f"{scheme}://{secret.user}:{secret.password}@{host}/lake")
    assert_user_error(result, 1)
    assert_no_secret(result.err, secret)
