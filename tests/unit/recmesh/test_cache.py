from __future__ import annotations

from recmesh.cache import TtlCache, Vouched


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
    assert (c.hits, c.misses) == (2, 3)  # per key given, as get_fresh counts
    # Fresh but older than refresh_after_s: served, and named for a refresh ahead of expiry.
    held, refresh, due = c.get_many(["new", "old"], now=8.5, refresh_after_s=3.0)
    assert held == [2, 1] and refresh == ["old"] and due == ["new"]


def test_vouched_entries_are_fresh_since_the_last_change_and_due_after_it() -> None:
    c: TtlCache[int] = TtlCache(ttl_s=5.0, max_entries=10)
    c.put("two_changes_ago", 0, now=-10.0)
    c.put("before", 1, now=0.0)
    c.put("after", 2, now=2.0)
    # Changes seen at -5.0 and 1.0; the source was last known unchanged at 0.5.
    vouched = Vouched(since=1.0, until=0.5, prev_since=-5.0, max_age_s=300.0)
    # Long past the TTL, an entry stored since the change is fresh...
    assert c.get_fresh("after", now=100.0, vouched=vouched) == 2
    # ...and one stored before it is not, even inside the TTL.
    assert c.get_fresh("before", now=1.5, vouched=vouched) is None
    held, refresh, due = c.get_many(["after", "before"], now=1.5, refresh_after_s=3.0, vouched=vouched)
    assert held == [2, 1] and refresh == [] and due == ["before"]  # served, re-read at once
    # Its age counts from `until`, the last moment it was known current...
    assert c.get_many(["before"], now=5.4, vouched=vouched)[1:] == ([], ["before"])
    assert c.get_many(["before"], now=5.6, vouched=vouched)[1:] == (["before"], [])
    # ...but an entry from before the previous change counts from when it was stored.
    assert c.get_many(["two_changes_ago"], now=1.5, vouched=vouched)[1:] == (["two_changes_ago"], [])
    # Past max_age_s even a vouched entry is re-read: in the background for get_many.
    assert c.get_fresh("after", now=303.0, vouched=vouched) is None
    assert c.get_many(["after"], now=303.0, vouched=vouched)[1:] == ([], ["after"])
