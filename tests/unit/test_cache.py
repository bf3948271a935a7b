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
