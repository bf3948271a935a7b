"""Window semantics: (as_of - window, as_of], the same bounds Redis is queried with,
and the generic aggregations over a stream's stored members."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from recmesh.features.compute import (
    Layout,
    StreamEvent,
    aggregate,
    attribute_text,
    count_columns,
    count_in_window,
    encode_member,
    freshness,
    newest_at_or_before,
)
from recmesh.features.repository import (
    FIELD_SEP,
    VALUE_SEP,
    FeatureSet,
    FeatureValue,
    Stream,
    parse_feature_set,
)

MIN = 60_000

# A repository with what the demo does not declare: an item 'count' stream with
# two windows, sum and mean over an event value, a multi-valued count_by attribute.
EXTRA = """
[repository]
name = "compute-test"

[events]
behaviors = ["view", "click"]
values = ["rating"]

[users.features]
tags = { type = "multi" }

[items.features]
genres = { type = "multi" }

[realtime.clicks_2m]
entity = "item"
aggregate = "count"
behaviors = ["click"]
window = "2m"

[realtime.clicks_10m]
entity = "item"
aggregate = "count"
behaviors = ["click"]
window = "10m"

[realtime.rating_sum_10m]
entity = "user"
aggregate = "sum"
field = "rating"
window = "10m"

[realtime.rating_mean_10m]
entity = "user"
aggregate = "mean"
field = "rating"
default = 2.5
window = "10m"

[realtime.genre_views_10m]
entity = "user"
aggregate = "count_by"
by = "genres"
behaviors = ["view"]
window = "10m"

[realtime.recent_2]
entity = "user"
aggregate = "last_n"
n = 2
scan = 3
behaviors = ["view"]
window = "1h"
slide = "exact"
"""


@pytest.fixture(scope="module")
def extra_fs() -> FeatureSet:
    return parse_feature_set(EXTRA, Path("compute-test.toml"))


# (event_id, other entity's id, behaviour, time, other entity's attributes, event values)
Raw = tuple[str, str, str, int, dict[str, str], dict[str, float]]


def ev(eid: str, other: str, behavior: str, t: int, attrs: dict[str, str] | None = None,
       values: dict[str, float] | None = None) -> Raw:  # fmt: skip
    return (eid, other, behavior, t, attrs or {}, values or {})


def stream_events(stream: Stream, raw: list[Raw]) -> list[StreamEvent]:
    """What the store holds for one entity in `stream`: the events of its
    behaviours, encoded as the write path encodes them, ascending."""
    return sorted(
        (t, encode_member(stream, eid, other, attrs, values))
        for eid, other, behavior, t, attrs, values in raw
        if behavior in stream.behaviors
    )


def features_of(
    feature_set: FeatureSet, entity: str, raw: list[Raw], as_of: int
) -> dict[str, tuple[FeatureValue, int]]:
    out: dict[str, tuple[FeatureValue, int]] = {}
    for s in feature_set.streams:
        if s.entity != entity:
            continue
        events = stream_events(s, raw)
        for f in s.features:
            out[f.name] = aggregate(f, Layout.of(s), events, as_of)
    return out


def test_window_is_half_open() -> None:
    times = [100, 200, 300]
    assert count_in_window(times, 100, 300) == 2  # 100 excluded, 300 included
    assert count_in_window(times, 99, 299) == 2
    assert count_in_window([], 0, 10) == 0
    assert newest_at_or_before(times, 250) == 200
    assert newest_at_or_before(times, 50) is None


def test_aggregate_window_is_half_open(demo_feature_set: FeatureSet) -> None:
    f = demo_feature_set.by_name["clicks_5m"]
    s = demo_feature_set.stream(f.stream, "user")
    as_of = 100 * MIN
    raw = [ev("lo", "i1", "click", as_of - 5 * MIN, {"category": "a"}),
           ev("hi", "i2", "click", as_of, {"category": "a"}),
           ev("late", "i3", "click", as_of + 1, {"category": "a"})]  # fmt: skip
    assert aggregate(f, Layout.of(s), stream_events(s, raw), as_of) == (1, 0)
    # A millisecond later the event at as_of - 5 min drops out and the late one counts.
    assert aggregate(f, Layout.of(s), stream_events(s, raw), as_of + 1) == (2, 0)
    assert aggregate(f, Layout.of(s), stream_events(s, raw), as_of - 5 * MIN - 1) == (0, -1)


def test_user_features_apply_each_window(demo_feature_set: FeatureSet) -> None:
    as_of = 100 * MIN
    raw = [
        ev("e1", "i1", "click", as_of - 9 * MIN, {"category": "sports"}),  # in 10m, not in 5m
        ev("e0", "i3", "view", as_of - 5 * MIN, {"category": "news"}),
        ev("e2", "i2", "click", as_of - 4 * MIN, {"category": "news"}),
        ev("e3", "i3", "view", as_of - 1 * MIN, {"category": "news"}),
        ev("e4", "i2", "add_to_cart", as_of, {"category": "news"}),
    ]
    f = features_of(demo_feature_set, "user", raw, as_of)
    assert f["clicks_5m"] == (1, 4 * MIN)
    assert f["category_clicks_10m"] == ({"sports": 1, "news": 1}, 4 * MIN)
    assert f["last_viewed_3"] == (["i3", "i2", "i1"], MIN)  # distinct, newest first


def test_ages_are_per_feature(demo_feature_set: FeatureSet) -> None:
    """Each feature's age is as_of minus the newest event in its own window that
    matches its behaviours; a feature with an empty window has age -1 even when
    another feature of the same stream has a value."""
    as_of = 100 * MIN
    raw = [
        ev("c1", "i1", "click", as_of - 7 * MIN, {"category": "food"}),
        ev("v1", "i2", "view", as_of - 2 * MIN, {"category": "news"}),
    ]
    f = features_of(demo_feature_set, "user", raw, as_of)
    assert f["clicks_5m"] == (0, -1)  # the click is outside its 5 min
    assert f["category_clicks_10m"] == ({"food": 1}, 7 * MIN)
    assert f["last_viewed_3"] == (["i2", "i1"], 2 * MIN)  # the view is newer than the click
    items = features_of(demo_feature_set, "item", raw, as_of)  # as if every event were on one item
    assert items["clicks_10m"] == (1, 7 * MIN)
    assert items["views_10m"] == (1, 2 * MIN)


def test_no_events_gives_defaults_and_unknown_age(demo_feature_set: FeatureSet) -> None:
    f = features_of(demo_feature_set, "user", [], 1000)
    assert f == {"clicks_5m": (0, -1), "category_clicks_10m": ({}, -1), "last_viewed_3": ([], -1)}
    assert features_of(demo_feature_set, "item", [], 1000) == {"clicks_10m": (0, -1), "views_10m": (0, -1)}
    # The default handed out is a copy: changing it leaves the declaration alone.
    value, _ = f["last_viewed_3"]
    assert isinstance(value, list)
    value.append("x")
    assert demo_feature_set.by_name["last_viewed_3"].default == []


def test_member_encoding_round_trips(demo_feature_set: FeatureSet, extra_fs: FeatureSet) -> None:
    s = demo_feature_set.stream("click", "user")  # event id + the item's category
    layout = Layout.of(s)
    member = encode_member(s, "id-1", "i9", {"category": "food"}, {})
    parts = member.split(FIELD_SEP)
    assert parts[0] == "id-1" and layout.other == -1 and parts[layout.attrs["category"]] == "food"
    viewed = next(s for s in extra_fs.streams if s.entity == "user" and s.other_id)  # event id + the item id
    parts = encode_member(viewed, "id-2", "i9", {}, {}).split(FIELD_SEP)
    assert parts[0] == "id-2" and parts[Layout.of(viewed).other] == "i9"
    # An item's member carries the user as well: an event id is unique per user only.
    assert (
        encode_member(demo_feature_set.stream("click", "item"), "id-3", "u1", {"category": "x"}, {})
        == "id-3\x1fu1"
    )
    # Values are stored as floats; a missing one is empty.
    rated = next(s for s in extra_fs.streams if s.values == ("rating",))
    at = Layout.of(rated).values["rating"]
    assert float(encode_member(rated, "e", "i", {}, {"rating": 4}).split(FIELD_SEP)[at]) == 4.0
    assert encode_member(rated, "e", "i", {}, {}).split(FIELD_SEP)[at] == ""


def test_attribute_text_cleans_separators_and_joins_multi_values() -> None:
    assert attribute_text(["a", "b"]) == f"a{VALUE_SEP}b"
    assert attribute_text(f"x{FIELD_SEP}y\tz\n") == "x y z "
    assert attribute_text(7) == "7"
    assert FIELD_SEP not in attribute_text([f"a{FIELD_SEP}", f"b{VALUE_SEP}c"]).replace(VALUE_SEP, "")


def test_sum_mean_and_multi_valued_count_by(extra_fs: FeatureSet) -> None:
    as_of = 100 * MIN
    raw = [
        ev("e1", "i1", "view", as_of - 11 * MIN, {"genres": attribute_text(["x"])}, {"rating": 100.0}),
        ev("e2", "i1", "view", as_of - 3 * MIN, {"genres": attribute_text(["jazz", "rock"])}, {"rating": 4}),
        ev("e3", "i2", "click", as_of - 2 * MIN, {}, {"rating": 2.0}),
        ev("e4", "i3", "view", as_of - 1 * MIN, {"genres": attribute_text(["jazz"])}),  # no rating
    ]
    f = features_of(extra_fs, "user", raw, as_of)
    assert f["rating_sum_10m"] == (6.0, MIN)
    assert f["rating_mean_10m"] == (3.0, MIN)  # an event without the value does not count
    assert f["genre_views_10m"] == ({"jazz": 2, "rock": 1}, MIN)  # once per value
    empty = features_of(extra_fs, "user", raw[:1], as_of)
    assert empty["rating_sum_10m"] == (0.0, -1)
    assert empty["rating_mean_10m"] == (2.5, -1)  # the declared default of an empty window


def test_last_n_reads_only_the_newest_scan_events(extra_fs: FeatureSet) -> None:
    as_of = 100 * MIN
    raw = [ev(f"e{n}", item, "view", as_of - (10 - n) * MIN)
           for n, item in enumerate(["old", "i1", "i2", "i2", "i2"])]  # fmt: skip
    # scan = 3 looks at the newest three events only (all i2): 'i1' is not reached.
    assert features_of(extra_fs, "user", raw, as_of)["recent_2"] == (["i2"], 6 * MIN)
    raw.append(ev("e9", "i9", "view", as_of))
    assert features_of(extra_fs, "user", raw, as_of)["recent_2"] == (["i9", "i2"], 0)  # at most n


def test_item_columns_agree_with_the_per_item_aggregation(extra_fs: FeatureSet) -> None:
    """count_columns (what the look-up builds from ZCOUNTs, many items at once)
    equals aggregate over each item's events, windows narrower than the widest included."""
    s = next(s for s in extra_fs.streams if s.entity == "item" and s.id == "click")
    assert s.read == "count" and s.windows == (10 * MIN, 2 * MIN)
    layout = Layout.of(s)
    rng = random.Random(3)
    as_of = 100 * MIN
    for _ in range(50):
        per_item = [
            sorted((as_of - rng.randrange(-MIN, 15 * MIN), f"e{k}") for k in range(rng.randrange(0, 6)))
            for _ in range(rng.randrange(1, 8))
        ]
        times = [[t for t, _ in evs] for evs in per_item]
        counts = [[count_in_window(ts, as_of - w, as_of) for ts in times] for w in s.windows]
        newest = [
            -1 if (t := newest_at_or_before(ts, as_of)) is None or t <= as_of - s.windows[0] else t
            for ts in times
        ]
        cols = count_columns(s, counts, newest, as_of)
        assert set(cols) == {"clicks_2m", "clicks_10m"}
        for f in s.features:
            values, ages = cols[f.name]
            assert list(zip(values, ages, strict=True)) == [
                aggregate(f, layout, evs, as_of) for evs in per_item
            ]


def test_freshness_halves_every_tau() -> None:
    assert freshness(0, 60.0) == 1.0
    assert freshness(60_000, 60.0) == pytest.approx(0.5)
    assert freshness(90_000, 30.0) == pytest.approx(0.125)
    assert freshness(-1, 60.0) == 0.0  # no event behind the value
