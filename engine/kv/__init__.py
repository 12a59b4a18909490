"""Key-value stores: the `Store` contract and its drivers, chosen by URL.

| URL                  | driver                                  |
|----------------------|-----------------------------------------|
| `memory://`          | in-process (tests)                      |
| `sqlite:///path.db`  | SQLite in WAL mode (embedded default)   |
| `postgresql://…`     | PostgreSQL, hash-partitioned table      |
| `dynamodb://table`   | DynamoDB conditional writes             |
"""

from __future__ import annotations

from branchwater.engine.errors import ConfigurationError, InvalidArgument
from branchwater.engine.kv.store import (
    DEFAULT_BATCH_SIZE,
    EXISTS,
    KeyValue,
    Predicate,
    Store,
    ValueWithPredicate,
)
from branchwater.engine.urls import redact_url, url_scheme

SCHEMES = ("memory", "sqlite", "postgresql", "postgres", "dynamodb")


def open_store(url: str, *, create: bool = True) -> Store:
    """Open the store a URL names; drivers are imported only when used.

    `create=False` opens only a store that holds a lake, creating nothing: where none is
    (no SQLite file, or one without the lake's table; no PostgreSQL or DynamoDB table) it
    raises `LakeNotFound`. A store that cannot be reached or looked at (no connection, no
    permission) is `Unavailable` either way, never missing. A `memory://` store is always
    there (a new, empty one)."""
    if not isinstance(url, str):
        raise InvalidArgument(f"KV URL must be a string, not {type(url).__name__}")
    if not isinstance(create, bool):
        raise InvalidArgument(f"create must be True or False, not {create!r}")
    scheme = _driver_scheme(url)
    if scheme == "memory":
        from branchwater.engine.kv.memory import MemoryStore

        return MemoryStore(url)
    if scheme == "sqlite":
        from branchwater.engine.kv.sqlite import SQLiteStore

        return SQLiteStore(url, create=create)
    if scheme in ("postgresql", "postgres"):
        from branchwater.engine.kv.postgres import PostgresStore

        return PostgresStore(url, create=create)
    if scheme == "dynamodb":
        from branchwater.engine.kv.dynamodb import DynamoDBStore

        return DynamoDBStore(url, create=create)
    shown = (
        f"in {redact_url(url)!r}"
        if "://" in url
        else "(the value is not shown: not a URL, it may hold a password as it stands)"
    )
    raise ConfigurationError(
        f"unknown KV URL scheme {scheme or '(none)'!r} {shown}; "
        f"use one of {', '.join(s + '://' for s in SCHEMES if s != 'postgres')}"
    )


def _driver_scheme(url: str) -> str:
    """`sqlite+pysqlite://` picks the driver `sqlite://` does."""
    return url_scheme(url).split("+", 1)[0]


__all__ = [
    "DEFAULT_BATCH_SIZE",
    "EXISTS",
    "KeyValue",
    "Predicate",
    "Store",
    "ValueWithPredicate",
    "open_store",
]
