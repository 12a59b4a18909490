"""The PostgreSQL driver's statements run prepared on libpq (`postgres._PreparedCursor`):
what a session that lost its prepared statements, a server-side error and bytes of every
value do to them."""

from __future__ import annotations

import psycopg
import pytest

from branchwater.engine.errors import NotFound, PredicateFailed, Unavailable
from branchwater.engine.kv import open_store
from branchwater.engine.kv.postgres import KEEPALIVES
from tests.helpers.servers import unique_name

pytestmark = pytest.mark.postgres


def test_statements_are_prepared_again_after_the_session_dropped_them(postgres_url: str) -> None:
    with open_store(f"{postgres_url}?table={unique_name('kv_')}") as store:
        store.set(b"p", b"k", b"v")
        assert store.get(b"p", b"k").value == b"v"
        session = store._idle[-1].dbapi  # type: ignore[attr-defined]
        session.execute("DEALLOCATE ALL")
        store.set_if(b"p", b"k", b"w", b"v")
        assert store.get(b"p", b"k").value == b"w"
        assert [kv.key for kv in store.scan(b"p")] == [b"k"]
        with pytest.raises(PredicateFailed):
            store.set_if(b"p", b"k", b"x", b"v")
        assert store._idle[-1].dbapi is session  # type: ignore[attr-defined]


def test_every_byte_round_trips_and_scans_in_byte_order(postgres_url: str) -> None:
    keys = [bytes([b]) + b"\x00k" for b in (0xFF, 0x00, 0x80, 0x01, 0x7F)]
    with open_store(f"{postgres_url}?table={unique_name('kv_')}") as store:
        for key in keys:
            store.set(b"p\x00\xff", key, key * 1000)
        assert [(kv.key, kv.value) for kv in store.scan(b"p\x00\xff")] == [
            (k, k * 1000) for k in sorted(keys)
        ]
        ordered = sorted(keys)
        assert [kv.key for kv in store.scan(b"p\x00\xff", start=ordered[2])] == ordered[2:]


def test_a_server_side_error_is_unavailable_naming_it(postgres_url: str) -> None:
    table = unique_name("kv_")
    with open_store(f"{postgres_url}?table={table}") as store:
        store.set(b"p", b"k", b"v")
        with psycopg.connect(postgres_url, autocommit=True) as admin:
            admin.execute(f'DROP TABLE "{table}"')
        with pytest.raises(Unavailable, match=table):
            store.get(b"p", b"k")
        with pytest.raises(Unavailable, match=table):
            store.set(b"p", b"k", b"v")


def test_sessions_keep_tcp_alive_unless_the_url_says_otherwise(postgres_url: str) -> None:
    """A dead network path is found by keepalive probes in about a minute; a URL's own
    libpq settings win."""
    table = unique_name("kv_")
    url = f"{postgres_url}?table={table}&keepalives_idle=7"
    with open_store(url) as store:
        store.set(b"p", b"k", b"v")
        given = store._idle[-1].dbapi.info.get_parameters()  # type: ignore[attr-defined]
    assert {k: given.get(k) for k in KEEPALIVES} == {**KEEPALIVES, "keepalives_idle": "7"}


def test_a_missing_key_is_not_found(postgres_url: str) -> None:
    with open_store(f"{postgres_url}?table={unique_name('kv_')}") as store:
        with pytest.raises(NotFound):
            store.get(b"p", b"absent")
        store.delete(b"p", b"absent")
