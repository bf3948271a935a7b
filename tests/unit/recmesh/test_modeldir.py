"""CURRENT is pointed at a version only when the version is there, and atomically."""

from __future__ import annotations

from pathlib import Path

import pytest

from recmesh.modeldir import MODEL_NAME, current_model, point_current, variant_file


def test_point_current_names_a_version_that_is_there(tmp_path: Path) -> None:
    version = tmp_path / MODEL_NAME / "v2"
    version.mkdir(parents=True)
    (version / "card.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="holds no model version"):
        point_current(tmp_path, "v2")  # no model file yet
    assert current_model(tmp_path) is None
    (version / variant_file(0)).write_bytes(b"")
    assert point_current(tmp_path, "v2") == version
    assert current_model(tmp_path) == version
    assert (tmp_path / MODEL_NAME / "CURRENT").read_text() == "v2\n"
    assert sorted(p.name for p in (tmp_path / MODEL_NAME).iterdir()) == ["CURRENT", "v2"], "no temp file left"
    with pytest.raises(FileNotFoundError):
        point_current(tmp_path, "v3")
    assert current_model(tmp_path) == version
