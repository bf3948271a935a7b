from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from recmesh.vectors import load_item_vectors, save_item_vectors


def test_round_trip_normalises_rows(tmp_path: Path) -> None:
    assert load_item_vectors(tmp_path) is None
    matrix = np.array([[3.0, 4.0], [0.0, 2.0]], dtype=np.float32)
    save_item_vectors(tmp_path, ["i1", "i2"], matrix, {"model": "test"})
    loaded = load_item_vectors(tmp_path)
    assert loaded is not None
    assert loaded.item_ids == ["i1", "i2"]
    assert loaded.dim == 2
    assert loaded.card == {"model": "test", "dim": 2}
    np.testing.assert_allclose(loaded.matrix, [[0.6, 0.8], [0.0, 1.0]], rtol=1e-6)


def test_replacing_leaves_no_temporary_folders(tmp_path: Path) -> None:
    save_item_vectors(tmp_path, ["a"], np.ones((1, 3), dtype=np.float32), {})
    save_item_vectors(tmp_path, ["b", "c"], np.ones((2, 3), dtype=np.float32), {})
    loaded = load_item_vectors(tmp_path)
    assert loaded is not None and loaded.item_ids == ["b", "c"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["item_vectors"]


def test_shape_mismatch_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not match"):
        save_item_vectors(tmp_path, ["a", "b"], np.ones((1, 3), dtype=np.float32), {})
