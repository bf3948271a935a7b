"""The alternation and the spread of repeated comparisons (recmesh.bench.repeat)."""

from __future__ import annotations

import math

from recmesh.bench.repeat import round_order, spread, spreads


def test_order_reverses_every_other_round() -> None:
    assert [round_order(["off", "on"], r) for r in range(3)] == [["off", "on"], ["on", "off"], ["off", "on"]]


def test_spread_is_median_and_range_of_finite_values() -> None:
    s = spread([1.2, float("nan"), 0.9, 1.0])
    assert (s.median, s.low, s.high, s.rounds) == (1.0, 0.9, 1.2, 3)
    assert s.text() == "1.00x (range 0.90-1.20, 3 rounds)"
    assert spread([2.0]).text() == "2.00x"
    assert math.isnan(spread([]).median)


def test_spreads_per_figure_skip_missing_rounds() -> None:
    out = spreads([{"a": 1.0, "b": 4.0}, {"a": 3.0}])
    assert out["a"].median == 2.0 and out["b"].rounds == 1
