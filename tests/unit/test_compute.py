"""Window semantics: (as_of - window, as_of], the same bounds Redis is queried with."""

from __future__ import annotations

import pytest

from recmesh.features.compute import (
    UserEvent,
    count_in_window,
    freshness,
    item_realtime,
    item_realtime_columns,
    newest_at_or_before,
    user_realtime,
)

MIN = 60_000


def ev(eid: str, item: str, behavior: str, t: int, cat: str = "news") -> UserEvent:
    return UserEvent(eid, item, behavior, cat, t)


def test_window_is_half_open() -> None:
    times = [100, 200, 300]
    assert count_in_window(times, 100, 300) == 2  # 100 excluded, 300 included
    assert count_in_window(times, 99, 299) == 2
    assert count_in_window([], 0, 10) == 0
    assert newest_at_or_before(times, 250) == 200
    assert newest_at_or_before(times, 50) is None


def test_user_features_apply_each_window() -> None:
    as_of = 100 * MIN
    events = [
        ev("e1", "i1", "click", as_of - 9 * MIN, "sports"),  # in 10m, not in 5m
        ev("e2", "i2", "click", as_of - 4 * MIN, "news"),
        ev("e3", "i3", "view", as_of - 1 * MIN, "news"),
        ev("e4", "i2", "add_to_cart", as_of, "news"),
    ]
    viewed = [
        ("i3", as_of - MIN),
        ("i2", as_of - 4 * MIN),
        ("i3", as_of - 5 * MIN),
        ("i1", as_of - 9 * MIN),
    ]
    f = user_realtime(events, viewed, as_of)
    assert f["clicks_5m"] == (1, 4 * MIN)
    assert f["category_clicks_10m"][0] == {"sports": 1, "news": 1}
    assert f["last_viewed_3"] == (["i3", "i2", "i1"], MIN)  # distinct, newest first


def test_no_events_gives_zeros_and_unknown_age() -> None:
    f = user_realtime([], [], 1000)
    assert f["clicks_5m"] == (0, -1)
    assert f["last_viewed_3"] == ([], -1)


def test_member_encoding_round_trips() -> None:
    e = ev("id-1", "i9", "view", 5, "food")
    assert UserEvent.decode(e.encode(), 5) == e


def test_item_columns_agree_with_the_per_item_function() -> None:
    as_of = 100 * MIN
    clicks, views, newest = [3, 0, 1], [5, 0, 0], [as_of - MIN, -1, as_of]
    cols = item_realtime_columns(clicks, views, newest, as_of)
    for i in range(3):
        one = item_realtime(clicks[i], views[i], None if newest[i] < 0 else newest[i], as_of)
        assert {name: (vals[i], ages[i]) for name, (vals, ages) in cols.items()} == one


def test_freshness_halves_every_tau() -> None:
    assert freshness(0, 60.0) == 1.0
    assert freshness(60_000, 60.0) == pytest.approx(0.5)
    assert freshness(90_000, 30.0) == pytest.approx(0.125)
    assert freshness(-1, 60.0) == 0.0  # no event behind the value
