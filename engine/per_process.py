"""A value each process makes for itself: a forked child makes its own on first use rather
than use its parent's.

For clients that pool network connections (boto3's): in a forked child their pooled
connections are the parent's sockets, where a reply read by the wrong process would answer
another's request. The parent's value is left to the parent: a child never closes it.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Generic, TypeVar

T = TypeVar("T")


class PerProcess(Generic[T]):
    """`make()`'s value, made once in each process that asks for it."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._made: tuple[int, T] | None = None

    def get(self) -> T:
        pid = os.getpid()
        made = self._made
        if made is None or made[0] != pid:
            made = self._made = (pid, self._make())
        return made[1]

    def made_here(self) -> T | None:
        """The value if this process made it (what it may close), else None."""
        made = self._made
        return made[1] if made is not None and made[0] == os.getpid() else None
