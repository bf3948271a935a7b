from __future__ import annotations

from recmesh.cache import TtlCache


def test_fresh_within_ttl_stale_after_and_bounded() -> None:
    c: TtlCache[int] = TtlCache(ttl_s=5.0, max_entries=2)
    c.put("a", 1, now=0.0)
    assert c.get_fresh("a", now=4.9) == 1
    assert c.get_fresh("a", now=5.1) is None
    assert c.get_stale("a") == 1
    c.put("b", 2, now=1.0)
    c.put("c", 3, now=2.0)
    assert len(c) == 2 and c.get_stale("a") is None
    assert (c.hits, c.misses) == (1, 1)


def test_get_many_returns_held_values_and_the_keys_to_refresh() -> None:
    c: TtlCache[int] = TtlCache(ttl_s=5.0, max_entries=10)
    c.put("old", 1, now=0.0)
    c.put("new", 2, now=4.0)
    held, refresh, due = c.get_many(["new", "old", "none", "old", "new"], now=6.0)
    assert held == [2, 1, None, 1, 2]
    assert refresh == ["old", "none"]  # distinct, first-seen order
    assert due == []
    assert (c.hits, c.misses) == (3, 2)
    # Fresh but older than refresh_after_s: served, and named for a refresh ahead of expiry.
    held, refresh, due = c.get_many(["new", "old"], now=8.5, refresh_after_s=3.0)
    assert held == [2, 1] and refresh == ["old"] and due == ["new"]
