from __future__ import annotations

from recmesh.features.covisit import batch_pairs, merge_neighbours, pair_increments, seeds_of
from recmesh.features.repository import FeatureSet


def test_batch_pairs_read_the_newest_distinct_earlier_items(demo_feature_set: FeatureSet) -> None:
    previous = demo_feature_set.roles.covisit_previous
    assert previous == 5  # the demo repository's covisit.previous
    held = {"u1": {"i2": 900, "i3": 800, "old": 10}}  # the list before the batch: item -> latest time
    visits = [("u1", "i1", 1_000), ("u1", "i2", 1_100), ("u1", "i1", 1_200), ("u2", "i9", 1_000)]
    pairs = batch_pairs(visits, held, 500, previous)
    assert pairs == [
        ("i1", "i2"), ("i1", "i3"),  # 'old' is outside the window
        ("i2", "i1"), ("i2", "i3"),  # i2's own earlier visit is not a neighbour
        ("i1", "i2"), ("i1", "i3"),  # i1's latest time moved to 1000; i3 still inside
    ]  # fmt: skip
    # at most `previous`, newest first; equal times go by item id, descending (as Redis reads them)
    many = {"u": {f"i{n}": 100 + n // 2 for n in range(20)}}
    assert batch_pairs([("u", "x", 200)], many, 1_000, 3) == [("x", "i19"), ("x", "i18"), ("x", "i17")]
    assert batch_pairs([("u", "x", 200)], many, 1_000, 0) == []


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
