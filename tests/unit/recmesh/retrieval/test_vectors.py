"""A team's item and user vectors: reading them, and a user's query vector."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from recmesh.errors import InvalidArgument
from recmesh.retrieval.vectors import TwoTower, read_vectors


def test_json_lines_and_npz_read_alike(tmp_path: Path) -> None:
    (tmp_path / "items.jsonl").write_text(
        '{"item_id": "a", "vector": [1, 0]}\n{"item_id": "b", "vector": [0, 1]}\n'
    )
    np.savez(tmp_path / "items.npz", ids=np.array(["a", "b"]), vectors=np.eye(2, dtype=np.float32))
    for name in ("items.jsonl", "items.npz"):
        ids, m = read_vectors(tmp_path / name, "item_id")
        assert ids == ["a", "b"] and m.tolist() == [[1.0, 0.0], [0.0, 1.0]]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '{"item_id": "a", "vector": [1, 0]}\n{"item_id": "b", "vector": [1]}\n',
            r":2: a vector of 1 numbers",
        ),
        ('{"id": "a", "vector": [1]}\n', r':1: want \{"item_id", "vector"'),
        ("not json\n", r":1: want"),
        ("\n", "no vectors"),
    ],
)
def test_a_bad_vector_file_names_the_line(tmp_path: Path, text: str, message: str) -> None:
    (tmp_path / "v.jsonl").write_text(text)
    with pytest.raises(InvalidArgument, match=message):
        read_vectors(tmp_path / "v.jsonl", "item_id")


def test_a_user_without_a_vector_is_the_mean_of_their_history(tmp_path: Path) -> None:
    tt = TwoTower(["a", "b"], np.eye(2, dtype=np.float32), ["u1"], np.array([[0.5, 0.5]], np.float32))
    assert (q := tt.query("u1", [])) is not None and q.tolist() == [0.5, 0.5]
    assert (q := tt.query("u2", ["a", "b", "zzz"])) is not None and q.tolist() == [0.5, 0.5]
    assert tt.query("u2", ["zzz"]) is None
    tt.save(tmp_path / "v.npz")
    back = TwoTower.load(tmp_path / "v.npz")
    assert back.item_ids == ["a", "b"] and back.user_ids == ["u1"]
