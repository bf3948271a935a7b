"""The trainers' scatter adds what np.add.at adds."""

from __future__ import annotations

import numpy as np

from recmesh.scatter import Scatter


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
