"""NeighbourTable: construction from dense and pair forms, scoring, files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from recmesh.retrieval.table import NeighbourTable, recency_weights


def test_from_dense_keeps_the_strongest_positive_entries_and_never_the_diagonal() -> None:
    m = np.array([[9, 3, 1, -2], [3, 9, 0, 5], [1, 0, 9, 0], [-2, 5, 0, 9]], np.float32)
    t = NeighbourTable.from_dense(["a", "b", "c", "d"], m, keep=2)
    assert t.row("a") == [("b", 3.0), ("c", 1.0)]
    assert t.row("b") == [("d", 5.0), ("a", 3.0)]
    assert t.row("c") == [("a", 1.0)]  # zeros are not neighbours
    assert t.row("d") == [("b", 5.0)]  # negatives neither
    assert t.row("unknown") == []


def test_scores_sum_the_seed_rows_weighted() -> None:
    t = NeighbourTable.from_pairs({"a": [("x", 1.0), ("y", 2.0)], "b": [("x", 4.0)]}, keep=10)
    top = t.top(["a", "b"], [1.0, 0.5], k=5)
    assert top == [("x", 3.0), ("y", 2.0)]  # x: 1 + 0.5 * 4
    # seeds and exclusions are never returned; unknown seeds count nothing
    assert t.top(["a", "zzz"], [1.0, 1.0], k=5, exclude=frozenset({"y"})) == [("x", 1.0)]
    assert t.top(["zzz"], [1.0], k=5) == []


def test_ties_break_by_item_id_and_k_cuts() -> None:
    t = NeighbourTable.from_pairs({"s": [("c", 1.0), ("a", 1.0), ("b", 1.0), ("d", 0.5)]}, keep=10)
    assert [i for i, _ in t.top(["s"], [1.0], k=3)] == ["a", "b", "c"]


def test_save_and_load_round_trip(tmp_path: Path) -> None:
    t = NeighbourTable.from_pairs({"a": [("b", 0.5)], "b": [("a", 0.25), ("c", 1.0)]}, keep=10)
    t.save(tmp_path / "t.npz")
    back = NeighbourTable.load(tmp_path / "t.npz")
    assert back.item_ids == t.item_ids
    assert back.row("b") == [("c", 1.0), ("a", 0.25)]


def test_a_table_whose_arrays_disagree_is_refused(tmp_path: Path) -> None:
    np.savez(tmp_path / "bad.npz", item_ids=np.array(["a"]), indptr=np.array([0, 1]),
             indices=np.array([5], np.int32), weights=np.array([1.0], np.float32))  # fmt: skip
    with pytest.raises(ValueError, match="not a consistent neighbour table"):
        NeighbourTable.load(tmp_path / "bad.npz")


def test_recency_weights() -> None:
    assert recency_weights(3, 0.5) == [1.0, 0.5, 0.25]
