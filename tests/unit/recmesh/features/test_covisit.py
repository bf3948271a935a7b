from __future__ import annotations

from recmesh.features.covisit import merge_neighbours, pair_increments, previous_items, seeds_of
from recmesh.features.repository import FIELD_SEP, FeatureSet


def m(event_id: str, item_id: str, *rest: str) -> str:
    return FIELD_SEP.join((event_id, item_id, *rest))


def test_previous_items_are_distinct_newest_first_without_the_item_itself(
    demo_feature_set: FeatureSet,
) -> None:
    members = [m("e9", "i2").encode(), m("e8", "i1").encode(), m("e7", "i2").encode(), m("e6", "i3").encode()]
    assert previous_items("i1", members, 5) == ["i2", "i3"]
    many = [m(f"e{n}", f"i{n}") for n in range(20)]
    previous = demo_feature_set.roles.covisit_previous
    assert previous == 5  # the demo repository's covisit.previous
    assert previous_items("i0", many, previous) == [f"i{n}" for n in range(1, 6)]
    assert previous_items("i0", many, 2) == ["i1", "i2"]
    # Members may carry more fields after the item id (other features of the same stream).
    assert previous_items("x", [m("e1", "i7", "news")], 5) == ["i7"]


def test_seeds_are_the_recent_items_value() -> None:
    assert seeds_of(["i1", "i2"]) == ["i1", "i2"]
    assert seeds_of(None) == [] and seeds_of("i1") == []


def test_pair_increments_count_both_directions() -> None:
    inc = pair_increments([("a", "b"), ("a", "c"), ("b", "a"), ("a", "a")])
    assert inc == {"a": {"b": 2, "c": 1}, "b": {"a": 2}, "c": {"a": 1}}


def test_merge_neighbours_sums_over_seeds_and_excludes_them() -> None:
    rows = [[("x", 3.0), ("b", 9.0)], [("x", 1.0), ("y", 4.0)]]
    assert merge_neighbours(rows, ["a", "b"], 10) == [("x", 4.0), ("y", 4.0)]
    assert merge_neighbours(rows, [], 1) == [("b", 9.0)]
