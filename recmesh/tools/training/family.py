"""The CTR model family with learnt embeddings, and its degradation variants.

One network over the columns of a model's declared inputs
(recmesh.features.vectorize.Transform), several exported sub-networks (the
design notes' graded circuit breaking; levels are cumulative, each cheaper
than the one before):

- level 0: every dense column, 128-dimensional embeddings, cross features;
- level 1: feature sampling -- half of the dense columns (the more predictive
  half on the training rows, by single-column AUC), the ID features (item id,
  item attribute, user intent) all kept;
- level 2: level 1 with embeddings cut to their first d dimensions, d the
  smallest of the trained prefixes (32, 16, 8) that loses at most 0.005 AUC
  against 128 on the last tenth of the training rows (choose_level2_dim):
  the size the data supports;
- level 3: level 1's dense columns without cross features (the learnt
  user x item dot products and the columns that read both sides: share,
  contains, match), at 8 dimensions.

Which columns play which part comes from the transforms' roles: `dense`
columns are standardised and feed the MLP; the `item_id` hash bucket picks a
row of an item-id embedding table; the `item_attr` one-hot (multi-hot)
columns average rows of an attribute table; together they are the item
vector v. The `intent` columns (a user's count_by distribution as shares)
weight a user-side table into the user-intent vector u. The `history` columns
(the hashed ids of the user's recent items, -1 past the end) average their
rows of the same item-id table into the history vector h, so an item is
scored by how close it lies to what the user just did (item-to-item, learnt:
this is the part that needs embedding dimensions). v feeds the MLP directly;
the cross features are <u, v> and <h, v>. A feature set without an intent, a
history or an item attribute simply has no such part.

Why one jointly trained network (matryoshka-style) rather than a separately
trained model per level: the loss of every training step is the sum of the
losses of the served configurations (level 0, level 1 at prefixes 128/32/16/8,
level 3), so the first d dimensions of every embedding are a usable embedding
on their own and the masked MLP works without the sampled-away columns. The
variants then share one set of weights: a ranker that mixes levels across
requests gets scores on one scale that order items alike; the "dimension by
load" switch is a slice of one table; and training costs one run. The price
is that level 0 shares capacity with its sub-networks; the model card and
`recmesh bench degrade` measure what each level costs in AUC.

Training is mini-batch Adam in NumPy, deterministic under a seed. A step
looks the embeddings up once, at the widest prefix its configurations use
(each slices it), and each configuration adds its gradient with respect to
the rows' item and history vectors into one buffer, scattered into the
tables once (`_gradients`).
"""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeGuard

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

from recmesh.features.vectorize import Transform
from recmesh.heap import read_runs
from recmesh.scatter import Scatter

F32 = npt.NDArray[np.float32]

EMBEDDING_DIM = 128
# Level 1's trained embedding prefixes: level 2 serves the smallest that loses
# at most LEVEL2_TOLERANCE of AUC (choose_level2_dim); level 3 the smallest.
PREFIX_DIMS = (128, 32, 16, 8)
LEVEL3_DIM = 8
LEVEL2_TOLERANCE = 0.005


@dataclass(frozen=True)
class Layout:
    """Where each part of the family reads from a model input row."""

    columns: tuple[str, ...]
    dense: tuple[str, ...]
    cross_dense: tuple[str, ...]  # dense columns built from both sides (dropped at level 3)
    id_col: int | None
    buckets: int
    attr_cols: tuple[int, ...]
    intent_cols: tuple[int, ...]
    history_cols: tuple[int, ...] = ()

    @classmethod
    def of(cls, transforms: Sequence[Transform]) -> Layout:
        columns: list[str] = []
        dense: list[str] = []
        cross: list[str] = []
        id_col: int | None = None
        buckets = 1
        attr: list[int] = []
        intent: list[int] = []
        history: list[int] = []
        for t in transforms:
            start = len(columns)
            columns.extend(t.columns)
            span = list(range(start, len(columns)))
            if t.role == "item_id":
                id_col, buckets = start, t.buckets
            elif t.role == "item_attr":
                attr.extend(span)
            elif t.role == "intent":
                intent.extend(span)
            elif t.role == "history":
                history.extend(span)
            else:
                dense.extend(t.columns)
                if t.cross:
                    cross.extend(t.columns)
        return cls(
            tuple(columns),
            tuple(dense),
            tuple(cross),
            id_col,
            buckets,
            tuple(attr),
            tuple(intent),
            tuple(history),
        )

    @property
    def dense_idx(self) -> list[int]:
        return [self.columns.index(c) for c in self.dense]

    @property
    def has_intent(self) -> bool:
        return bool(self.intent_cols) and (self.id_col is not None or bool(self.attr_cols))

    @property
    def has_history(self) -> bool:
        return bool(self.history_cols) and self.id_col is not None

    @property
    def has_cross(self) -> bool:
        return self.has_intent or self.has_history


@dataclass(frozen=True)
class Variant:
    """One exported sub-network: which dense columns it reads, how many
    embedding dimensions, whether it computes cross features."""

    level: int
    dense: tuple[str, ...]
    dim: int
    cross: bool

    def describe(self, layout: Layout) -> str:
        return f"{len(self.dense)}/{len(layout.dense)} dense columns, {self.dim}-d embeddings, " + (
            "cross features" if self.cross else "no cross features"
        )


def make_variants(layout: Layout, level1_dense: Sequence[str], level2_dim: int = 32) -> tuple[Variant, ...]:
    """The served levels; `level2_dim` is one of PREFIX_DIMS (choose_level2_dim)."""
    l1 = tuple(c for c in layout.dense if c in set(level1_dense))
    cross = layout.has_cross
    return (
        Variant(0, layout.dense, EMBEDDING_DIM, cross),
        Variant(1, l1, EMBEDDING_DIM, cross),
        Variant(2, l1, level2_dim, cross),
        Variant(3, tuple(c for c in l1 if c not in layout.cross_dense), LEVEL3_DIM, False),
    )


def trained_configs(variants: Sequence[Variant]) -> tuple[Variant, ...]:
    """The configurations whose losses are summed in training: level 0, level 1
    at every prefix of PREFIX_DIMS (so each is a usable embedding and level 2
    can take any of them), level 3."""
    l1 = variants[1]
    return (variants[0], *(Variant(1 if d == l1.dim else 2, l1.dense, d, l1.cross) for d in PREFIX_DIMS),
            variants[3])  # fmt: skip


def choose_level2_dim(auc_by_dim: Mapping[int, float], tolerance: float = LEVEL2_TOLERANCE) -> int:
    """The smallest prefix whose AUC is within `tolerance` of the full
    embedding's: what the data supports. Embeddings trained nested put what
    they learn into the smallest trained prefixes first, so on data that
    supports 16 dimensions, 128, 32 and 16 score alike and 8 falls off; level
    2 then serves 16 (an 8x smaller table for the same AUC), and level 3's
    8 costs what the figures say."""
    full = auc_by_dim[max(auc_by_dim)]
    fits = [d for d, a in auc_by_dim.items() if a >= full - tolerance]  # none when AUC is undefined
    return min(fits) if fits else max(auc_by_dim)


def offline_only(layout: Layout, realtime_columns: set[str]) -> Variant:
    """The same family without real-time inputs (the offline-only baseline)."""
    return Variant(0, tuple(c for c in layout.dense if c not in realtime_columns), 128, False)


# Rows read at a time where a pass over the rows needs no more than one row's
# result (moments; predictions, PREDICT_ROWS: a row's history embeddings are
# 20 x 128 floats while scored): the rows may be a file mapped in, not memory.
CHUNK_ROWS = 65_536
PREDICT_ROWS = 4096
# Single-column AUCs (pick_level1) are measured on at most this many training
# rows, evenly spaced: every row below it.
LEVEL1_SAMPLE = 1_000_000
# An epoch reads its rows a group at a time (see _groups): GROUP_BLOCKS blocks of
# BLOCK_ROWS consecutive rows, 65,536 rows (10 MB at 160 bytes a row).
BLOCK_ROWS = 128
GROUP_BLOCKS = 512

Rows = npt.NDArray[np.signedinteger[Any]]  # row indices: int32 where they fit (4 bytes a row, not 8)


def _all_rows(x: F32, rows: Rows | None) -> Rows:
    return np.arange(len(x), dtype=row_index_dtype(len(x))) if rows is None else rows


def row_index_dtype(n: int) -> type[np.signedinteger[Any]]:
    """The narrowest index type for rows 0..n-1 (int32 up to 2**31 rows): the
    per-row index arrays (the training part, an epoch's order) then cost 4
    bytes a row."""
    return np.int32 if n <= np.iinfo(np.int32).max else np.int64


def whole_file(a: npt.NDArray[Any]) -> TypeGuard[np.memmap[Any, Any]]:
    """Whether `a` is an .npy file mapped in whole (numpy.load(mmap_mode="r")),
    which the readers below read with plain reads, not through the mapping."""
    mapped = getattr(a, "_mmap", None)
    return bool(isinstance(a, np.memmap) and a.filename and mapped is not None and a.flags.c_contiguous
                and len(mapped) == a.offset + a.nbytes)  # fmt: skip


def read_column(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """A 1-d column in memory. An .npy file mapped in whole is read with plain
    reads, not through the mapping, so none of its pages stay in the process
    (see take_rows): the labels and times are read once and kept, or reduced.
    Anything else (a view of a mapping, an array) is copied as it is indexed."""
    if whole_file(a) and a.ndim == 1:
        return read_rows(a, 0, len(a))
    return a if type(a) is np.ndarray else np.array(a)


def read_rows(a: npt.NDArray[Any], start: int, stop: int) -> npt.NDArray[Any]:
    """Rows start..stop of a 1-d column, read as read_column reads the whole."""
    if not (whole_file(a) and a.ndim == 1):
        return np.array(a[start:stop])
    count = max(0, min(stop, len(a)) - start)
    out = np.fromfile(str(a.filename), a.dtype, count, offset=a.offset + start * a.itemsize)
    if len(out) != count:
        raise OSError(f"{a.filename}: read {len(out)} values of {count}: the file was cut short")
    return out


Chunks = Callable[[], Iterable[npt.NDArray[np.integer[Any]]]]
QUANTILE_BINS = 1 << 16  # a pass narrows the range holding a rank this many times
QUANTILE_GATHER = 1 << 20  # values of a narrowed range gathered and partitioned in memory


def quantile(chunks: Chunks, q: float) -> float:
    """np.quantile(column, q) (its default, linear method), to the bit, of an
    integer column read a chunk at a time: `chunks()` gives the chunks afresh
    for each pass. Memory: a chunk, QUANTILE_BINS counts and at most
    QUANTILE_GATHER values (np.quantile copies and partitions the whole column:
    160 MB for the 20 M rows' times of a 4 M-event log). A few passes."""
    n, lo, hi = 0, None, None
    for c in chunks():
        if len(c):
            n += len(c)
            lo = int(c.min()) if lo is None else min(lo, int(c.min()))
            hi = int(c.max()) if hi is None else max(hi, int(c.max()))
    if lo is None or hi is None:
        raise ValueError("the quantile of no values")
    virtual = (n - 1) * float(q)  # numpy's virtual index for the linear method
    if virtual >= n - 1:  # numpy takes the last value twice
        below = above = n - 1
    elif virtual < 0:
        below = above = 0
    else:
        below = int(np.floor(virtual))
        above = below + 1
    gamma = virtual - (-1 if virtual >= n - 1 else below)  # as numpy's _get_gamma
    a, b = np.int64(_kth(chunks, below, lo, hi)), np.int64(_kth(chunks, above, lo, hi))
    diff = b - a  # numpy's _lerp, as it computes it
    return float(b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma)


def _kth(chunks: Chunks, k: int, lo: int, hi: int) -> int:
    """The k-th smallest value (0-based) of the chunks' values, all in lo..hi."""
    before = 0  # values below lo
    while lo < hi:
        width = -(-(hi - lo + 1) // QUANTILE_BINS)
        counts = np.zeros(QUANTILE_BINS, np.int64)
        for c in chunks():
            # offsets from lo as uint64 (no overflow whatever the range), worked on in place
            offset = c[(c >= lo) & (c <= hi)].astype(np.int64, copy=False).view(np.uint64)
            offset -= np.uint64(lo % 2**64)
            offset //= np.uint64(width)
            counts += np.bincount(offset.view(np.int64), minlength=QUANTILE_BINS)
        cum = np.cumsum(counts)
        at = int(np.searchsorted(cum, k - before, side="right"))  # the bin holding rank k
        before += int(cum[at - 1]) if at else 0
        lo, hi = lo + at * width, min(hi, lo + (at + 1) * width - 1)
        if counts[at] <= QUANTILE_GATHER:
            held = np.concatenate([c[(c >= lo) & (c <= hi)] for c in chunks()] or [np.zeros(0, np.int64)])
            return int(np.partition(held, k - before)[k - before])
    return lo


def take_rows(x: npt.NDArray[Any], index: Rows) -> npt.NDArray[Any]:
    """x[index], for the rows of a matrix or the values of a column. For an
    .npy file mapped in whole (numpy.load(mmap_mode="r")), the rows are read
    with pread, a run of consecutive rows in one read, so no page of the file
    is mapped into the process: read through the mapping, each random row maps
    the pages around it (the kernel's fault-around and large page-cache
    folios), and a mini-batch of 1,024 random rows of 5 M left about 500 MB of
    the file in the process whether it was mapped afresh every batch or every
    8 (the page cache keeps the file either way). Reading is also faster: 1.8
    against 2.3 ms a batch of 1,024 rows of 160 bytes."""
    if not (whole_file(x) and x.ndim in (1, 2)):
        return x[index]
    index = np.asarray(index, np.int64)
    if not len(index):
        return np.zeros((0, *x.shape[1:]), x.dtype)
    if index.min() < 0 or index.max() >= len(x):
        raise IndexError(f"rows {index.min()}..{index.max()} of a {len(x)}-row file")
    row = x.strides[0]
    fd = os.open(str(x.filename), os.O_RDONLY)
    try:
        data = read_runs(fd, x.offset, row, index)
    finally:
        os.close(fd)
    if len(data) != len(index) * row:
        raise OSError(f"{x.filename}: read {len(data)} bytes of {len(index) * row}: the file was cut short")
    return np.frombuffer(data, x.dtype).reshape(len(index), *x.shape[1:])


def gather(column: npt.NDArray[Any], rows: Rows) -> npt.NDArray[Any]:
    """column[rows] for `rows` that may themselves be a file (a part's row
    numbers, see train._split_rows): read CHUNK_ROWS of them at a time, each
    chunk's values by take_rows (a run of consecutive rows in one read)."""
    out = np.empty(len(rows), column.dtype)
    for s in range(0, len(rows), CHUNK_ROWS):
        index = read_rows(rows, s, s + CHUNK_ROWS)
        out[s : s + len(index)] = take_rows(column, index)
    return out


def gather_sorted(column: npt.NDArray[Any], rows: Rows) -> npt.NDArray[Any]:
    """column[rows] for ascending `rows` in memory, however sparse: the column
    read CHUNK_ROWS x 64 values at a time and the rows picked from each (for
    rows too far apart for take_rows's runs, e.g. an evenly spaced sample)."""
    out = np.empty(len(rows), column.dtype)
    span = CHUNK_ROWS * 64
    bounds = np.searchsorted(rows, np.arange(0, len(column) + span, span))
    for k, (a, b) in enumerate(itertools.pairwise(bounds.tolist())):
        if a < b:
            start = k * span
            out[a:b] = read_rows(column, start, min(len(column), start + span))[rows[a:b] - start]
    return out


def read_blocks(rows: Rows, blocks: Sequence[int], size: int) -> Rows:
    """rows[b * size : (b + 1) * size] for each of `blocks`, in order, as one
    array: from a file of row numbers, one pread a block."""
    if not (whole_file(rows) and rows.ndim == 1):
        return np.concatenate([rows[b * size : (b + 1) * size] for b in blocks]) if len(blocks) else rows[:0]
    starts = np.asarray(blocks, np.int64) * size
    counts = np.minimum(starts + size, len(rows)) - starts
    index = np.repeat(starts - np.r_[0, np.cumsum(counts)[:-1]], counts) + np.arange(int(counts.sum()))
    return take_rows(rows, index)


def pick_level1(x: F32, y: F32, layout: Layout, rows: Rows | None = None) -> tuple[str, ...]:
    """Feature sampling keeps the more predictive half of the dense columns,
    by how far each column alone ranks the training rows (`rows` of x and y;
    None: all) from chance, measured on at most LEVEL1_SAMPLE of them."""
    rows = _all_rows(x, rows)
    if len(rows) > LEVEL1_SAMPLE:
        rows = gather_sorted(rows, np.linspace(0, len(rows) - 1, LEVEL1_SAMPLE).astype(np.int64))
    rows = read_rows(rows, 0, len(rows))
    cols = [layout.columns.index(c) for c in layout.dense]
    parts = [take_rows(x, rows[s : s + CHUNK_ROWS])[:, cols] for s in range(0, len(rows), CHUNK_ROWS)]
    block = np.concatenate(parts) if parts else np.zeros((0, len(cols)), np.float32)
    yr = gather_sorted(y, rows) if whole_file(y) else y[rows]
    strength = []
    for n, c in enumerate(layout.dense):
        col = block[:, n]
        strength.append((abs(auc(yr, col) - 0.5) if len(col) and np.ptp(col) > 0 else 0.0, c))
    keep = max(1, (len(layout.dense) + 1) // 2)
    chosen = {c for _, c in sorted(strength, key=lambda s: (-s[0], s[1]))[:keep]}
    return tuple(c for c in layout.dense if c in chosen)


@dataclass
class Family:
    layout: Layout
    mean: F32  # dense standardisation, over layout.dense
    std: F32
    params: dict[str, F32]

    def predict(self, x: F32, variant: Variant, rows: Rows | None = None) -> F32:
        """Scores for raw input rows (`rows` of x; None: all) through the given
        sub-network (NumPy), PREDICT_ROWS at a time."""
        mask = _mask(self.layout, variant)
        if rows is None and len(x) <= PREDICT_ROWS:
            return _forward(self.params, _Batch.of(x, self.layout, self.mean, self.std), variant, mask)[0]
        rows = _all_rows(x, rows)
        out = np.empty(len(rows), np.float32)
        for s in range(0, len(rows), PREDICT_ROWS):
            part = take_rows(x, read_rows(rows, s, s + PREDICT_ROWS))
            out[s : s + len(part)] = _forward(
                self.params, _Batch.of(part, self.layout, self.mean, self.std), variant, mask
            )[0]
        return out


@dataclass
class _Batch:
    dense: F32  # standardised
    ids: npt.NDArray[np.int64]
    attr: F32  # multi-hot, rows summing to 1 (or 0)
    shares: F32
    hist: npt.NDArray[np.int64]  # history buckets (0 where absent)
    hist_w: F32  # 1/len(history) where present, 0 where absent

    @functools.cached_property
    def id_scatter(self) -> Scatter:
        """Where each row's item gradient goes (computed once a batch, shared by every configuration)."""
        return Scatter.of(self.ids, np.arange(len(self.ids)))

    @functools.cached_property
    def hist_scatter(self) -> Scatter:
        """Where each row's history gradient goes, by its positions' weights (absent ones left out)."""
        weights = self.hist_w.ravel()
        present = np.flatnonzero(weights > 0)
        return Scatter.of(self.hist.ravel()[present], present // self.hist.shape[1], weights[present])

    @staticmethod
    def of(x: F32, layout: Layout, mean: F32, std: F32) -> _Batch:
        n = len(x)
        ids = (
            np.clip(x[:, layout.id_col], 0, layout.buckets - 1).astype(np.int64)
            if layout.id_col is not None
            else np.zeros(n, np.int64)
        )
        attr = (
            x[:, list(layout.attr_cols)].astype(np.float32)
            if layout.attr_cols
            else np.zeros((n, 0), np.float32)
        )
        if attr.shape[1]:
            attr = attr / np.maximum(attr.sum(axis=1, keepdims=True), 1.0)
        raw = x[:, list(layout.history_cols)]
        present = (raw >= 0).astype(np.float32)
        hist_w = present / np.maximum(present.sum(axis=1, keepdims=True), 1.0)
        return _Batch(
            ((x[:, layout.dense_idx] - mean) / std).astype(np.float32),
            ids,
            attr,
            x[:, list(layout.intent_cols)].astype(np.float32),
            np.clip(raw, 0, layout.buckets - 1).astype(np.int64),
            hist_w.astype(np.float32),
        )


def _mask(layout: Layout, variant: Variant) -> F32:
    keep = set(variant.dense)
    return np.array([1.0 if c in keep else 0.0 for c in layout.dense], np.float32)


@dataclass(frozen=True)
class _Looked:
    """A batch's embedding look-ups at the widest dimension its configurations
    use, made once a step and sliced by each (a prefix of a sum is the sum of
    the prefixes): the item vector v and the history mean h."""

    item: F32  # (n, d)
    hist: F32 | None  # (n, d), None when no configuration reads the history (or there is none)

    @staticmethod
    def of(p: dict[str, F32], b: _Batch, d: int, cross: bool) -> _Looked:
        item = p["e_item"][b.ids, :d]
        if b.attr.shape[1]:
            item = item + b.attr @ p["e_cat"][:, :d]
        # h: the mean of the history items' id embeddings (absent positions weigh 0)
        read = cross and b.hist.shape[1]
        hist = np.einsum("nl,nld->nd", b.hist_w, p["e_item"][b.hist, :d]) if read else None
        return _Looked(item, hist)


@dataclass(frozen=True)
class _RowGrads:
    """The loss's gradient with respect to each row's v and h, summed over the
    configurations (each adds into its prefix), scattered into the tables once
    a step: one scatter of the widest prefix instead of one per configuration."""

    item: F32
    hist: F32 | None  # None: no configuration read the history

    @staticmethod
    def zeros(n: int, d: int, hist: bool) -> _RowGrads:
        return _RowGrads(np.zeros((n, d), np.float32), np.zeros((n, d), np.float32) if hist else None)

    def scatter(self, b: _Batch, grads: dict[str, F32]) -> None:
        d = self.item.shape[1]
        if self.hist is not None:
            b.hist_scatter.add(grads["e_item"][:, :d], self.hist)
        b.id_scatter.add(grads["e_item"][:, :d], self.item)
        if b.attr.shape[1]:
            grads["e_cat"][:, :d] += b.attr.T @ self.item


def _forward(
    p: dict[str, F32], b: _Batch, v: Variant, mask: F32, looked: _Looked | None = None
) -> tuple[F32, dict[str, npt.NDArray[Any]]]:
    d = v.dim
    looked = looked or _Looked.of(p, b, d, v.cross)
    xm = b.dense * mask
    item = looked.item[:, :d]
    pre = xm @ p["w_dense"] + item @ p["w_item"][:d] + p["b1"]
    cache: dict[str, npt.NDArray[Any]] = {"xm": xm, "item": item}
    if v.cross and b.shares.shape[1]:
        user = b.shares @ p["u_cat"][:, :d]
        cross = (user * item).sum(axis=1, keepdims=True)
        pre = pre + cross @ p["w_cross"]
        cache |= {"user": user, "cross": cross}
    if v.cross and looked.hist is not None:
        hist = looked.hist[:, :d]
        hcross = (hist * item).sum(axis=1, keepdims=True)
        pre = pre + hcross @ p["w_hcross"]
        cache |= {"hist": hist, "hcross": hcross}
    h = np.maximum(0.0, pre)
    z = h @ p["w_out"] + p["b_out"]
    prob = (1.0 / (1.0 + np.exp(-np.clip(z, -60.0, 60.0)))).ravel()  # float32 when the weights are
    cache |= {"pre": pre, "h": h}
    return prob, cache


def _backward(
    p: dict[str, F32], b: _Batch, v: Variant, mask: F32, y: F32, w: F32, grads: dict[str, F32],
    looked: _Looked, rows: _RowGrads,
) -> float:  # fmt: skip
    """Adds this configuration's gradient into grads (the embedding tables'
    part into `rows`, scattered later); returns its loss (rows weighted by w)."""
    prob, c = _forward(p, b, v, mask, looked)
    n, d = len(y), v.dim
    eps = 1e-7
    loss = float(-np.mean(w * (y * np.log(prob + eps) + (1 - y) * np.log(1 - prob + eps))))
    dz = (w * (prob - y) / n).reshape(-1, 1).astype(np.float32)
    grads["w_out"] += c["h"].T @ dz
    grads["b_out"] += dz.sum(axis=0)
    dh = (dz @ p["w_out"].T) * (c["pre"] > 0)
    grads["w_dense"] += c["xm"].T @ dh
    grads["b1"] += dh.sum(axis=0)
    grads["w_item"][:d] += c["item"].T @ dh
    ditem = rows.item[:, :d]
    ditem += dh @ p["w_item"][:d].T
    if "cross" in c:
        grads["w_cross"] += c["cross"].T @ dh
        dcross = dh @ p["w_cross"].T
        ditem += dcross * c["user"]
        grads["u_cat"][:, :d] += b.shares.T @ (dcross * c["item"])
    if "hcross" in c:
        assert rows.hist is not None  # looked.hist was read: rows.hist is kept with it
        grads["w_hcross"] += c["hcross"].T @ dh
        dhc = dh @ p["w_hcross"].T
        ditem += dhc * c["hist"]
        rows.hist[:, :d] += dhc * c["item"]  # spread over the history positions by their weights
    return loss


def _gradients(
    p: dict[str, F32], b: _Batch, configs: Sequence[Variant], masks: Sequence[F32], y: F32, w: F32
) -> tuple[dict[str, F32], float]:
    """The gradient of the configurations' summed loss on one batch, and that loss."""
    grads = {k: np.zeros_like(a) for k, a in p.items()}
    widest = max(c.dim for c in configs)
    looked = _Looked.of(p, b, widest, any(c.cross for c in configs))
    rows = _RowGrads.zeros(len(y), widest, looked.hist is not None)
    loss = sum(_backward(p, b, c, m, y, w, grads, looked, rows) for c, m in zip(configs, masks, strict=True))
    rows.scatter(b, grads)
    return grads, float(loss)


def _init(rng: np.random.Generator, layout: Layout, hidden: int, y_mean: float) -> dict[str, F32]:
    def normal(shape: tuple[int, ...], scale: float) -> F32:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    dense = max(1, len(layout.dense))
    return {
        "e_item": normal((layout.buckets, EMBEDDING_DIM), 0.05),
        "e_cat": normal((max(1, len(layout.attr_cols)), EMBEDDING_DIM), 0.05),
        "u_cat": normal((max(1, len(layout.intent_cols)), EMBEDDING_DIM), 0.05),
        "w_dense": normal((len(layout.dense), hidden), float(np.sqrt(2.0 / dense))),
        "w_item": normal((EMBEDDING_DIM, hidden), float(np.sqrt(1.0 / EMBEDDING_DIM))),
        "w_cross": normal((1, hidden), 0.1),
        "w_hcross": normal((1, hidden), 0.1),
        "b1": np.zeros(hidden, np.float32),
        "w_out": normal((hidden, 1), float(np.sqrt(1.0 / hidden))),
        "b_out": np.full(1, np.log(y_mean / (1 - y_mean + 1e-9) + 1e-9), np.float32),
    }


def train_family(
    x: F32, y: F32, layout: Layout, configs: Sequence[Variant], *, hidden: int = 32, epochs: int = 4,
    batch_size: int = 1024, lr: float = 0.01, l2_embedding: float = 1e-2, seed: int = 0,
    progress: Callable[[int, int], None] | None = None, weights: F32 | None = None, rows: Rows | None = None,
) -> Family:  # fmt: skip
    """Mini-batch Adam on the summed loss of `configs` (see the module docstring)
    over `rows` of x and y (None: all); `weights`: per row of x, its weight in
    the loss (scaled to mean 1 over `rows`). x may be a file mapped in
    (numpy.load(mmap_mode="r")): only a group's rows (see _groups) are read at
    a time."""
    rng = np.random.default_rng(seed)
    rows = _all_rows(x, rows)
    # Nothing per row but an epoch's order of blocks (`rows`, the labels and the
    # weights may be files): a group's labels and weights are read with its rows.
    y_mean = float(gather(y, rows).mean())
    w_mean = 1.0 if weights is None else gather(weights, rows).mean()
    mean, std = _moments(x, rows, layout.dense_idx)
    p = _init(rng, layout, hidden, y_mean)
    masks = [_mask(layout, c) for c in configs]
    m = {k: np.zeros_like(a) for k, a in p.items()}
    s = {k: np.zeros_like(a) for k, a in p.items()}
    steps = epochs * (-(-len(rows) // batch_size))
    batches = _batches(x, y, weights, w_mean, rows, rng, epochs, batch_size)
    for step, (xb, yb, wb) in enumerate(batches, 1):
        # each batch's inputs derived from its rows only: no copy of the whole matrix
        batch = _Batch.of(xb, layout, mean, std)
        grads = _gradients(p, batch, configs, masks, yb, wb)[0]
        # L2 on the embedding rows this batch looked up, not on the whole
        # table: under Adam a decay term alone moves each row the batch
        # did not use toward 0 by about the learning rate per step. How
        # strong it should be depends on the data (the repository's
        # training.embedding_l2; docs/models.md has the figures).
        looked_up = np.zeros(len(p["e_item"]), bool)
        looked_up[batch.ids] = looked_up[batch.hist.ravel()] = True
        looked_up = np.flatnonzero(looked_up)
        grads["e_item"][looked_up] += l2_embedding * p["e_item"][looked_up]
        for k in ("e_cat", "u_cat"):
            grads[k] += l2_embedding * p[k]
        for k, g in grads.items():
            _adam(p[k], m[k], s[k], g, lr, step)
        if progress is not None:
            progress(step, steps)
    return Family(layout, mean, std, p)


def _batches(
    x: F32, y: F32, weights: F32 | None, w_mean: float, rows: Rows, rng: np.random.Generator, epochs: int,
    batch_size: int,
) -> Iterator[tuple[F32, F32, F32]]:  # fmt: skip
    """Each step's rows, labels and weights (scaled by w_mean): an epoch read a
    group at a time (_groups, in file order), each group shuffled into its batches."""
    for _ in range(epochs):
        for group in _groups(rows, rng):
            xg, yg, wg = take_rows(x, group), take_rows(y, group), np.ones(len(group), np.float32)
            if weights is not None:
                wg = (take_rows(weights, group) / w_mean).astype(np.float32)
            order = rng.permutation(len(group))
            for start in range(0, len(group), batch_size):
                at = order[start : start + batch_size]
                yield xg[at], yg[at], wg[at]


def _groups(rows: Rows, rng: np.random.Generator) -> Iterator[Rows]:
    """An epoch's rows, a group at a time: `rows` cut into blocks of BLOCK_ROWS,
    the blocks in a random order, GROUP_BLOCKS of them a group, each group's
    blocks in ascending order. The caller reads a group in a few long reads and
    shuffles its rows into batches, so a batch mixes rows from hundreds of
    places of the log and reading a step's rows costs a few reads instead of
    one a row: 1,024 random rows of a file of millions read one at a time were
    a quarter to a third of a step (docs/models.md has the figures)."""
    blocks = -(-len(rows) // BLOCK_ROWS)
    order = rng.permutation(blocks)
    for start in range(0, blocks, GROUP_BLOCKS):
        chosen = np.sort(order[start : start + GROUP_BLOCKS])
        yield read_blocks(rows, chosen.tolist(), BLOCK_ROWS)


def _adam(p: F32, m: F32, s: F32, g: F32, lr: float, step: int) -> None:
    """One Adam step on p, in place: m = 0.9 m + 0.1 g, s = 0.999 s + 0.001 g²,
    p -= lr m̂ / (√ŝ + 1e-8). The same float32 operations in the same order as
    the expression (the same bits), without a new array per operation."""
    m *= 0.9
    m += g * 0.1
    s *= 0.999
    g2 = g * 0.001
    g2 *= g
    s += g2
    update = m / (1 - 0.9**step)
    update *= lr
    root = s / (1 - 0.999**step)
    np.sqrt(root, out=root)
    root += 1e-8
    update /= root
    p -= update


def _moments(x: F32, rows: Rows, cols: Sequence[int] | npt.NDArray[np.int64]) -> tuple[F32, F32]:
    """Mean and standard deviation (+1e-6) of `cols` over `rows`, a chunk at a time (float64 sums)."""
    cols = list(cols)
    total = np.zeros(len(cols), np.float64)
    for s in range(0, len(rows), CHUNK_ROWS):
        total += take_rows(x, read_rows(rows, s, s + CHUNK_ROWS))[:, cols].sum(axis=0, dtype=np.float64)
    mean = total / max(1, len(rows))
    squares = np.zeros(len(cols), np.float64)
    for s in range(0, len(rows), CHUNK_ROWS):
        squares += ((take_rows(x, read_rows(rows, s, s + CHUNK_ROWS))[:, cols] - mean) ** 2).sum(axis=0)
    std = np.sqrt(squares / max(1, len(rows)))
    return mean.astype(np.float32), (std + 1e-6).astype(np.float32)


def auc(y: npt.NDArray[np.float32], score: npt.NDArray[Any]) -> float:
    """Area under the ROC curve (Mann-Whitney, ties averaged): over the
    positives, the negatives scored below each plus half those scored level,
    out of n_pos x n_neg. Both classes' scores are sorted apart and each
    positive placed among the negatives by binary search, AUC_CHUNK positives
    at a time: about 5 bytes a row beside the scores, where ranking every row
    took about 50 (argsort, ranks, runs of ties; 4 M holdout rows: 200 MB).
    The count is an integer, so the figure is the ranks' to the bit."""
    pos = y == 1
    n_pos = int(pos.sum())
    n_neg = len(score) - n_pos
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    positives = np.sort(score[pos])
    negatives = np.sort(score[~pos])
    del pos
    below = level = 0
    for s in range(0, n_pos, AUC_CHUNK):
        part = positives[s : s + AUC_CHUNK]
        left = np.searchsorted(negatives, part, side="left")
        right = np.searchsorted(negatives, part, side="right")
        below += int(left.sum())
        level += int((right - left).sum())
    return float((below + level / 2) / (n_pos * n_neg))


AUC_CHUNK = 1 << 20  # positives placed among the negatives at a time by auc


def variant_weights(model: Family, v: Variant) -> dict[str, F32]:
    """The initialisers one variant's graph carries (only what it uses)."""
    layout = model.layout
    keep = [layout.dense.index(c) for c in v.dense]
    d = v.dim
    w: dict[str, F32] = {
        "mean": model.mean[keep].reshape(1, -1),
        "std": model.std[keep].reshape(1, -1),
        "w_dense": model.params["w_dense"][keep],
        "e_item": np.ascontiguousarray(model.params["e_item"][:, :d]),
        "w_item": model.params["w_item"][:d],
        "b1": model.params["b1"],
        "w_out": model.params["w_out"],
        "b_out": model.params["b_out"],
    }
    if layout.attr_cols:
        w["e_cat"] = np.ascontiguousarray(model.params["e_cat"][:, :d])
    if v.cross and layout.has_intent:
        w["u_cat"] = np.ascontiguousarray(model.params["u_cat"][:, :d])
        w["w_cross"] = model.params["w_cross"]
    if v.cross and layout.has_history:
        w["w_hcross"] = model.params["w_hcross"]
    return w


@dataclass
class _Graph:
    """An ONNX graph as it is built: nodes and initialisers in order, reading `input_name`."""

    input_name: str
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    inits: list[onnx.TensorProto] = field(default_factory=list)

    def const(self, name: str, value: npt.NDArray[Any]) -> None:
        self.inits.append(numpy_helper.from_array(value, name))

    def columns(self, name: str, cols: Sequence[int]) -> None:
        """An index initialiser `name` for Gather-ing these input columns."""
        self.const(name, np.array(cols, np.int64))


def to_onnx(
    model: Family, v: Variant, input_name: str = "features", output_name: str = "score"
) -> onnx.ModelProto:
    """The variant as a standalone graph over the full input row (callers
    always send every column; the graph reads the ones it uses)."""
    layout = model.layout
    g = _Graph(input_name)
    for k, a in variant_weights(model, v).items():
        g.const(k, a)
    _dense_and_id(g, layout, v)
    item = _item_vector(g, layout)
    last = "h_sum"
    if v.cross and layout.has_intent:
        last = _intent_cross(g, layout, item, last)
    if v.cross and layout.has_history:
        last = _history_cross(g, layout, item, last)
    _output(g, last, output_name)
    graph = helper.make_graph(
        g.nodes,
        f"recmesh_ctr_level{v.level}",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["batch", len(layout.columns)])],
        [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, ["batch"])],
        initializer=g.inits,
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    onnx.checker.check_model(proto)
    return proto


def _dense_and_id(g: _Graph, layout: Layout, v: Variant) -> None:
    """The shared constants; the variant's dense columns standardised into their
    first-layer term `h_dense`; the item id's embedding row `v_id`."""
    consts: dict[str, npt.NDArray[Any]] = {
        "dense_idx": np.array([layout.columns.index(c) for c in v.dense], np.int64),
        "id_idx": np.array([layout.id_col or 0], np.int64),
        "id_max": np.array(layout.buckets - 1, np.float32),
        "zero": np.array(0.0, np.float32),
        "one": np.array(1.0, np.float32),
        "flat": np.array([-1], np.int64),
        "sum_axis": np.array([1], np.int64),
    }
    for k, a in consts.items():
        g.const(k, a)
    node = helper.make_node
    g.nodes += [
        node("Gather", [g.input_name, "dense_idx"], ["dense"], axis=1),
        node("Sub", ["dense", "mean"], ["centered"]),
        node("Div", ["centered", "std"], ["scaled"]),
        node("MatMul", ["scaled", "w_dense"], ["h_dense"]),
        # The item id's bucket -> an embedding row (clipped into range, never an error).
        node("Gather", [g.input_name, "id_idx"], ["id_f"], axis=1),
        node("Clip", ["id_f", "zero", "id_max"], ["id_c"]),
        node("Cast", ["id_c"], ["id_i"], to=TensorProto.INT64),
        node("Reshape", ["id_i", "flat"], ["ids"]),
        node("Gather", ["e_item", "ids"], ["v_id"], axis=0),
    ]


def _item_vector(g: _Graph, layout: Layout) -> str:
    """The item vector (the id's row, plus the attribute rows' mean when there is
    an attribute) and the first layer's sum `h_sum` so far; returns the item's name."""
    node = helper.make_node
    item = "v_id"
    if layout.attr_cols:
        g.columns("attr_idx", layout.attr_cols)
        g.nodes += [
            # The attribute's (multi-)hot columns average their embedding rows.
            node("Gather", [g.input_name, "attr_idx"], ["attr"], axis=1),
            node("ReduceSum", ["attr", "sum_axis"], ["attr_n"], keepdims=1),
            node("Max", ["attr_n", "one"], ["attr_d"]),
            node("Div", ["attr", "attr_d"], ["attr_w"]),
            node("MatMul", ["attr_w", "e_cat"], ["v_cat"]),
            node("Add", ["v_id", "v_cat"], ["item"]),
        ]
        item = "item"
    g.nodes += [
        node("MatMul", [item, "w_item"], ["h_item"]),
        node("Add", ["h_dense", "h_item"], ["h_sum"]),
    ]
    return item


def _intent_cross(g: _Graph, layout: Layout, item: str, last: str) -> str:
    """<u, v>: the user-intent vector against the item's, added to `last`."""
    node = helper.make_node
    g.columns("intent_idx", layout.intent_cols)
    g.nodes += [
        node("Gather", [g.input_name, "intent_idx"], ["shares"], axis=1),
        node("MatMul", ["shares", "u_cat"], ["user"]),
        node("Mul", ["user", item], ["ui"]),
        node("ReduceSum", ["ui", "sum_axis"], ["cross"], keepdims=1),
        node("MatMul", ["cross", "w_cross"], ["h_cross"]),
        node("Add", [last, "h_cross"], ["h_all"]),
    ]
    return "h_all"


def _history_cross(g: _Graph, layout: Layout, item: str, last: str) -> str:
    """<h, v>: the recent items' mean id embedding against the item's, added to `last`."""
    node = helper.make_node
    g.columns("hist_idx", layout.history_cols)
    g.const("last_axis", np.array([2], np.int64))
    g.nodes += [
        # The recent items' buckets (-1 past the end): present ones weigh
        # 1/count, absent ones 0; their id embeddings averaged into h.
        node("Gather", [g.input_name, "hist_idx"], ["hist_f"], axis=1),
        node("GreaterOrEqual", ["hist_f", "zero"], ["hist_on"]),
        node("Cast", ["hist_on"], ["hist_m"], to=TensorProto.FLOAT),
        node("ReduceSum", ["hist_m", "sum_axis"], ["hist_n"], keepdims=1),
        node("Max", ["hist_n", "one"], ["hist_d"]),
        node("Div", ["hist_m", "hist_d"], ["hist_w"]),
        node("Clip", ["hist_f", "zero", "id_max"], ["hist_c"]),
        node("Cast", ["hist_c"], ["hist_i"], to=TensorProto.INT64),
        node("Gather", ["e_item", "hist_i"], ["hist_e"], axis=0),  # (batch, positions, d)
        node("Unsqueeze", ["hist_w", "last_axis"], ["hist_w3"]),
        node("Mul", ["hist_e", "hist_w3"], ["hist_we"]),
        node("ReduceSum", ["hist_we", "sum_axis"], ["hist"], keepdims=0),
        node("Mul", ["hist", item], ["hi"]),
        node("ReduceSum", ["hi", "sum_axis"], ["hcross"], keepdims=1),
        node("MatMul", ["hcross", "w_hcross"], ["h_hcross"]),
        node("Add", [last, "h_hcross"], ["h_all2"]),
    ]
    return "h_all2"


def _output(g: _Graph, last: str, output_name: str) -> None:
    """Bias, ReLU, the output layer and a sigmoid: one score per row."""
    node = helper.make_node
    g.nodes += [
        node("Add", [last, "b1"], ["h_pre"]),
        node("Relu", ["h_pre"], ["h"]),
        node("MatMul", ["h", "w_out"], ["z_mm"]),
        node("Add", ["z_mm", "b_out"], ["z"]),
        node("Sigmoid", ["z"], ["prob"]),
        node("Reshape", ["prob", "flat"], [output_name]),
    ]


def weight_bytes(model: Family, v: Variant) -> int:
    return sum(int(a.nbytes) for a in variant_weights(model, v).values())
