"""External addresses: where reads find an imported object, and which addresses GC skips."""

from __future__ import annotations

import pyarrow as pa
import pytest

from branchwater.engine import InvalidAddress
from branchwater.engine.graveler.external import external_location, external_mask, is_external


def test_an_external_address_names_its_store_and_key_verbatim() -> None:
    assert external_location("s3://b/k/a b%20#?") == ("s3://b", "k/a b%20#?")
    assert external_location("file:///data/x/y.csv") == ("file:///", "data/x/y.csv")
    assert is_external("s3://b/k") and not is_external("data/0123/x")
    for bad in ("s3://bucket", "s3:///key", "file:///", "file://host/x"):
        with pytest.raises(InvalidAddress):
            external_location(bad)


def test_gc_skips_external_addresses_outside_the_namespace_only() -> None:
    addresses = pa.array(
        [
            "data/0123456789ab-abcdef/x",
            "s3://other/raw/a",
            "s3://bucket/ns-2/a",
            "s3://bucket/ns/data/0123456789ab-abcdef/x",
            "file:///elsewhere/a",
            None,
        ]
    )

    mask = external_mask(addresses, "s3://bucket/ns").to_pylist()

    assert mask == [False, True, True, False, True, False]
