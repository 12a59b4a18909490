"""Staged entries: one KV partition per staging token, keyed by path.

A token's partition is written only while the token is a branch's `staging_token`; once
sealed it is read-only, and it is dropped only after a commit or compaction has absorbed it.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator, Sequence

from branchwater.engine.errors import NotFound
from branchwater.engine.graveler.iterators import combine
from branchwater.engine.graveler.model import Entry, RepositoryRecord, decode_entry, encode_entry
from branchwater.engine.kv import Store

StagedValue = Entry | None
"""A staged entry, or `None` for a tombstone."""


COMPACTION_MARK = ".compaction"
"""Ends the name of a token a compaction's seal opened."""
RELEASE_MARK = ".released"
"""Ends the name of a token opened by the seal that releases a failed commit's or merge's
own (`commit.releasing`): no commit builds on that seal."""


def new_staging_token(repo: RepositoryRecord, branch: str, *, mark: str = "") -> str:
    """Tokens name their repository and branch so a stray partition can be traced. A token
    opened by a seal no commit builds on ends in its `mark` (`COMPACTION_MARK`,
    `RELEASE_MARK`): a token sealed later was sealed by whoever opened the token above it,
    which is how a commit tells a commit's seal under way from the others."""
    return f"staging/{repo.name}-{repo.unique_id}/{branch}/{uuid.uuid4().hex}{mark}"


def opened_by_commit(token: str) -> bool:
    """Whether the seal that opened `token` is a commit's, which may still be building on
    the tokens it sealed."""
    return not token.endswith((COMPACTION_MARK, RELEASE_MARK))


def _stored(entry: StagedValue) -> bytes:
    """A staged value as the KV holds it: a tombstone is the empty value."""
    return b"" if entry is None else encode_entry(entry)


class StagingArea:
    def __init__(self, kv: Store, batch_size: int = 1000) -> None:
        self.kv = kv
        self.batch_size = batch_size

    def put(self, token: str, path: str, entry: StagedValue) -> None:
        self.kv.set(token.encode(), path.encode(), _stored(entry))

    def put_guarded(
        self, token: str, path: str, entry: StagedValue, guard: tuple[bytes, bytes]
    ) -> bytes:
        """`put`, returning what the `guard` key held once the row was in (`set_guarded`)."""
        return self.kv.set_guarded(token.encode(), path.encode(), _stored(entry), guard)

    def remove_guarded(
        self, token: str, path: str, guard: tuple[bytes, bytes], expected: bytes
    ) -> bool:
        """`remove` only while the `guard` key holds `expected`, atomically
        (`Store.delete_guarded`): whether it held."""
        return self.kv.delete_guarded(token.encode(), path.encode(), guard, expected)

    def create_guarded(
        self, token: str, path: str, entry: Entry, guard: tuple[bytes, bytes], expected: bytes
    ) -> bool:
        """`put` only where the token holds no row at `path` but a tombstone, and only while
        the `guard` key holds `expected`, atomically (`Store.create_guarded`): whether it
        was written; `PredicateFailed` if the guard did not hold. A lost reply is settled
        by a read: the row holding this very entry (its address is new) was written."""
        return self.kv.create_unique_guarded(
            token.encode(), path.encode(), encode_entry(entry), guard, expected
        )

    def remove(self, token: str, path: str) -> None:
        """Forget a staged path entirely (not a tombstone: lower layers show through)."""
        self.kv.delete(token.encode(), path.encode())

    def get(self, token: str, path: str) -> tuple[bool, StagedValue]:
        """(found, value): found with `None` is a tombstone; not found means look further down."""
        try:
            value, _ = self.kv.get(token.encode(), path.encode())
        except NotFound:
            return False, None
        return True, decode_entry(path, value)

    def scan(
        self, token: str, after: str = "", prefix: str = ""
    ) -> Iterator[tuple[str, StagedValue]]:
        """Staged (path, value) pairs in path order, strictly after `after`, under `prefix`."""
        start = max(after, prefix)
        for key, value in self.kv.scan(token.encode(), start.encode(), self.batch_size):
            path = key.decode()
            if after and path == after:
                continue
            if not path.startswith(prefix):
                return
            yield path, decode_entry(path, value)

    def scan_encoded(self, token: str, after: str = "") -> Iterator[tuple[bytes, bytes]]:
        """Staged (path, value) pairs as the KV holds them, in path order, strictly after
        `after`: for callers that turn whole batches into Arrow (UTF-8 bytes sort as their
        text does). No Python runs per row."""
        start = after.encode()
        rows = iter(self.kv.scan(token.encode(), start, self.batch_size))
        return itertools.dropwhile(lambda row: row[0] == start, rows) if after else rows

    def batches(
        self, tokens: Sequence[str], size: int, after: str = ""
    ) -> Iterator[list[tuple[bytes, bytes]]]:
        """The tokens' staged rows merged (newest token first; it wins a path), undecoded,
        strictly after `after`, in path order and in lists of at most `size`: what commits,
        compactions and `uncommitted()` turn into Arrow a list at a time. One token (the
        usual case) comes as the KV returns it, with no Python per row."""
        if len(tokens) == 1:
            start = after.encode() + b"\x00" if after else b""
            return self.kv.scan_batches(tokens[0].encode(), start, size)
        merged = combine([self.scan_encoded(token, after) for token in tokens])
        return iter(lambda: list(itertools.islice(merged, size)), [])

    def is_empty(self, token: str) -> bool:
        return next(iter(self.kv.scan(token.encode(), b"", 1)), None) is None
