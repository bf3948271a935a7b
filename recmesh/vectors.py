"""Item vectors on disk: the one format written by the embedding step and read
by the ranker's semantic recall.

Layout: MODEL_DIR/item_vectors/{vectors.npy, item_ids.txt, card.json}.
`vectors.npy` is float32, one L2-normalised row per item, in the order of
`item_ids.txt` (one id per line); `card.json` names the model that made them
and its dimension. The three files are written to a temporary folder and
renamed into place, so a reader never sees a half-written set.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

DIR_NAME = "item_vectors"
RELOAD_CHECK_S = 5.0  # how often a reader (the ranker) looks for new vectors


@dataclass(frozen=True)
class ItemVectors:
    item_ids: list[str]
    matrix: npt.NDArray[np.float32]  # (len(item_ids), dim), rows L2-normalised
    card: dict[str, Any]

    @property
    def dim(self) -> int:
        return int(self.matrix.shape[1])


def normalise(matrix: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    return np.asarray(matrix / np.maximum(norms, 1e-12), dtype=np.float32)


def save_item_vectors(
    model_dir: Path, item_ids: list[str], matrix: npt.NDArray[np.float32], card: dict[str, Any]
) -> Path:
    if matrix.ndim != 2 or matrix.shape[0] != len(item_ids):
        raise ValueError(f"matrix {matrix.shape} does not match {len(item_ids)} item ids")
    target = model_dir / DIR_NAME
    model_dir.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".item_vectors-", dir=model_dir))
    np.save(tmp / "vectors.npy", normalise(matrix.astype(np.float32)))
    (tmp / "item_ids.txt").write_text("\n".join(item_ids) + "\n")
    (tmp / "card.json").write_text(json.dumps({**card, "dim": int(matrix.shape[1])}, indent=2))
    old = model_dir / f".item_vectors-old-{os.getpid()}"
    if target.exists():
        target.rename(old)
    tmp.rename(target)
    shutil.rmtree(old, ignore_errors=True)
    return target


def load_item_vectors(model_dir: Path) -> ItemVectors | None:
    """The saved vectors, or None when none have been made yet."""
    target = model_dir / DIR_NAME
    if not (target / "vectors.npy").exists():
        return None
    matrix = np.load(target / "vectors.npy").astype(np.float32, copy=False)
    item_ids = (target / "item_ids.txt").read_text().split()
    card: dict[str, Any] = json.loads((target / "card.json").read_text())
    if matrix.shape[0] != len(item_ids):
        raise ValueError(f"{target}: {matrix.shape[0]} vectors for {len(item_ids)} ids")
    return ItemVectors(item_ids, matrix, card)
