"""Offline replay: point-in-time rows, external sort, no leakage, the repository's label rule."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson

from recmesh.events import Event, validate_event
from recmesh.features.backfill import (
    LabelRule,
    Query,
    ReplayState,
    TouchedItems,
    backfill,
    features_as_of,
    training_examples,
)
from recmesh.features.eventlog import write_events
from recmesh.features.repository import FeatureSet, parse_feature_set
from recmesh.tools.demo.generate import generate_events, make_catalog

MIN = 60_000
T0 = 1_000 * MIN + 1_767_225_600_000


def event(
    feature_set: FeatureSet, eid: str, behavior: str, t: int, user: str = "u", item: str = "i"
) -> Event:
    obj = {"event_id": eid, "user_id": user, "item_id": item, "behavior": behavior, "event_time": t}
    return validate_event(obj, feature_set.event_schema)


def test_features_never_see_the_future(demo_feature_set: FeatureSet) -> None:
    events = [
        event(demo_feature_set, "v1", "view", T0),
        event(demo_feature_set, "c1", "click", T0 + 2000),
        event(demo_feature_set, "v2", "view", T0 + 60_000),
    ]
    items = {"i": {"category": "news"}}
    first, second = training_examples(demo_feature_set, events, {}, items)
    assert first.label == 1 and first.as_of_ms == T0 - 1
    assert first.user["clicks_5m"] == 0 and first.item["views_10m"] == 0, "its own view is not a feature"
    assert second.label == 0
    assert second.user["clicks_5m"] == 1 and second.user["last_viewed_3"] == ["i"]
    assert second.user["category_clicks_10m"] == {"news": 1}
    assert second.item["views_10m"] == 1 and second.item["clicks_10m"] == 1
    # Offline features come along, the declared defaults for an unknown user.
    assert second.item["category"] == "news" and second.user["age_band"] == "unknown"


def test_the_demo_label_is_a_click_within_ten_seconds_inclusive(demo_feature_set: FeatureSet) -> None:
    rule = LabelRule.of(demo_feature_set)
    assert (rule.examples, rule.behaviors, rule.within_ms) == (
        frozenset({"view"}),
        frozenset({"click"}),
        10_000,
    )
    events = [
        event(demo_feature_set, "v1", "view", T0, item="a"),
        event(demo_feature_set, "c1", "click", T0, item="a"),  # at the same time, after the view: positive
        event(demo_feature_set, "v2", "view", T0 + MIN, item="b"),
        event(demo_feature_set, "c2", "click", T0 + MIN + 10_000, item="b"),  # exactly 10 s later: positive
        event(demo_feature_set, "v3", "view", 2 * MIN + T0, item="c"),
        event(demo_feature_set, "c3", "click", 2 * MIN + T0 + 10_001, item="c"),  # 1 ms too late
        event(demo_feature_set, "v4", "view", 3 * MIN + T0, item="d"),
        event(demo_feature_set, "c4", "click", 3 * MIN + T0 + 1000, item="other"),  # another item
        event(demo_feature_set, "v5", "view", 4 * MIN + T0, item="e"),
        event(
            demo_feature_set, "c5", "click", 4 * MIN + T0 + 1000, user="someone-else", item="e"
        ),  # another user
    ]
    got = {(e.item_id, e.as_of_ms + 1): e.label for e in training_examples(demo_feature_set, events, {}, {})}
    assert got == {
        ("a", T0): 1,
        ("b", T0 + MIN): 1,
        ("c", T0 + 2 * MIN): 0,
        ("d", T0 + 3 * MIN): 0,
        ("e", T0 + 4 * MIN): 0,
    }


SELF_LABEL = """
[repository]
name = "self-label"

[events]
behaviors = ["view", "click"]

[training]
examples = ["view"]
label = { behaviors = ["view"], within = "10s" }
"""


def test_an_example_is_not_its_own_label() -> None:
    feature_set = parse_feature_set(SELF_LABEL, Path("self-label.toml"))
    events = [
        event(feature_set, "v1", "view", T0),
        event(feature_set, "v1", "view", T0 + 1),  # the same event delivered again: no example, no label
        event(feature_set, "v2", "view", T0 + 5000),  # another view of the item: labels v1
    ]
    got = [(e.as_of_ms + 1, e.label) for e in training_examples(feature_set, events, {}, {})]
    assert got == [(T0, 1), (T0 + 5000, 0)]
    assert [e.label for e in training_examples(feature_set, events[:2], {}, {})] == [0]


RATED = """
[repository]
name = "rated"

[events]
behaviors = ["view"]
values = { rating = "rating" }

[realtime.views_1d]
entity = "item"
aggregate = "count"
behaviors = ["view"]
window = "1d"

[training]
examples = ["view"]
label = { field = "rating", at_least = 4 }
negatives = 3
"""


def test_negatives_are_catalog_items_the_user_had_no_event_on_yet() -> None:
    feature_set = parse_feature_set(RATED, Path("rated.toml"))
    items: dict[str, dict[str, Any]] = {f"m{n}": {} for n in range(6)}

    def rated(eid: str, user: str, item: str, t: int, rating: float) -> Event:
        return validate_event(
            {"event_id": eid, "user_id": user, "item_id": item, "behavior": "view", "event_time": t,
             "rating": rating}, feature_set.event_schema,
        )  # fmt: skip

    events = [
        rated("a", "u1", "m0", T0, 5),
        rated("b", "u2", "m1", T0 + 1000, 2),
        rated("c", "u1", "m1", T0 + 2000, 4),
        rated("d", "u1", "m2", T0 + 3000, 1),
    ]
    rows = list(training_examples(feature_set, events, {}, items))
    assert [(r.item_id, r.label) for r in rows if r.item_id in ("m0", "m1", "m2") and r.as_of_ms + 1 in
            (T0, T0 + 1000, T0 + 2000, T0 + 3000) and r.label] == [("m0", 1), ("m1", 1)]  # fmt: skip
    assert len(rows) == 4 * (1 + 3)
    by_example = [rows[n : n + 4] for n in range(0, len(rows), 4)]
    for (example, *negatives), seen in zip(by_example, ({"m0"}, {"m1"}, {"m0", "m1"}, {"m0", "m1", "m2"}),
                                           strict=True):  # fmt: skip
        assert {n.label for n in negatives} == {0}
        assert {n.user_id for n in negatives} == {example.user_id}
        assert all(n.as_of_ms == example.as_of_ms for n in negatives)
        picked = {n.item_id for n in negatives}
        assert len(picked) == 3 and not picked & seen, (example, picked)  # never an item the user touched
    # A negative carries the item's real-time features as of its example, like any row.
    for n in (row for group in by_example for row in group[1:]):
        views = sum(1 for e in events if e.item_id == n.item_id and e.event_time <= n.as_of_ms)
        assert n.item["views_1d"] == views
    assert any(n.item["views_1d"] for group in by_example for n in group[1:])  # some had views
    assert [(r.item_id, r.label) for r in training_examples(feature_set, events, {}, items)] == [
        (r.item_id, r.label) for r in rows
    ]  # deterministic: a replay draws the same


def test_touched_items_answer_as_a_set_per_user_would_as_arrays_and_as_bitmaps() -> None:
    catalog = [f"m{n}" for n in range(40)]  # a bitmap of 40 items is 5 bytes: past 1 item, a user's is one
    touched = TouchedItems(catalog)
    rng = random.Random(3)
    reference: dict[str, set[str]] = {}
    # catalog items, and items outside it (numbered as they come: the bitmaps grow)
    everything = catalog + [f"x{n}" for n in range(30)]
    for _ in range(600):
        user, item = f"u{rng.randrange(12)}", rng.choice(everything[: rng.choice((4, 40, 70))])
        touched.add(user, item)
        reference.setdefault(user, set()).add(item)
        asked = f"u{rng.randrange(13)}"  # u12 never had an event
        seen = touched.of(asked)
        assert {i for i in everything if i in seen} == reference.get(asked, set())
        assert "never" not in seen and 7 not in seen
    kinds = {type(touched.of(u).held).__name__ for u in reference}
    assert kinds == {"bytearray"}
    small = TouchedItems([f"m{n}" for n in range(1000)])  # 125 bytes: 31 items stay an array
    for n in range(31):
        small.add("u", f"m{n * 7}")
    assert type(small.of("u").held).__name__ == "array"
    assert [f"m{n}" in small.of("u") for n in (0, 7, 1, 210, 217)] == [True, True, False, True, False]


def test_a_duplicate_event_id_of_the_same_user_is_dropped(demo_feature_set: FeatureSet) -> None:
    state = ReplayState(demo_feature_set, {}, {"i": {"category": "news"}})
    assert state.apply(event(demo_feature_set, "c1", "click", T0)) is True
    assert state.apply(event(demo_feature_set, "c1", "click", T0 + 1000)) is False
    assert (
        state.apply(event(demo_feature_set, "c1", "click", T0 + 1000, user="u2")) is True
    )  # ids are per user
    assert (state.applied, state.duplicates) == (2, 1)
    assert state.features("user", "u", T0 + 2000)["clicks_5m"] == (1, 2000)
    assert state.features("item", "i", T0 + 2000)["clicks_10m"] == (2, 1000)
    assert state.features("user", "u", T0 + 2000)["category_clicks_10m"] == ({"news": 1}, 2000)
    assert state.features("user", "nobody", T0) == {
        "clicks_5m": (0, -1), "category_clicks_10m": ({}, -1), "last_viewed_3": ([], -1),
    }  # fmt: skip


def test_a_row_read_again_as_of_the_same_time_is_the_state_then(demo_feature_set: FeatureSet) -> None:
    """Rows read again as of one time come from the last read while nothing
    changed the entity: an event applied to it, a later or earlier time, or a
    caller changing its copy each give the state as it is."""
    state = ReplayState(demo_feature_set, {}, {"i": {"category": "news"}, "j": {"category": "food"}})
    state.apply(event(demo_feature_set, "c1", "click", T0))
    at = T0 + 1000
    first = state.row("item", "i", at)
    assert first["clicks_10m"] == 1
    first["clicks_10m"] = 99  # the caller's copy
    again = state.row("item", "i", at)
    assert again["clicks_10m"] == 1
    again["clicks_10m"] = 77  # a copy again
    assert state.row("item", "i", at)["clicks_10m"] == 1
    state.apply(event(demo_feature_set, "c2", "click", T0 + 500, user="u2"))  # on i: read afresh
    assert state.row("item", "i", at)["clicks_10m"] == 2 and state.row("user", "u2", at)["clicks_5m"] == 1
    state.apply(event(demo_feature_set, "c3", "click", T0 + 600, item="j"))  # not on i: i's row stands
    assert state.row("item", "i", at)["clicks_10m"] == 2 and state.row("item", "j", at)["clicks_10m"] == 1
    assert state.row("item", "i", T0 + 11 * MIN)["clicks_10m"] == 0  # another time
    assert state.row("item", "i", at)["clicks_10m"] == 2  # and back
    state.sweep(T0 + 1000 * MIN)  # every entity idle past its retention: forgotten
    assert state.row("item", "i", at)["clicks_10m"] == 0


def _demo_events(catalog: Any, feature_set: FeatureSet) -> list[Event]:
    raw = generate_events(catalog, 1_767_225_600_000, 30 * MIN, 150, seed=9)
    return [validate_event(e, feature_set.event_schema) for e in raw]


def test_backfill_of_a_shuffled_log_equals_the_in_memory_replay(
    demo_feature_set: FeatureSet, tmp_path: Path
) -> None:
    catalog = make_catalog()
    events = _demo_events(catalog, demo_feature_set)
    shuffled = events[:]
    random.Random(4).shuffle(shuffled)
    log = tmp_path / "events.jsonl"
    write_events(log, shuffled)
    users = {u["user_id"]: u for u in catalog.users}
    items = {i["item_id"]: i for i in catalog.items}
    out = tmp_path / "rows.jsonl"
    figures = backfill(demo_feature_set, log, out, users, items, run_size=97)  # many spilled runs
    rows = [orjson.loads(line) for line in out.read_text().splitlines()]
    want = list(training_examples(demo_feature_set, events, users, items))
    assert figures["rows"] == len(rows) == len(want) > 100
    assert figures["positives"] == sum(w.label for w in want) > 0
    assert figures["feature_version"] == demo_feature_set.version
    assert {r["feature_version"] for r in rows} == {demo_feature_set.version}
    assert [(r["user_id"], r["item_id"], r["as_of_ms"], r["label"], r["user"], r["item"]) for r in rows] == [
        (w.user_id, w.item_id, w.as_of_ms, w.label, w.user, w.item) for w in want
    ]


FUNNEL = """
[repository]
name = "funnel"

[events]
behaviors = ["view", "cart", "purchase"]

[training]
examples = ["view", "purchase"]
label = { implicit = true }
weights = { purchase = 4 }
negatives = 2
"""


def test_implicit_feedback_every_example_is_a_positive_weighted_by_its_behaviour() -> None:
    feature_set = parse_feature_set(FUNNEL, Path("funnel.toml"))
    rule = LabelRule.of(feature_set)
    assert (
        "every purchase/view event is a positive (implicit feedback); weighted purchase 4" in rule.describe()
    )
    items: dict[str, dict[str, Any]] = {f"p{n}": {} for n in range(8)}
    events = [
        event(feature_set, "v1", "view", T0, item="p0"),
        event(feature_set, "c1", "cart", T0 + 1000, item="p0"),  # not an example behaviour: no row
        event(feature_set, "b1", "purchase", T0 + 2000, item="p0"),
        event(feature_set, "v2", "view", T0 + 3000, item="p1"),
    ]
    rows = list(training_examples(feature_set, events, {}, items))
    assert len(rows) == 3 * (1 + 2)
    examples = [r for r in rows if r.label == 1]
    assert [(r.item_id, r.as_of_ms + 1, r.weight) for r in examples] == [
        ("p0", T0, 1.0), ("p0", T0 + 2000, 4.0), ("p1", T0 + 3000, 1.0),
    ]  # fmt: skip
    negatives = [r for r in rows if r.label == 0]
    assert {r.weight for r in negatives} == {1.0} and not {r.item_id for r in negatives} & {"p0"}
    # Learnt retrieval and the default popularity count the examples, with the same weights.
    assert feature_set.roles.learnt_behaviors == {"purchase": 4.0, "view": 1.0}
    assert feature_set.roles.popularity_behaviors == frozenset({"purchase", "view"})


def test_features_as_of_answer_each_query_from_the_events_before_it(demo_feature_set: FeatureSet) -> None:
    events = [
        event(demo_feature_set, "v1", "view", T0, item="a"),
        event(demo_feature_set, "c1", "click", T0 + 1000, item="a"),
        event(demo_feature_set, "v2", "view", T0 + 2000, item="b"),
    ]
    queries = [Query("u", T0 + 1999, ("a", "b")), Query("u", T0 - 1, ("a",)), Query("u", T0 + 5000, ("b",))]
    got = list(features_as_of(demo_feature_set, events, {}, {"a": {"category": "news"}}, queries))
    assert [q.as_of_ms for q, _, _ in got] == [T0 - 1, T0 + 1999, T0 + 5000]  # answered in time order
    (_, early, [a_early]), (_, mid, [a_mid, b_mid]), (_, late, [b_late]) = got
    assert early["clicks_5m"] == 0 and a_early["views_10m"] == 0
    assert mid["clicks_5m"] == 1 and a_mid["views_10m"] == 1 and b_mid["views_10m"] == 0
    assert a_mid["category"] == "news" and late["last_viewed_3"] == ["b", "a"] and b_late["views_10m"] == 1
    # The same rows as the training replay computes for an example at that moment.
    (example,) = [e for e in training_examples(demo_feature_set, events, {}, {"a": {"category": "news"}})
                  if e.item_id == "b"]  # fmt: skip
    assert example.user == mid and example.item == b_mid


def test_features_as_of_keep_only_the_queries_users_streams_and_answer_as_a_full_replay(
    demo_feature_set: FeatureSet,
) -> None:
    """The users no query asks about feed their items' streams only; the
    answers are those of a replay that keeps every stream."""
    rng = random.Random(3)
    behaviors = ["view", "click", "view", "add_to_cart"]
    events = [
        event(demo_feature_set, f"e{n}", rng.choice(behaviors), T0 + 1000 * n, f"u{rng.randrange(6)}",
              f"i{rng.randrange(5)}")
        for n in range(300)
    ]  # fmt: skip
    items = {f"i{k}": {"category": "news" if k % 2 else "food"} for k in range(5)}
    queries = [Query(f"u{k}", T0 + 1000 * (40 * k + 7) + 1, ("i0", "i1", "i3")) for k in (0, 2, 3)]
    full = ReplayState(demo_feature_set, {}, items)
    want, pending = [], sorted(queries, key=lambda q: q.as_of_ms)
    for ev in events:
        while pending and pending[0].as_of_ms < ev.event_time:
            q = pending.pop(0)
            want.append((q, full.row("user", q.user_id, q.as_of_ms),
                         [full.row("item", i, q.as_of_ms) for i in q.items]))  # fmt: skip
        full.apply(ev)
    got = list(features_as_of(demo_feature_set, events, {}, items, queries))
    assert got == want and any(uf["clicks_5m"] for _, uf, _ in got)
    kept = ReplayState(demo_feature_set, {}, items, only_users={"u0"})
    for ev in events:
        kept.apply(ev)
    assert kept.row("item", "i1", T0 + 400_000) == full.row("item", "i1", T0 + 400_000)
    assert kept.row("user", "u0", T0 + 400_000) == full.row("user", "u0", T0 + 400_000)
    assert kept.row("user", "u1", T0 + 400_000) != full.row("user", "u1", T0 + 400_000)
