from __future__ import annotations

from recmesh.features.covisit import COVISIT_PREVIOUS, merge_neighbours, pair_increments, previous_items


def test_previous_items_are_distinct_newest_first_without_the_item_itself() -> None:
    members = [b"e9|i2", b"e8|i1", b"e7|i2", b"e6|i3"]
    assert previous_items("i1", members) == ["i2", "i3"]
    many = [f"e{n}|i{n}" for n in range(20)]
    assert len(previous_items("i0", many)) == COVISIT_PREVIOUS


def test_pair_increments_count_both_directions() -> None:
    inc = pair_increments([("a", "b"), ("a", "c"), ("b", "a"), ("a", "a")])
    assert inc == {"a": {"b": 2, "c": 1}, "b": {"a": 2}, "c": {"a": 1}}


def test_merge_neighbours_sums_over_seeds_and_excludes_them() -> None:
    rows = [[("x", 3.0), ("b", 9.0)], [("x", 1.0), ("y", 4.0)]]
    assert merge_neighbours(rows, ["a", "b"], 10) == [("x", 4.0), ("y", 4.0)]
    assert merge_neighbours(rows, [], 1) == [("b", 9.0)]
