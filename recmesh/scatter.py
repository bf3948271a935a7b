"""Rows of a batch added into rows of a table, as np.add.at adds them but
sorted once and summed per index first: the embedding gradients' scatter,
shared by the trainers (the CTR family, the sequence model)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]

# Once no more than this many indices have entries left, each is summed on its
# own (np.cumsum: a few popular items) instead of a round per entry.
TAIL_INDICES = 8


@dataclass(frozen=True)
class Scatter:
    """Rows of a batch added into rows of a table: target[index[i]] += weight[i] *
    values[row[i]]. Each index's entries are summed first, in their order, as
    np.add.at adds them into zeros (bit for bit), then added to the table once:
    ~3x faster than np.add.at, which is unbuffered, and ~3x faster than
    np.add.reduceat along rows (which also sums in another order)."""

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
        target[self.index] += segment_sums(picked, self.starts)


def segment_sums(picked: npt.NDArray[Any], starts: npt.NDArray[np.int64]) -> npt.NDArray[Any]:
    """The rows of each segment (picked[starts[i]:starts[i + 1]]) summed in
    order, ((p0 + p1) + p2) + ..., one row per segment. Vectorised across
    segments: round k adds every segment's k-th row to the segments longer
    than k (the segments sorted longest first, so that is a prefix)."""
    lengths = np.diff(np.r_[starts, len(picked)])
    longest = np.argsort(-lengths, kind="stable")
    first, length = starts[longest], lengths[longest]
    out = picked[first]
    # how many segments have more than k rows, k = 1, 2, ...: rounds while more than TAIL_INDICES do
    longer = np.searchsorted(-length, -np.arange(1, int(length.max(initial=1))), side="left")
    rounds = 1 + int(np.searchsorted(-longer, -TAIL_INDICES, side="left"))
    for k, count in enumerate(longer[: rounds - 1].tolist(), 1):
        out[:count] += picked[first[:count] + k]
    for i in np.flatnonzero(length > rounds).tolist():
        rest = picked[first[i] + rounds : first[i] + length[i]]
        out[i] = np.cumsum(np.concatenate([out[i : i + 1], rest]), axis=0)[-1]  # cumsum adds in order
    sums = np.empty_like(out)
    sums[longest] = out
    return sums
