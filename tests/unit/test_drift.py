"""State growth in %/min from size samples (services/feature/drift.py), with values."""

from __future__ import annotations

import pytest

from recmesh.features.keys import (
    item_clicks,
    item_covisits,
    item_static,
    state_family,
    user_covisit_marks,
    user_events,
    user_viewed,
)
from services.feature.drift import growth_pct_per_min


def test_growth_over_one_minute() -> None:
    assert growth_pct_per_min([(0.0, 10_000), (60.0, 12_500)]) == pytest.approx(25.0)
    assert growth_pct_per_min([(0.0, 10_000), (30.0, 10_000), (60.0, 10_800)]) == pytest.approx(8.0)


def test_rate_is_per_minute_whatever_the_span() -> None:
    # +10 % in 30 s is 20 %/min; a history shorter than the window uses its oldest sample.
    assert growth_pct_per_min([(100.0, 50_000), (130.0, 55_000)]) == pytest.approx(20.0)


def test_compares_with_the_newest_sample_a_window_old() -> None:
    samples = [(0.0, 100_000), (60.0, 100_000), (90.0, 110_000), (120.0, 130_000)]
    assert growth_pct_per_min(samples, window_s=60) == pytest.approx(30.0)


def test_shrinking_state_is_negative_and_small_states_use_the_floor() -> None:
    assert growth_pct_per_min([(0.0, 20_000), (60.0, 15_000)]) == pytest.approx(-25.0)
    assert growth_pct_per_min([(0.0, 10), (60.0, 110)], floor=1000) == pytest.approx(10.0)


def test_no_growth_without_two_samples_or_elapsed_time() -> None:
    assert growth_pct_per_min([]) == 0.0
    assert growth_pct_per_min([(5.0, 100)]) == 0.0
    assert growth_pct_per_min([(5.0, 100), (5.0, 900)]) == 0.0


def test_state_families_come_from_the_key_layout() -> None:
    assert state_family(user_events("42")) == "user_events"
    assert state_family(user_viewed("42")) == "user_viewed"
    assert state_family(item_clicks("i:7")) == "item_clicks"
    assert state_family(item_covisits("7")) == "item_covisits"
    assert state_family(user_covisit_marks("42")) == "user_covisit_marks"
    assert state_family(item_static("7")) is None
    assert state_family("{catalog}:popularity") is None
