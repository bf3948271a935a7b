"""Recall versions on disk: saved, current, switched, refused for another feature set."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from recmesh.errors import InvalidArgument
from recmesh.retrieval import files
from recmesh.retrieval.sequence import SequenceModel
from recmesh.retrieval.table import NeighbourTable


def _table() -> NeighbourTable:
    return NeighbourTable.from_pairs({"a": [("b", 1.0)]}, keep=5)


def test_save_makes_the_version_current_and_loads_back(tmp_path: Path) -> None:
    v = files.save(tmp_path, {"feature_set_version": "fs-1", "fusion": {"knn": 1.0}}, {"knn": _table()})
    assert files.current_version(tmp_path) == v
    loaded = files.load_current(tmp_path, "fs-1")
    assert loaded is not None and loaded.version == v
    knn = loaded.tables["knn"]
    assert isinstance(knn, NeighbourTable) and knn.row("a") == [("b", 1.0)]
    assert loaded.card["fusion"] == {"knn": 1.0}


def test_the_sequence_model_is_saved_and_read_back_as_its_own_kind(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    model = SequenceModel(["a", "b", "c"], rng.standard_normal((3, 4)).astype(np.float32),
                          rng.standard_normal((3, 4)).astype(np.float32), np.zeros(3, np.float32),
                          np.ones(2, np.float32))  # fmt: skip
    files.save(tmp_path, {"feature_set_version": "fs-1"}, {"knn": _table(), "sequence": model})
    loaded = files.load_current(tmp_path, "fs-1")
    assert loaded is not None
    back = loaded.tables["sequence"]
    assert isinstance(back, SequenceModel) and back.same_as(model)
    assert back.top(["a"], [1.0], 2) == model.top(["a"], [1.0], 2)


def test_no_version_is_none(tmp_path: Path) -> None:
    assert files.load_current(tmp_path, "fs-1") is None


def test_a_version_built_on_another_feature_set_is_refused_with_the_fix(tmp_path: Path) -> None:
    files.save(tmp_path, {"feature_set_version": "fs-old"}, {"knn": _table()})
    with pytest.raises(
        files.RecallMismatch, match=r"built on feature set fs-old.*serves fs-new.*recall build"
    ):
        files.load_current(tmp_path, "fs-new")


def test_activate_switches_and_checks(tmp_path: Path) -> None:
    v1 = files.save(tmp_path, {"feature_set_version": "fs-1", "n": 1}, {"knn": _table()})
    v2 = files.save(tmp_path, {"feature_set_version": "fs-2", "n": 2}, {"knn": _table()})
    assert files.current_version(tmp_path) == v2
    files.activate(tmp_path, v1, "fs-1")
    assert files.current_version(tmp_path) == v1
    with pytest.raises(files.RecallMismatch):
        files.activate(tmp_path, v2, "fs-1")
    with pytest.raises(InvalidArgument, match="no recall version 'nope'"):
        files.activate(tmp_path, "nope", "fs-1")
    assert files.list_versions(tmp_path) == sorted([v1, v2])
