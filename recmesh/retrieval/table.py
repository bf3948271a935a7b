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
from typing import Protocol

import numpy as np
import numpy.typing as npt

F32 = npt.NDArray[np.float32]
I32 = npt.NDArray[np.int32]


class RecallTable(Protocol):
    """What a learnt source serves from: a NeighbourTable, or the sequence model
    (recmesh.retrieval.sequence), scored from a user's seeds the same way."""

    item_ids: list[str]
    row_of: dict[str, int]

    def __len__(self) -> int: ...

    @property
    def nbytes(self) -> int: ...

    @property
    def entries(self) -> int: ...

    def top(
        self, seeds: Sequence[str], seed_weights: Sequence[float], k: int, exclude: frozenset[str] = ...
    ) -> list[tuple[str, float]]: ...

    def save(self, path: Path) -> None: ...


@dataclass
class NeighbourTable:
    item_ids: list[str]
    indptr: npt.NDArray[np.int64]  # len(item_ids) + 1
    indices: I32  # neighbour rows
    weights: F32
    row_of: dict[str, int] = field(default_factory=dict, compare=False, repr=False)
    # each row's rank in item-id order: ties break by id without comparing strings
    id_rank: npt.NDArray[np.int64] = field(
        default_factory=lambda: np.zeros(0, np.int64), compare=False, repr=False
    )

    def __post_init__(self) -> None:
        if not self.row_of:
            self.row_of = {iid: n for n, iid in enumerate(self.item_ids)}
        self.id_rank = id_ranks(self.item_ids)

    def __len__(self) -> int:
        return len(self.item_ids)

    @property
    def nbytes(self) -> int:
        return int(self.indptr.nbytes + self.indices.nbytes + self.weights.nbytes)

    @property
    def entries(self) -> int:
        return len(self.indices)

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
        pairs = [(self.row_of.get(seed), w) for seed, w in zip(seeds, seed_weights, strict=True)]
        known = [(r, w) for r, w in pairs if r is not None and w != 0.0]
        if not known:
            return np.zeros(0, np.int32), np.zeros(0, np.float32)
        seed_rows = np.fromiter((r for r, _ in known), np.int64, len(known))
        starts, ends = self.indptr[seed_rows], self.indptr[seed_rows + 1]
        lengths = ends - starts
        if not lengths.sum():
            return np.zeros(0, np.int32), np.zeros(0, np.float32)
        # every entry of every seed row, in one gather: start of its row + its offset in it
        offsets = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        entries = np.repeat(starts, lengths) + offsets
        cols = self.indices[entries]
        seed_w = np.fromiter((w for _, w in known), np.float32, len(known))
        weights = self.weights[entries] * np.repeat(seed_w, lengths)
        # A dense sum over the catalog (tens of microseconds even at 100,000 items)
        # is cheaper than sorting the entries to group them.
        dense = np.bincount(cols, weights=weights, minlength=len(self.item_ids))
        touched = np.zeros(len(self.item_ids), bool)
        touched[cols] = True
        rows = np.flatnonzero(touched)
        return rows.astype(np.int32), dense[rows].astype(np.float32)

    def top(
        self,
        seeds: Sequence[str],
        seed_weights: Sequence[float],
        k: int,
        exclude: frozenset[str] = frozenset(),
    ) -> list[tuple[str, float]]:
        """The k best items for these seeds, best first (ties by item id); `exclude`
        is never returned (the seeds are, when not in it: an item viewed and not
        bought may be recommended where the repository says so, `recall.seen`)."""
        rows, total = self.scores(seeds, seed_weights)
        return best(self.item_ids, self.id_rank, self.row_of, rows, total, k, exclude)

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


def id_ranks(item_ids: Sequence[str]) -> npt.NDArray[np.int64]:
    """Each row's rank in item-id order: ties break by id without comparing strings."""
    rank = np.empty(len(item_ids), np.int64)
    rank[np.argsort(np.asarray(item_ids, dtype=object), kind="stable")] = np.arange(len(item_ids))
    return rank


def best(
    item_ids: Sequence[str],
    id_rank: npt.NDArray[np.int64],
    row_of: dict[str, int],
    rows: npt.NDArray[np.integer],
    total: npt.NDArray[np.floating],
    k: int,
    exclude: frozenset[str],
) -> list[tuple[str, float]]:
    """The k best of scored rows (`rows`, `total`), best first, ties by item id,
    none of `exclude`: how every learnt source answers (RecallTable.top)."""
    if not len(rows) or k <= 0:
        return []
    skip = [row_of[s] for s in exclude if s in row_of]
    if skip:
        blocked = np.zeros(len(item_ids), bool)
        blocked[skip] = True
        keep = ~blocked[rows]
        rows, total = rows[keep], total[keep]
    if len(rows) > k:
        part = np.argpartition(-total, k - 1)[:k]
        rows, total = rows[part], total[part]
    order = np.lexsort((id_rank[rows], -total))
    return [(item_ids[r], s) for r, s in zip(rows[order].tolist(), total[order].tolist(), strict=True)]


def recency_weights(n: int, decay: float) -> list[float]:
    """Seed weights for a history newest first: decay ** position."""
    return [decay**p for p in range(n)]
