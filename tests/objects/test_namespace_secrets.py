"""A storage namespace with credentials in it is refused without showing them (hypothesis)."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from branchwater.engine import ConfigurationError, Lake
from branchwater.engine.objects import open_object_store
from tests.helpers.hostile import Credentials, assert_no_secret, credentials, error_chain


@settings(max_examples=80, deadline=None)
@given(scheme=st.sampled_from(["file", "gs", "az", "[s3"]), secret=credentials())
def test_an_object_store_url_with_credentials_fails_without_them(
    scheme: str, secret: Credentials
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        open_object_store(f"{scheme}://{secret.user}:{secret.password}@bucket/prefix")
    assert_no_secret(error_chain(caught.value), secret)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(secret=credentials())
def test_a_namespace_that_is_no_url_is_refused_without_its_credentials(
    lake: Lake, secret: Credentials
) -> None:
    with pytest.raises(ConfigurationError) as caught:
        lake.create_repository("sales", f"s3:{secret.user}:{secret.password}@bucket")
    assert_no_secret(str(caught.value), secret)
    assert lake.repositories() == []
