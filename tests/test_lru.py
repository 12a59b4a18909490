"""The engine's one bounded cache: least recently used first out, by count and by weight."""

from __future__ import annotations

import pytest

from branchwater.engine.lru import LRU


def test_the_least_recently_used_goes_first() -> None:
    cache: LRU[str, int] = LRU(2)
    cache.put("a", 1)
    cache.put("b", 2)
    assert cache.get("a") == 1
    cache.put("c", 3)
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (1, None, 3)


def test_weights_bound_it_but_the_newest_item_stays() -> None:
    cache: LRU[str, bytes] = LRU(10, weight=len, max_weight=4)
    cache.put("a", b"12")
    cache.put("b", b"34")
    cache.put("c", b"5")
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == (None, b"34", b"5")
    cache.put("big", b"123456")
    assert (cache.get("b"), cache.get("c"), cache.get("big")) == (None, None, b"123456")


def test_discard_forgets_and_capacity_zero_keeps_nothing() -> None:
    cache: LRU[str, int] = LRU(2)
    cache.put("a", 1)
    cache.discard("a")
    cache.discard("never")
    assert cache.get("a") is None
    none: LRU[str, int] = LRU(0)
    none.put("a", 1)
    assert none.get("a") is None


def test_a_negative_capacity_is_refused() -> None:
    with pytest.raises(ValueError, match="capacity must be >= 0, not -1"):
        LRU(-1)
