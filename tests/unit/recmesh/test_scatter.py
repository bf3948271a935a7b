"""The trainers' scatter adds what np.add.at adds."""

from __future__ import annotations

import numpy as np
import pytest

from recmesh import scatter
from recmesh.scatter import Scatter, segment_sums


def test_the_scatter_adds_what_np_add_at_adds() -> None:
    rng = np.random.default_rng(4)
    n, width, table = 700, 24, 50
    values = rng.standard_normal((n, width)).astype(np.float32)
    index = rng.integers(0, table, 3 * n)
    index[::5] = 0  # a crowded index, as absent history positions once were
    rows = rng.integers(0, n, 3 * n)
    weights = rng.random(3 * n).astype(np.float32)
    start = rng.standard_normal((table, 2 * width)).astype(np.float32)
    for w in (None, weights):
        want, got = start.copy(), start.copy()
        np.add.at(want[:, :width], index, values[rows] * (1.0 if w is None else w[:, None]))
        Scatter.of(index, rows, w).add(got[:, :width], values)
        assert np.allclose(got, want, rtol=1e-5, atol=1e-5)
        assert np.array_equal(got[:, width:], start[:, width:])  # only the view's columns
        untouched = np.setdiff1d(np.arange(table), index)
        assert np.array_equal(got[untouched], start[untouched])
    empty = start.copy()
    Scatter.of(np.zeros(0, np.int64), np.zeros(0, np.int64)).add(empty, values)
    assert np.array_equal(empty, start)


def test_into_zeros_the_sums_are_np_add_ats_bit_for_bit(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each index's entries are summed in their order, as np.add.at adds them:
    popular indices (past the vectorised rounds, summed on their own) and rare
    ones alike, weighted or not, whatever the tail's size."""
    rng = np.random.default_rng(1)
    for trial in range(120):
        n, width, table = int(rng.integers(1, 300)), int(rng.integers(1, 40)), int(rng.integers(1, 60))
        m = int(rng.integers(0, 1500))
        values = rng.standard_normal((n, width)).astype(np.float32)
        index = rng.choice(table, m, p=rng.dirichlet(np.full(table, 0.2)))  # a few indices crowded
        rows, weights = rng.integers(0, n, m), rng.random(m).astype(np.float32)
        for w in (None, weights):
            want = np.zeros((table, width), np.float32)
            np.add.at(want, index, values[rows] * (1.0 if w is None else w[:, None]))
            for tail in (0, 1, 8, 10_000):
                monkeypatch.setattr(scatter, "TAIL_INDICES", tail)
                got = np.zeros((table, width), np.float32)
                Scatter.of(index, rows, w).add(got, values)
                assert got.tobytes() == want.tobytes(), (trial, tail)


def test_segment_sums_add_in_order() -> None:
    # float32 sums whose value depends on the order: 1e8 + 1 + 1 ... = 1e8, but 1 + 1 + ... + 1e8 is not
    picked = np.array([[1e8], [1.0], [1.0], [1.0], [1.0], [2.0], [1.0], [1e8]], np.float32)
    starts = np.array([0, 5, 6])
    assert segment_sums(picked, starts).ravel().tolist() == [1e8, 2.0, np.float32(1.0) + np.float32(1e8)]
    ones_first = np.array([[1.0]] * 8 + [[1e8]], np.float32)
    assert segment_sums(ones_first, np.array([0])).ravel().tolist() == [np.float32(8.0) + np.float32(1e8)]
