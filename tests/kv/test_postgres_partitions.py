"""The PostgreSQL driver addresses the partition that holds a partition key's rows, not the
partitioned table: what it writes there is what the table holds, a statement locks that
partition alone, and a table it did not partition keeps working through the table."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from branchwater.engine.errors import NotFound
from branchwater.engine.kv import open_store, postgres
from branchwater.engine.kv.postgres import PostgresStore
from tests.helpers.row_locks import LOCK_WAIT_SECONDS, partitions_locked, row_locked, waiting
from tests.helpers.servers import unique_name

pytestmark = pytest.mark.postgres

KEYS = [(b"partition-%d" % i, b"key-%d" % i) for i in range(200)]


def test_rows_written_and_read_by_partition_are_the_tables_rows(
    pg_store: PostgresStore, pg_session: psycopg.Connection
) -> None:
    """Half the keys written by the store, half through the table by another session: each
    side reads all of them (a key sent to the wrong partition would fail its constraint,
    or be missed by the side looking where the server put it)."""
    ours, theirs = KEYS[::2], KEYS[1::2]
    for partition, key in ours:
        pg_store.set(partition, key, b"ours")
    with pg_session.transaction():
        for partition, key in theirs:
            pg_session.execute(
                f'INSERT INTO "{pg_store.table}" VALUES (%s, %s, %s)', (partition, key, b"theirs")
            )
    assert [pg_store.get(*k).value for k in KEYS] == [b"ours", b"theirs"] * (len(KEYS) // 2)
    assert [kv.key for p, k in KEYS for kv in pg_store.scan(p)] == [k for _, k in KEYS]
    rows = pg_session.execute(f'SELECT partition_key, key, value FROM "{pg_store.table}"')
    assert sorted(rows.fetchall()) == sorted(
        (p, k, b"ours" if (p, k) in ours else b"theirs") for p, k in KEYS
    )
    for partition, _ in KEYS:
        pg_store.drop_partition(partition)
    assert pg_session.execute(f'SELECT count(*) FROM "{pg_store.table}"').fetchone() == (0,)


def test_a_statement_on_a_key_locks_its_partition_alone(
    pg_store: PostgresStore, pg_session: psycopg.Connection
) -> None:
    """Held on its row by another session, a delete (planned once for every key) has
    locked one partition of the table, not all of them before pruning."""
    row = KEYS[0]
    pg_store.set(*row, b"value")
    with ThreadPoolExecutor(1) as pool, row_locked(pg_session, pg_store.table, row):
        delete = pool.submit(pg_store.delete, *row)
        deleter, _ = waiting(pg_session, "DELETE")
        assert len(partitions_locked(pg_session, deleter, pg_store.table)) == 1
    delete.result(LOCK_WAIT_SECONDS)
    with pytest.raises(NotFound):
        pg_store.get(*row)


def test_a_store_remembering_fewer_keys_than_it_touches_keeps_them_apart(
    pg_store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(postgres, "ROUTED_KEYS", 8)
    for round_ in range(2):
        for partition, key in KEYS[:40]:
            pg_store.set(partition, key, b"round %d" % round_)
    assert {pg_store.get(*k).value for k in KEYS[:40]} == {b"round 1"}
    assert len(pg_store._routes) <= 8


@pytest.mark.parametrize(
    "bounds",
    [(), ((2, 0), (4, 1), (4, 3))],
    ids=["not-partitioned", "partitioned-by-two-moduli"],
)
def test_a_table_not_partitioned_as_ours_is_used_through_the_table(
    postgres_url: str, pg_session: psycopg.Connection, bounds: tuple[tuple[int, int], ...]
) -> None:
    """A table made beforehand (as by hand, or another tool): without partitions, or hash
    partitions of two moduli, a layout this store never makes."""
    table = unique_name("kv_")
    pg_session.execute(
        f'CREATE TABLE "{table}" (partition_key BYTEA, key BYTEA, value BYTEA NOT NULL, '
        "PRIMARY KEY (partition_key, key))" + (" PARTITION BY HASH (partition_key)" * bool(bounds))
    )
    for modulus, remainder in bounds:
        pg_session.execute(
            f'CREATE TABLE "{table}_{modulus}_{remainder}" PARTITION OF "{table}" '
            f"FOR VALUES WITH (MODULUS {modulus}, REMAINDER {remainder})"
        )
    pg_session.commit()
    with open_store(f"{postgres_url}?table={table}") as store:
        assert isinstance(store, PostgresStore)
        store.set(*KEYS[0], b"value")
        assert store.set_guarded(*KEYS[1], b"guarded", KEYS[0]) == b"value"
        store.set_if(*KEYS[0], b"swapped", b"value")
        for partition, key in KEYS[2:20]:
            store.set(partition, key, b"value")
        assert [kv.value for kv in store.scan(KEYS[1][0])] == [b"guarded"]
        assert store.get(*KEYS[0]).value == b"swapped"
        assert all(store.get(*k).value == b"value" for k in KEYS[2:20])
        assert {route.sql.get for route in store._routes.values()} == {store._whole.sql.get}


def test_the_tables_own_partitions_are_addressed_whatever_the_url_says(
    postgres_url: str, pg_session: psycopg.Connection
) -> None:
    """A table made with four partitions, opened by a store whose URL asks for sixteen: the
    store addresses the four the table has, each key the one the server puts it in."""
    table = unique_name("kv_")
    with open_store(f"{postgres_url}?table={table}&partitions=4") as maker:
        maker.set(*KEYS[0], b"made")
    with open_store(f"{postgres_url}?table={table}") as store:
        assert isinstance(store, PostgresStore)
        for partition, key in KEYS[:40]:
            store.set(partition, key, b"value")
        placed = pg_session.execute(
            f'SELECT partition_key, CAST(CAST(tableoid AS REGCLASS) AS TEXT) FROM "{table}"'
        ).fetchall()
        assert len({name for _, name in placed}) == 4
        for partition, name in placed:
            assert f"FROM {store._quote(name)} WHERE" in store._route(partition).sql.get
        assert all(store.get(*k).value == b"value" for k in KEYS[:40])
