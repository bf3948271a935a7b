"""The alternation and the spread of repeated comparisons (recmesh.tools.bench.repeat)."""

from __future__ import annotations

import math

from recmesh.tools.bench.repeat import round_order, spread, spreads


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


def test_features_rounds_keep_the_last_round_and_spread_the_targets() -> None:
    from recmesh.tools.bench.features import TARGETS, repeated, spread_table

    def round_(ratio: float) -> dict[str, float]:
        return {"ratio_p50": ratio, "ratio_p99": 2.0, "freshness_p99_ms": 300.0, "ingest_events_per_s": 2e4}

    f = repeated([round_(1.9), round_(1.5), round_(1.7)])
    assert f["rounds"] == 3 and f["ratio_p50"] == 1.7, "the last round's figures"
    assert f["spread"]["ratio_p50"] == {"median": 1.7, "low": 1.5, "high": 1.9, "rounds": 3}
    text = spread_table(f)
    assert "1.70x (range 1.50-1.90, 3 rounds)   target <= 1.3x" in text
    assert len(text.splitlines()) == 1 + len(TARGETS)


def test_a_spread_survives_its_json_form() -> None:
    from recmesh.tools.bench.repeat import Spread

    s = spread([1.0, 2.0, 4.0])
    assert Spread.of(s.as_dict()) == s
