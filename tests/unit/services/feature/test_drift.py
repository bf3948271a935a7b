"""State growth in %/min from size samples (services/feature/drift.py), with values."""

from __future__ import annotations

from typing import cast

import pytest

from recmesh.features import keys
from recmesh.features.keys import state_families, state_family
from recmesh.features.repository import FeatureSet
from recmesh.redis_client import AnyRedis
from services.feature.drift import StateSizer, growth_pct_per_min


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


def test_state_families_come_from_the_key_layout(demo_feature_set: FeatureSet) -> None:
    families = state_families(demo_feature_set)
    # One family per stream of the repository, plus event ids, co-visitation counts
    # and the users' histories (learnt retrieval's seeds).
    assert set(families) == {
        "user:s:click", "user:s:click+view@last", "item:s:click", "item:s:view",
        "user:ids", "item:covisits", "user:history",
    }  # fmt: skip
    assert state_family(keys.stream("user", "42", "click"), families) == "user:s:click"
    assert state_family(keys.stream("user", "42", "click+view@last"), families) == "user:s:click+view@last"
    assert state_family(keys.stream("item", "i:7", "click"), families) == "item:s:click"
    assert state_family(keys.stream("item", "7", "view"), families) == "item:s:view"
    assert state_family(keys.user_ids("42"), families) == "user:ids"
    assert state_family(keys.item_covisits("7"), families) == "item:covisits"
    assert state_family(keys.user_history("42"), families) == "user:history"
    assert state_family(keys.item_static("7"), families) is None
    assert state_family(keys.user_profile("42"), families) is None
    assert state_family(keys.newest("user", "42"), families) is None  # an index, not state
    assert state_family("{catalog}:popularity", families) is None
    assert state_family(keys.stream("user", "42", "purchase"), families) is None  # no such stream


def test_sizer_publishes_growth_per_family(demo_feature_set: FeatureSet) -> None:
    sizer = StateSizer(cast(AnyRedis, object()), demo_feature_set)  # publish() never touches Redis
    assert set(sizer.history) == set(state_families(demo_feature_set))
    sizes = dict.fromkeys(sizer.history, (1, 10_000))
    assert set(sizer.publish(sizes, 0.0).values()) == {0.0}
    sizes["user:s:click"] = (2, 12_500)
    growth = sizer.publish(sizes, 60.0)
    assert growth["user:s:click"] == pytest.approx(25.0) and growth["item:s:view"] == 0.0
    assert sizer.passes == 2
