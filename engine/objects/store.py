"""The `ObjectStore` contract: a flat namespace of immutable-once-written byte objects.

Keys are `/`-separated strings relative to the store's root (a directory or an S3 prefix).
Graveler writes data objects, ranges and metaranges through this; GC lists and deletes.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime

from branchwater.engine.errors import InvalidArgument, NotFound


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    mtime: datetime


class ObjectStore(abc.ABC):
    url: str

    @abc.abstractmethod
    def put(self, key: str, data: bytes) -> ObjectInfo:
        """Write atomically: a reader sees the old object, the whole new one, or nothing."""

    @abc.abstractmethod
    def get(self, key: str) -> bytes:
        """Return the object's bytes; `NotFound` names the key and the store URL."""

    @abc.abstractmethod
    def stat(self, key: str) -> ObjectInfo: ...

    @abc.abstractmethod
    def delete(self, keys: Iterable[str]) -> None:
        """Delete in bulk; absent keys are not an error."""

    @abc.abstractmethod
    def list_objects(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """Objects whose key starts with `prefix`, in ascending key order."""

    def exists(self, key: str) -> bool:
        try:
            self.stat(key)
        except NotFound:
            return False
        return True

    def uri(self, key: str) -> str:
        """The absolute URL of `key`, as another tool (Spark, aws cli) would address it."""
        return f"{self.url.rstrip('/')}/{key}"

    def close(self) -> None:  # noqa: B027 - optional hook; stores without clients keep it
        """Release clients; the store must not be used afterwards."""


def check_object_key(key: object) -> str:
    """Reject keys that could escape the root or are not plain relative paths."""
    if not isinstance(key, str):
        raise InvalidArgument(f"object key must be a string, not {type(key).__name__}")
    if not key or key.startswith("/") or key.endswith("/"):
        raise InvalidArgument(f"object key {key!r} must be a non-empty relative path")
    if any(part in ("", ".", "..") for part in key.split("/")):
        raise InvalidArgument(f"object key {key!r} must not contain empty, '.' or '..' parts")
    return key
