"""The sweep's address check, in Arrow: what `_refuse_malformed` and each task refuse (the
sweeps themselves are run end to end by `test_gc_safety` and `test_gc_runs`)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from branchwater.engine import InvalidAddress
from branchwater.spark_jobs.gc.sweep import check_addresses, deleted_key, malformed

GOOD = "data/0123456789ab-abcdef/object-1"


def test_only_data_addresses_pass_and_a_trailing_newline_or_null_does_not() -> None:
    bad = ["data/0123456789ab-abcdef/x/../y", f"{GOOD}\n", "_branchwater/ranges/x", "", None]
    addresses = pa.chunked_array([[GOOD, *bad[:2]], [*bad[2:], GOOD]], pa.string())

    assert malformed(addresses).to_pylist() == bad
    assert malformed(pa.array([GOOD, GOOD])).to_pylist() == []


def test_a_file_with_one_bad_address_is_refused_naming_the_count_and_the_first() -> None:
    addresses = pa.array([GOOD] * 3 + [f"../x{i}" for i in range(7)])

    with pytest.raises(InvalidAddress, match=r"7 address\(es\).*'\.\./x0', '\.\./x1'") as refused:
        check_addresses(addresses, "candidates file 'k'")
    assert "'../x5'" not in str(refused.value)
    check_addresses(pa.array([GOOD]), "candidates file 'k'")


def test_the_record_of_a_candidates_file_is_its_namesake_under_deleted() -> None:
    assert deleted_key("_gc/r/candidates/part-3.parquet") == "_gc/r/deleted/part-3.parquet"
