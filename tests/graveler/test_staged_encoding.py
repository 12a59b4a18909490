"""No field value breaks a staged record (hypothesis): an entry is stored as written, decoded
alike by `decode_entry`, by the commit's Arrow split and by GC prepare's, or refused."""

from __future__ import annotations

from datetime import UTC, datetime

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from branchwater.engine.errors import InvalidArgument
from branchwater.engine.gc.prepare import staged_batch
from branchwater.engine.graveler.committed.format import staged_rows
from branchwater.engine.graveler.model import Entry, decode_entry, encode_entry, metadata_json

MTIMES = st.datetimes(
    min_value=datetime(1971, 1, 1), max_value=datetime(2200, 1, 1), timezones=st.just(UTC)
)
ENTRIES = st.builds(
    Entry,
    path=st.text(st.characters(exclude_categories=["Cs"]), min_size=1, max_size=8),
    address=st.text(max_size=8),
    size=st.integers(min_value=0, max_value=2**63 - 1),
    checksum=st.text(max_size=8),
    mtime=MTIMES,
    metadata=st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=3),
)


@settings(max_examples=300, deadline=None)
@given(entry=ENTRIES)
def test_an_entry_is_decoded_as_written_everywhere_or_refused(entry: Entry) -> None:
    try:
        value = encode_entry(entry)
    except InvalidArgument as exc:
        assert entry.path in str(exc) or repr(entry.path) in str(exc)
        assert any(c in entry.address + entry.checksum for c in "\x00") or not _utf8(entry)
        return
    assert decode_entry(entry.path, value) == entry

    row = staged_rows([(entry.path.encode(), value)]).to_pylist()[0]
    assert (row["address"], row["size"], row["checksum"]) == (
        entry.address,
        entry.size,
        entry.checksum,
    )
    assert (row["mtime"], row["metadata"], row["deleted"]) == (
        entry.mtime,
        metadata_json(entry.metadata),
        False,
    )

    gc_row = staged_batch([value], pa.array(["b"]), pa.array(["staged"])).to_pylist()[0]
    assert (gc_row["address"], gc_row["size"]) == (entry.address, entry.size)
    assert gc_row["creation_time"] == entry.mtime


def _utf8(entry: Entry) -> bool:
    try:
        (entry.address + entry.checksum).encode()
    except UnicodeEncodeError:
        return False
    return True


@pytest.mark.parametrize("field", ["address", "checksum"])
@pytest.mark.parametrize("text", ["a\x00b", "\ud800"])
def test_a_separator_or_lone_surrogate_is_refused_naming_the_entry(field: str, text: str) -> None:
    entry = Entry("p", "data/x", 1, "c", datetime(2026, 1, 1, tzinfo=UTC))._replace(**{field: text})
    with pytest.raises(InvalidArgument, match="'p'"):
        encode_entry(entry)


def test_values_stored_before_still_decode() -> None:
    stored = b'data/s/1\x003\x00abc\x001767225600000000\x00{"k":"v\\u0000w"}'
    assert decode_entry("p", stored) == Entry(
        "p", "data/s/1", 3, "abc", datetime(2026, 1, 1, tzinfo=UTC), {"k": "v\x00w"}
    )


def test_an_mtime_survives_to_the_microsecond() -> None:
    """`timestamp() * 10**6` in floats made this one a microsecond earlier."""
    mtime = datetime(2005, 4, 17, 8, 29, 2, 646319, tzinfo=UTC)
    value = encode_entry(Entry("p", "data/x", 1, "c", mtime))
    assert decode_entry("p", value).mtime == mtime  # type: ignore[union-attr]
    assert staged_rows([(b"p", value)]).column("mtime")[0].as_py() == mtime
