"""What a forked child makes of its parent's state: values it makes again for itself, and
state it forgets.

For clients that pool network connections (boto3's): in a forked child their pooled
connections are the parent's sockets, where a reply read by the wrong process would answer
another's request. The parent's value is left to the parent: a child never closes it.

A child has only the thread that forked: a lock another thread of the parent held at that
moment stays held in the child for ever, so a cache guarded by one would hang the child's
first use of it. Such objects register with `forget_in_child`; in a child each forgets
what it held (its lock, its entries: `after_fork_in_child`) before anything else runs.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable
from types import TracebackType
from typing import Generic, Protocol, TypeVar

T = TypeVar("T")


class PerProcess(Generic[T]):
    """`make()`'s value, made once in each process that asks for it, however many of its
    threads ask at first: one made per thread would leak all but the last (a client and
    its sockets), as only the value kept is closed."""

    def __init__(self, make: Callable[[], T]) -> None:
        self._make = make
        self._made: tuple[int, T] | None = None
        self._making = ChildSafeLock()

    def get(self) -> T:
        pid = os.getpid()
        made = self._made
        if made is None or made[0] != pid:
            with self._making:
                made = self._made
                if made is None or made[0] != pid:
                    made = self._made = (pid, self._make())
        return made[1]

    def made_here(self) -> T | None:
        """The value if this process made it (what it may close), else None."""
        made = self._made
        return made[1] if made is not None and made[0] == os.getpid() else None


class Forgetful(Protocol):
    def after_fork_in_child(self) -> None:
        """In a forked child: drop what the parent's threads may have held or left half-made."""


_FORGETFUL: weakref.WeakSet[Forgetful] = weakref.WeakSet()


def forget_in_child(state: Forgetful) -> None:
    """Have `state.after_fork_in_child()` called in every process forked after this call."""
    _FORGETFUL.add(state)


class ChildSafeLock:
    """A lock that a forked child finds free, whoever held it at the fork: for state whose
    entries are consistent between statements (a dict keyed by process id, a dict of
    stores), so only the lock needs forgetting."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        forget_in_child(self)

    def __enter__(self) -> None:
        self._lock.acquire()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._lock.release()

    def after_fork_in_child(self) -> None:
        self._lock = threading.Lock()


def _after_fork_in_child() -> None:
    for state in list(_FORGETFUL):
        state.after_fork_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
