"""recmesh.stats.percentile: nearest rank, checked with plain values."""

from __future__ import annotations

import math
import random

from recmesh.stats import percentile

HUNDRED = [float(i) for i in range(1, 101)]


def test_nearest_rank_of_one_to_a_hundred() -> None:
    assert percentile(HUNDRED, 50) == 50.0
    assert percentile(HUNDRED, 95) == 95.0
    assert percentile(HUNDRED, 99) == 99.0
    assert percentile(HUNDRED, 99.5) == 100.0, "rank 99.5 rounds up"
    assert percentile(HUNDRED, 100) == 100.0
    assert percentile(HUNDRED, 0) == 1.0


def test_always_an_observed_sample_never_between_two() -> None:
    assert percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.0
    assert percentile([10.0, 20.0, 30.0, 40.0], 95) == 40.0
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0], 99) == 10.0
    assert percentile([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0], 7) == 1.0, "7 % of 10 is rank 1"
    assert percentile([7.0], 1) == 7.0 and percentile([7.0], 99) == 7.0


def test_unsorted_input_and_an_ordered_one_agree() -> None:
    shuffled = HUNDRED[:]
    random.Random(3).shuffle(shuffled)
    for p in (0, 1, 25, 50, 90, 95, 99, 100):
        assert percentile(shuffled, p) == percentile(HUNDRED, p, ordered=True)
    assert shuffled != HUNDRED, "the caller's samples are not sorted in place"


def test_no_samples_is_nan() -> None:
    assert math.isnan(percentile([], 50))
