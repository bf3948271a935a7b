"""Embedding similarity through an approximate-nearest-neighbour index (faiss HNSW).

The item vectors come from `recmesh.vectors` (MODEL_DIR/item_vectors/, written
by the embedding step); rows are L2-normalised, so inner product is cosine
similarity. The intent vector of a request is the mean of the vectors of the
items the user viewed last (and, when the caller sends one, of the embedded
query text); its norm before re-normalising is the intent's coherence. Without
vectors there is no index and the semantic source is simply absent (sigma = 0).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import faiss
import numpy as np
import numpy.typing as npt
import structlog

from recmesh.vectors import DIR_NAME, RELOAD_CHECK_S, ItemVectors, load_item_vectors
from services.ranker.reload import ReloadOnChange

_log = structlog.get_logger("recmesh.ranker.semantic")

# HNSW graph degree and search breadth: recall@50 above 0.95 on the demo catalog.
HNSW_M = 32
EF_SEARCH = 128
EF_CONSTRUCTION = 80


@dataclass(frozen=True)
class Intent:
    vector: npt.NDArray[np.float32]  # unit length
    coherence: float  # norm of the mean of the unit vectors behind it


class SemanticIndex:
    def __init__(self, vectors: ItemVectors) -> None:
        faiss.omp_set_num_threads(1)  # one request's search must not take every core
        self.card = vectors.card
        self.dim = vectors.dim
        self._ids = vectors.item_ids
        self._row = {iid: n for n, iid in enumerate(vectors.item_ids)}
        self._matrix = vectors.matrix
        index = faiss.IndexHNSWFlat(self.dim, HNSW_M, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = EF_CONSTRUCTION
        index.add(np.ascontiguousarray(vectors.matrix, dtype=np.float32))
        index.hnsw.efSearch = EF_SEARCH
        self._index = index

    def __len__(self) -> int:
        return len(self._ids)

    def intent(self, item_ids: Sequence[str], extra: Sequence[npt.NDArray[np.float32]] = ()) -> Intent | None:
        """Mean of the known items' vectors (and any extra unit vectors), or None."""
        rows = [self._matrix[self._row[i]] for i in item_ids if i in self._row]
        rows.extend(v for v in extra if v.shape == (self.dim,))
        if not rows:
            return None
        mean = np.mean(np.stack(rows), axis=0)
        norm = float(np.linalg.norm(mean))
        if norm < 1e-9:
            return None
        return Intent((mean / norm).astype(np.float32), norm)

    def search(self, vector: npt.NDArray[np.float32], k: int) -> list[tuple[str, float]]:
        """Up to k (item, cosine similarity) pairs, most similar first."""
        sims, rows = self._index.search(vector.reshape(1, -1), min(k, len(self._ids)))
        ids = self._ids
        # as Python numbers first: stepping through NumPy arrays makes a scalar object per element
        return [(ids[r], s) for s, r in zip(sims[0].tolist(), rows[0].tolist(), strict=True) if r >= 0]


class IndexHolder(ReloadOnChange):
    """The current index, rebuilt when the vectors on disk change (checked at
    most every `check_every_s`; a reader never sees a half-built index)."""

    def __init__(self, model_dir: Path, check_every_s: float = RELOAD_CHECK_S) -> None:
        super().__init__(check_every_s)
        self._model_dir = model_dir
        self.index: SemanticIndex | None = None

    def _disk_stamp(self) -> float | None:
        try:
            return os.stat(self._model_dir / DIR_NAME / "card.json").st_mtime
        except OSError:
            return None

    def _load(self) -> bool:
        try:
            vectors = load_item_vectors(self._model_dir)
        except (OSError, ValueError) as err:
            _log.warning("item_vectors_unreadable", error=repr(err))
            return False
        self.index = None if vectors is None else SemanticIndex(vectors)
        _log.info("semantic_index", items=0 if self.index is None else len(self.index),
                  model=None if vectors is None else vectors.card.get("model"))  # fmt: skip
        return True
