"""The namespace layout GC relies on: slices sort newest first, addresses stay under data/."""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from branchwater.engine import InvalidAddress, InvalidArgument
from branchwater.engine.gc.addresses import (
    DATA_PREFIX,
    AddressAllocator,
    check_data_address,
    is_data_address,
    newest_first_id,
    newest_first_time,
    slice_created,
    slice_name,
)
from tests.helpers.hostile import any_text, not_text

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


def test_slice_names_sort_newest_first_and_encode_their_time() -> None:
    times = [T0 + timedelta(minutes=m) for m in (0, 1, 60, 24 * 60)]
    names = [slice_name(t) for t in times]
    assert sorted(names) == list(reversed(names))
    assert [slice_created(n) for n in names] == times


def test_ids_of_the_same_millisecond_differ() -> None:
    assert newest_first_id(T0) != newest_first_id(T0)


@pytest.mark.parametrize("name", ["", "abc", "zzzzzzzzzzzz-000000", "0123456789ab_000000", None])
def test_a_malformed_slice_name_is_refused(name: object) -> None:
    with pytest.raises(InvalidArgument):
        slice_created(name)  # type: ignore[arg-type]


def test_allocator_opens_a_new_slice_per_n_objects() -> None:
    now = [T0.timestamp()]
    allocator = AddressAllocator(objects_per_slice=3, clock=lambda: now[0])
    slices = [allocator.next_address().split("/")[1] for _ in range(7)]
    assert slices[0] == slices[1] == slices[2] != slices[3]
    assert slices[3] == slices[4] == slices[5] != slices[6]


def test_allocator_opens_a_new_slice_per_period() -> None:
    now = [T0.timestamp()]
    allocator = AddressAllocator(slice_seconds=3600, clock=lambda: now[0])
    first = allocator.next_address()
    now[0] += 3599
    same = allocator.next_address()
    now[0] += 1
    later = allocator.next_address()
    assert first.split("/")[1] == same.split("/")[1] != later.split("/")[1]
    assert later.split("/")[1] < first.split("/")[1]
    assert slice_created(later.split("/")[1]) == T0 + timedelta(hours=1)


def test_allocated_addresses_are_valid_data_addresses() -> None:
    allocator = AddressAllocator()
    address = allocator.next_address()
    assert address.startswith(DATA_PREFIX)
    assert check_data_address(address) == address


@pytest.mark.parametrize(
    "address",
    [
        "s3://other-bucket/data/0123456789ab-abcdef/obj",
        "file:///tmp/data/0123456789ab-abcdef/obj",
        "/data/0123456789ab-abcdef/obj",
        "_branchwater/ranges/abc",
        "tables/a.parquet",
        "data/0123456789ab-abcdef",
        "data/0123456789ab-abcdef/",
        "data/0123456789ab-abcdef/../../_branchwater/repository",
        "data/../0123456789ab-abcdef/obj",
        "data/0123456789ab-abcdef/sub/obj",
        "data/not-a-slice/obj",
        "data/0123456789ab-abcdef/.hidden",
        "",
        None,
        42,
    ],
)
def test_foreign_absolute_or_malformed_addresses_are_refused(address: object) -> None:
    with pytest.raises(InvalidAddress):
        check_data_address(address)


LINE_ENDS = st.sampled_from(["\n", "\r\n", "\r", "\x85", "\u2028", "\x00"])


@settings(max_examples=100, deadline=None)
@given(name=any_text(24) | not_text())
def test_a_time_ordered_id_is_checked_whole(name: object) -> None:
    try:
        created = newest_first_time(name)  # type: ignore[arg-type]
    except InvalidArgument as refused:
        assert repr(name) in str(refused)
    else:
        assert isinstance(name, str) and re.fullmatch(r"[0-9a-f]{12}-[0-9a-f]{6}", name)
        assert created.tzinfo is timezone.utc


@settings(max_examples=100, deadline=None)
@given(
    when=st.datetimes(datetime(2000, 1, 1), datetime(2200, 1, 1), timezones=st.just(timezone.utc)),
    end=LINE_ENDS,
)
def test_an_id_or_address_with_a_line_end_is_refused(when: datetime, end: str) -> None:
    name = newest_first_id(when)
    assert newest_first_time(name) == when.replace(microsecond=when.microsecond // 1000 * 1000)
    for text, check in (
        (f"{name}{end}", newest_first_time),
        (f"data/{name}/object{end}", check_data_address),
        (f"data/{name}{end}/object", check_data_address),
    ):
        with pytest.raises(InvalidArgument, match=re.escape(repr(text))):
            check(text)
    assert is_data_address(f"data/{name}/object")
    assert not is_data_address(f"data/{name}/object{end}")


@pytest.mark.parametrize("name", ["000000000000-abcdef", "000000000001-000000"])
def test_an_id_of_a_time_past_any_date_is_refused_not_a_crash(name: str) -> None:
    with pytest.raises(InvalidArgument, match="time-ordered id"):
        newest_first_time(name)
