from __future__ import annotations

from services.ranker.policy import drop_seen, top_n


def test_top_n_orders_by_score_and_keeps_ties_stable() -> None:
    assert top_n(["a", "b", "c", "d"], [0.1, 0.9, 0.5, 0.9], 3) == [
        ("b", 0.9),
        ("d", 0.9),
        ("c", 0.5),
    ]
    assert top_n([], [], 3) == []


def test_drop_seen_keeps_order() -> None:
    assert drop_seen([("a", 3.0), ("b", 2.0), ("c", 1.0)], ["b"]) == [("a", 3.0), ("c", 1.0)]
