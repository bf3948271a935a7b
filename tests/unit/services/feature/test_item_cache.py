"""The item read cache's rules with plain values (services/feature/item_cache.py)."""

from __future__ import annotations

from services.feature.item_cache import ItemReadCache, change_message


def _following(bound_ms: int = 500) -> ItemReadCache:
    cache = ItemReadCache(bound_ms)
    cache._start_following(now=0.0)
    return cache


def test_nothing_is_served_unless_following_the_ingest() -> None:
    cache = ItemReadCache(500)
    cache.put(["i1"], [(3, 100)], as_of_ms=1_000, read_at=1.0)
    assert cache.get(["i1"], 1_000, now=1.1) == ({}, ["i1"])
    off = ItemReadCache(0)
    off._start_following(0.0)
    assert not off.serving, "bound 0 is off"


def test_held_within_the_bound_in_time_and_as_of() -> None:
    cache = _following()
    cache.put(["i1", "i2"], [(3, 100), (5, 200)], as_of_ms=10_000, read_at=1.0)
    assert cache.get(["i1", "i2", "i3"], 10_200, now=1.3) == ({"i1": (3, 100), "i2": (5, 200)}, ["i3"])
    assert cache.get(["i1"], 10_200, now=1.6) == ({}, ["i1"]), "older than 500 ms"
    assert cache.get(["i1"], 10_600, now=1.1) == ({}, ["i1"]), "as of more than 500 ms later"
    assert cache.get(["i1"], 9_400, now=1.1) == ({}, ["i1"]), "or earlier"


def test_an_eviction_drops_the_item_and_keeps_a_read_in_flight_out() -> None:
    cache = _following()
    cache.put(["i1", "i2"], [(3, 100), (5, 200)], as_of_ms=10_000, read_at=1.0)
    cache.evict(["i1"], now=1.05)
    assert cache.get(["i1", "i2"], 10_000, now=1.1) == ({"i2": (5, 200)}, ["i1"])
    cache.put(["i1"], [(3, 100)], as_of_ms=10_000, read_at=1.02)  # began before the eviction
    assert cache.get(["i1"], 10_000, now=1.1) == ({}, ["i1"])
    cache.put(["i1"], [(4, 150)], as_of_ms=10_100, read_at=1.06)  # began after it
    assert cache.get(["i1"], 10_100, now=1.1) == ({"i1": (4, 150)}, [])


def test_reads_from_before_subscribing_are_not_held_and_a_lost_subscription_forgets() -> None:
    cache = ItemReadCache(500)
    cache._start_following(now=2.0)
    cache.put(["i1"], [(1, 1)], as_of_ms=0, read_at=1.9)
    assert cache.get(["i1"], 0, now=2.1) == ({}, ["i1"])
    cache.put(["i1"], [(1, 1)], as_of_ms=0, read_at=2.05)
    cache._stop_following()
    cache._start_following(now=2.2)
    assert cache.get(["i1"], 0, now=2.3) == ({}, ["i1"])


def test_bounded_in_entries_oldest_first() -> None:
    cache = ItemReadCache(500, max_entries=2)
    cache._start_following(0.0)
    cache.put(["a", "b", "c"], [(1,), (2,), (3,)], as_of_ms=0, read_at=1.0)
    assert cache.get(["a", "b", "c"], 0, now=1.0) == ({"b": (2,), "c": (3,)}, ["a"])


def test_change_message_names_each_item_once() -> None:
    assert change_message(["i1", "i2", "i1"]) == "i1\ni2"
