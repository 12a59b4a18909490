"""Key-value stores: the `Store` contract and its drivers, chosen by URL.

| URL                  | driver                                  |
|----------------------|-----------------------------------------|
| `memory://`          | in-process (tests)                      |
| `sqlite:///path.db`  | SQLite in WAL mode (embedded default)   |
| `postgresql://…`     | PostgreSQL, hash-partitioned table      |
| `dynamodb://table`   | DynamoDB conditional writes             |
"""

from __future__ import annotations

import os

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


def open_store(url: str) -> Store:
    """Open the store a URL names; drivers are imported only when used."""
    if not isinstance(url, str):
        raise InvalidArgument(f"KV URL must be a string, not {type(url).__name__}")
    scheme = _driver_scheme(url)
    if scheme == "memory":
        from branchwater.engine.kv.memory import MemoryStore

        return MemoryStore(url)
    if scheme == "sqlite":
        from branchwater.engine.kv.sqlite import SQLiteStore

        return SQLiteStore(url)
    if scheme in ("postgresql", "postgres"):
        from branchwater.engine.kv.postgres import PostgresStore

        return PostgresStore(url)
    if scheme == "dynamodb":
        from branchwater.engine.kv.dynamodb import DynamoDBStore

        return DynamoDBStore(url)
    raise ConfigurationError(
        f"unknown KV URL scheme {scheme or '(none)'!r} in {redact_url(url)!r}; "
        f"use one of {', '.join(s + '://' for s in SCHEMES if s != 'postgres')}"
    )


def sqlite_file(url: str) -> str | None:
    """The absolute path of the file a `sqlite://` URL names, as its store would open it;
    None for a store that is not a local file. A malformed SQLite URL raises
    `ConfigurationError`, as opening it would."""
    if _driver_scheme(url) != "sqlite":
        return None
    from branchwater.engine.kv.sqlite import database_path

    return database_path(url)


def no_file_at(path: str) -> bool:
    """Whether nothing is at `path`: a file that cannot be looked at (a folder without
    permission) is not taken for missing, as opening it then says what is wrong."""
    try:
        os.stat(path)
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return False


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
    "no_file_at",
    "open_store",
    "sqlite_file",
]
