"""Rows of a batch added into rows of a table, as np.add.at adds them but
sorted once and summed per index (np.add.reduceat): the embedding gradients'
scatter, shared by the trainers (the CTR family, the sequence model)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]


@dataclass(frozen=True)
class Scatter:
    """Rows of a batch added into rows of a table: target[index[i]] += weight[i] *
    values[row[i]], as np.add.at would, summed per index first (sorted once; ~3x
    faster than np.add.at, which is unbuffered, on the embeddings' gradients).
    The sums differ from np.add.at's in the last bits only (another order)."""

    rows: npt.NDArray[np.int64]  # the source row of each entry, entries sorted by index
    weights: F32 | None
    starts: npt.NDArray[np.int64]  # where each index's entries begin
    index: npt.NDArray[np.int64]  # the distinct indices, ascending

    @staticmethod
    def of(index: npt.NDArray[np.int64], rows: npt.NDArray[np.int64], weights: F32 | None = None) -> Scatter:
        order = np.argsort(index, kind="stable")
        ordered = index[order]
        starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]) if len(ordered) else order
        return Scatter(rows[order], None if weights is None else weights[order], starts, ordered[starts])

    def add(self, target: F32, values: npt.NDArray[np.floating[Any]]) -> None:
        if not len(self.rows):
            return
        picked = values[self.rows]
        if self.weights is not None:
            picked *= self.weights[:, None]
        target[self.index] += np.add.reduceat(picked, self.starts, axis=0)
