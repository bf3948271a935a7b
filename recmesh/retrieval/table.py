"""A sparse item-to-item table: for each item its strongest neighbours and weights.

Stored as CSR arrays (row = item, columns = neighbour rows) so a ranker maps it
with a few NumPy arrays: 100,000 items x 200 neighbours is 160 MB
(int32 + float32 per entry) plus the ids. A user's scores are the weighted
sum of the rows of their history items (`score`): item-kNN and EASE both
score this way (EASE's B matrix cut to its strongest entries per row).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]
I32 = npt.NDArray[np.int32]


@dataclass
class NeighbourTable:
    item_ids: list[str]
    indptr: npt.NDArray[np.int64]  # len(item_ids) + 1
    indices: I32  # neighbour rows
    weights: F32
    row_of: dict[str, int] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not self.row_of:
            self.row_of = {iid: n for n, iid in enumerate(self.item_ids)}

    def __len__(self) -> int:
        return len(self.item_ids)

    @property
    def nbytes(self) -> int:
        return int(self.indptr.nbytes + self.indices.nbytes + self.weights.nbytes)

    @classmethod
    def from_dense(cls, item_ids: Sequence[str], matrix: F32, keep: int) -> NeighbourTable:
        """The `keep` largest positive entries of each row of a square matrix
        (the diagonal is never a neighbour)."""
        n = len(item_ids)
        m = np.array(matrix, dtype=np.float32, copy=True)
        np.fill_diagonal(m, 0.0)
        keep = max(1, min(keep, n - 1)) if n > 1 else 1
        indptr = np.zeros(n + 1, dtype=np.int64)
        cols: list[I32] = []
        vals: list[F32] = []
        for start in range(0, n, 2048):  # in blocks: argpartition of a full 100k x 100k would not fit
            block = m[start : start + 2048]
            part = (
                np.argpartition(-block, keep - 1, axis=1)[:, :keep]
                if n > 1
                else np.zeros((len(block), 0), int)
            )
            for r, row_cols in enumerate(part):
                w = block[r, row_cols]
                ok = w > 0
                order = np.argsort(-w[ok], kind="stable")
                cols.append(row_cols[ok][order].astype(np.int32))
                vals.append(w[ok][order].astype(np.float32))
                indptr[start + r + 1] = indptr[start + r] + int(ok.sum())
        return cls(
            list(item_ids),
            indptr,
            np.concatenate(cols) if cols else np.zeros(0, np.int32),
            np.concatenate(vals) if vals else np.zeros(0, np.float32),
        )

    @classmethod
    def from_pairs(cls, rows: dict[str, list[tuple[str, float]]], keep: int) -> NeighbourTable:
        """From item -> [(neighbour, weight)] (a team's similar-items table); every
        id on either side becomes a row, each row keeps its `keep` best."""
        ids = sorted({i for i in rows} | {j for row in rows.values() for j, _ in row})
        row_of = {iid: n for n, iid in enumerate(ids)}
        indptr = np.zeros(len(ids) + 1, dtype=np.int64)
        cols: list[int] = []
        vals: list[float] = []
        for n, iid in enumerate(ids):
            best = sorted(
                ((w, j) for j, w in rows.get(iid, ()) if j != iid and w > 0), key=lambda x: (-x[0], x[1])
            )
            for w, j in best[:keep]:
                cols.append(row_of[j])
                vals.append(w)
            indptr[n + 1] = len(cols)
        return cls(ids, indptr, np.asarray(cols, np.int32), np.asarray(vals, np.float32), row_of)

    def row(self, item_id: str) -> list[tuple[str, float]]:
        n = self.row_of.get(item_id)
        if n is None:
            return []
        lo, hi = int(self.indptr[n]), int(self.indptr[n + 1])
        return [
            (self.item_ids[int(c)], float(w))
            for c, w in zip(self.indices[lo:hi], self.weights[lo:hi], strict=True)
        ]

    def scores(self, seeds: Sequence[str], seed_weights: Sequence[float]) -> tuple[I32, F32]:
        """(rows, summed weights) of every item some seed points at; unknown seeds count nothing."""
        parts_c: list[I32] = []
        parts_w: list[F32] = []
        for seed, sw in zip(seeds, seed_weights, strict=True):
            n = self.row_of.get(seed)
            if n is None or sw == 0.0:
                continue
            lo, hi = int(self.indptr[n]), int(self.indptr[n + 1])
            parts_c.append(self.indices[lo:hi])
            parts_w.append(self.weights[lo:hi] * np.float32(sw))
        if not parts_c:
            return np.zeros(0, np.int32), np.zeros(0, np.float32)
        cols = np.concatenate(parts_c)
        uniq, inverse = np.unique(cols, return_inverse=True)
        total = np.bincount(inverse, weights=np.concatenate(parts_w)).astype(np.float32)
        return uniq.astype(np.int32), total

    def top(
        self,
        seeds: Sequence[str],
        seed_weights: Sequence[float],
        k: int,
        exclude: frozenset[str] = frozenset(),
    ) -> list[tuple[str, float]]:
        """The k best items for these seeds, best first (ties by item id); seeds and
        `exclude` are never returned."""
        rows, total = self.scores(seeds, seed_weights)
        if not len(rows):
            return []
        skip = [self.row_of[s] for s in (*seeds, *exclude) if s in self.row_of]
        if skip:
            keep = ~np.isin(rows, np.asarray(skip, np.int32))
            rows, total = rows[keep], total[keep]
        ids = self.item_ids
        if len(rows) > k:
            part = np.argpartition(-total, k - 1)[:k]
            rows, total = rows[part], total[part]
        order = sorted(range(len(rows)), key=lambda n: (-float(total[n]), ids[int(rows[n])]))
        return [(ids[int(rows[n])], float(total[n])) for n in order]

    def save(self, path: Path) -> None:
        np.savez(
            path,
            item_ids=np.asarray(self.item_ids, dtype=object).astype(str),
            indptr=self.indptr,
            indices=self.indices,
            weights=self.weights,
        )

    @classmethod
    def load(cls, path: Path) -> NeighbourTable:
        with np.load(path, allow_pickle=False) as z:
            ids = [str(s) for s in z["item_ids"]]
            indptr, indices, weights = z["indptr"], z["indices"], z["weights"]
        n = len(ids)
        if len(indptr) != n + 1 or len(indices) != len(weights) or (len(indices) and int(indices.max()) >= n):
            raise ValueError(f"{path}: not a consistent neighbour table")
        return cls(ids, indptr.astype(np.int64), indices.astype(np.int32), weights.astype(np.float32))


def recency_weights(n: int, decay: float) -> list[float]:
    """Seed weights for a history newest first: decay ** position."""
    return [decay**p for p in range(n)]
