"""The CTR model family with learnt embeddings, and its degradation variants.

One network, several exported sub-networks (the design notes' graded circuit
breaking; levels are cumulative, each cheaper than the one before):

- level 0: every dense column, 128-dimensional embeddings, cross features;
- level 1: feature sampling -- half of the dense columns (LEVEL1_DENSE), the
  ID features (item id, category, user intent) all kept;
- level 2: level 1 with embeddings cut to their first 64 dimensions;
- level 3: level 2 without cross features (the learnt user-intent x item dot
  product and the engineered `x_` columns), at 16 dimensions.

Embeddings: an item-id table (hashed ids, ITEM_BUCKETS rows) plus a category
table give the item vector v; the user's real-time category distribution
weighted over a user-side category table gives the user-intent vector u. The
item vector feeds the MLP directly; the cross feature is <u, v>.

Why one jointly trained network (matryoshka-style) rather than a separately
trained model per level: the loss of every training step is the sum of the
losses of the served configurations (level 0, level 1 at prefixes 128/64/32/16,
level 3), so the first d dimensions of every embedding are a usable embedding
on their own and the masked MLP works without the sampled-away columns. The
variants then share one set of weights: a ranker that mixes levels across
requests (it steps down and back up under load) gets scores on one scale that
order items alike, which separately trained models do not promise; the
"dimension by load" switch is a slice of one table; and training costs one
run. The price is that level 0 shares capacity with its sub-networks; the
model card and `recmesh bench degrade` measure what each level costs in AUC.

Training is mini-batch Adam in NumPy, deterministic under a seed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

from recmesh.features.vectorize import (
    CATEGORY_VOCAB,
    COLUMNS,
    DENSE_COLUMNS,
    INTENT_COLUMNS,
    ITEM_BUCKETS,
    OFFLINE_COLUMNS,
)

F32 = npt.NDArray[np.float32]

EMBEDDING_DIM = 128
PREFIX_DIMS = (128, 64, 32, 16)
# Level 1 keeps this half of the dense columns (the user-item match signals and
# the item's quality), dropping activity counts and profile attributes.
LEVEL1_DENSE = (
    "u_cat_share_10m",
    "u_item_recent",
    "i_ctr_10m",
    "u_interest_match",
    "i_popularity_log",
    "x_interest_popularity",
)
CROSS_DENSE = tuple(c for c in DENSE_COLUMNS if c.startswith("x_"))


@dataclass(frozen=True)
class Variant:
    """One exported sub-network: which dense columns it reads, how many
    embedding dimensions, whether it computes cross features."""

    level: int
    dense: tuple[str, ...]
    dim: int
    cross: bool  # the user-intent x item cross (the only use of the real-time intent columns)

    def describe(self) -> str:
        return f"{len(self.dense)}/{len(DENSE_COLUMNS)} dense columns, {self.dim}-d embeddings, " + (
            "cross features" if self.cross else "no cross features"
        )


LEVEL1_DENSE_ORDERED = tuple(c for c in DENSE_COLUMNS if c in LEVEL1_DENSE)
VARIANTS: tuple[Variant, ...] = (
    Variant(0, DENSE_COLUMNS, 128, True),
    Variant(1, LEVEL1_DENSE_ORDERED, 128, True),
    Variant(2, LEVEL1_DENSE_ORDERED, 64, True),
    Variant(3, tuple(c for c in LEVEL1_DENSE_ORDERED if c not in CROSS_DENSE), 16, False),
)
# The configurations whose losses are summed in training: the served levels
# plus the intermediate prefixes of level 1, so every prefix stays usable.
TRAINED: tuple[Variant, ...] = (
    VARIANTS[0],
    VARIANTS[1],
    VARIANTS[2],
    Variant(2, LEVEL1_DENSE_ORDERED, 32, True),
    Variant(2, LEVEL1_DENSE_ORDERED, 16, True),
    VARIANTS[3],
)
# The same family without real-time inputs (the offline-only baseline).
OFFLINE_ONLY = Variant(0, OFFLINE_COLUMNS, 128, False)

_DENSE_IDX = [COLUMNS.index(c) for c in DENSE_COLUMNS]
_ID_IDX = COLUMNS.index("i_id_bucket")
_CAT_IDX = COLUMNS.index("i_category_index")
_INTENT_IDX = [COLUMNS.index(c) for c in INTENT_COLUMNS]
N_CATS = len(CATEGORY_VOCAB)


@dataclass
class Family:
    mean: F32  # dense standardisation, over DENSE_COLUMNS
    std: F32
    params: dict[str, F32]

    def predict(self, x: F32, variant: Variant) -> F32:
        """Scores for raw COLUMNS rows through the given sub-network (NumPy)."""
        batch = _Batch.of(x, self.mean, self.std)
        return _forward(self.params, batch, variant, _mask(variant))[0]


@dataclass
class _Batch:
    dense: F32  # standardised
    ids: npt.NDArray[np.int64]
    cats: npt.NDArray[np.int64]
    shares: F32

    @staticmethod
    def of(x: F32, mean: F32, std: F32) -> _Batch:
        return _Batch(
            ((x[:, _DENSE_IDX] - mean) / std).astype(np.float32),
            np.clip(x[:, _ID_IDX], 0, ITEM_BUCKETS - 1).astype(np.int64),
            np.clip(x[:, _CAT_IDX], 0, N_CATS - 1).astype(np.int64),
            x[:, _INTENT_IDX].astype(np.float32),
        )

    def take(self, idx: npt.NDArray[np.int64]) -> _Batch:
        return _Batch(self.dense[idx], self.ids[idx], self.cats[idx], self.shares[idx])


def _mask(variant: Variant) -> F32:
    return np.array([1.0 if c in variant.dense else 0.0 for c in DENSE_COLUMNS], np.float32)


def _forward(p: dict[str, F32], b: _Batch, v: Variant, mask: F32) -> tuple[F32, dict[str, npt.NDArray[Any]]]:
    d = v.dim
    xm = b.dense * mask
    item = p["e_item"][b.ids, :d] + p["e_cat"][b.cats, :d]
    pre = xm @ p["w_dense"] + item @ p["w_item"][:d] + p["b1"]
    cache: dict[str, npt.NDArray[Any]] = {"xm": xm, "item": item}
    if v.cross:
        user = b.shares @ p["u_cat"][:, :d]
        cross = (user * item).sum(axis=1, keepdims=True)
        pre = pre + cross @ p["w_cross"]
        cache |= {"user": user, "cross": cross}
    h = np.maximum(0.0, pre)
    z = h @ p["w_out"] + p["b_out"]
    prob = (1.0 / (1.0 + np.exp(-z))).astype(np.float32).ravel()
    cache |= {"pre": pre, "h": h}
    return prob, cache


def _backward(
    p: dict[str, F32], b: _Batch, v: Variant, y: F32, weight: float, grads: dict[str, F32]
) -> float:
    """Adds this configuration's gradient (times weight) into grads; returns its loss."""
    prob, c = _forward(p, b, v, _mask(v))
    n, d = len(y), v.dim
    eps = 1e-7
    loss = float(-np.mean(y * np.log(prob + eps) + (1 - y) * np.log(1 - prob + eps)))
    dz = ((prob - y) * (weight / n)).reshape(-1, 1).astype(np.float32)
    grads["w_out"] += c["h"].T @ dz
    grads["b_out"] += dz.sum(axis=0)
    dh = (dz @ p["w_out"].T) * (c["pre"] > 0)
    grads["w_dense"] += c["xm"].T @ dh
    grads["b1"] += dh.sum(axis=0)
    grads["w_item"][:d] += c["item"].T @ dh
    ditem = dh @ p["w_item"][:d].T
    if v.cross:
        grads["w_cross"] += c["cross"].T @ dh
        dcross = dh @ p["w_cross"].T
        ditem += dcross * c["user"]
        grads["u_cat"][:, :d] += b.shares.T @ (dcross * c["item"])
    np.add.at(grads["e_item"][:, :d], b.ids, ditem)
    np.add.at(grads["e_cat"][:, :d], b.cats, ditem)
    return loss


def _init(rng: np.random.Generator, hidden: int, y_mean: float) -> dict[str, F32]:
    def normal(shape: tuple[int, ...], scale: float) -> F32:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    dense = len(DENSE_COLUMNS)
    return {
        "e_item": normal((ITEM_BUCKETS, EMBEDDING_DIM), 0.05),
        "e_cat": normal((N_CATS, EMBEDDING_DIM), 0.05),
        "u_cat": normal((N_CATS, EMBEDDING_DIM), 0.05),
        "w_dense": normal((dense, hidden), float(np.sqrt(2.0 / dense))),
        "w_item": normal((EMBEDDING_DIM, hidden), float(np.sqrt(1.0 / EMBEDDING_DIM))),
        "w_cross": normal((1, hidden), 0.1),
        "b1": np.zeros(hidden, np.float32),
        "w_out": normal((hidden, 1), float(np.sqrt(1.0 / hidden))),
        "b_out": np.full(1, np.log(y_mean / (1 - y_mean + 1e-9) + 1e-9), np.float32),
    }


def train_family(
    x: F32, y: F32, configs: tuple[Variant, ...] = TRAINED, *, hidden: int = 32, epochs: int = 4,
    batch_size: int = 1024, lr: float = 0.01, l2_embedding: float = 1e-2, seed: int = 0,
) -> Family:  # fmt: skip
    """Mini-batch Adam on the summed loss of `configs` (see the module docstring)."""
    rng = np.random.default_rng(seed)
    dense = x[:, _DENSE_IDX]
    mean = dense.mean(axis=0).astype(np.float32)
    std = (dense.std(axis=0) + 1e-6).astype(np.float32)
    data = _Batch.of(x, mean, std)
    p = _init(rng, hidden, float(y.mean()))
    m = {k: np.zeros_like(a) for k, a in p.items()}
    s = {k: np.zeros_like(a) for k, a in p.items()}
    step = 0
    for _ in range(epochs):
        order = rng.permutation(len(y))
        for start in range(0, len(y), batch_size):
            idx = order[start : start + batch_size]
            batch, yb = data.take(idx), y[idx]
            grads = {k: np.zeros_like(a) for k, a in p.items()}
            for cfg in configs:
                _backward(p, batch, cfg, yb, 1.0, grads)
            for k in ("e_item", "e_cat", "u_cat"):
                grads[k] += l2_embedding * p[k]
            step += 1
            for k, g in grads.items():
                m[k] = 0.9 * m[k] + 0.1 * g
                s[k] = 0.999 * s[k] + 0.001 * g * g
                mhat = m[k] / (1 - 0.9**step)
                shat = s[k] / (1 - 0.999**step)
                p[k] = (p[k] - lr * mhat / (np.sqrt(shat) + 1e-8)).astype(np.float32)
    return Family(mean, std, p)


def auc(y: npt.NDArray[np.float32], score: F32) -> float:
    """Area under the ROC curve (Mann-Whitney, ties averaged)."""
    order = np.argsort(score, kind="mergesort")
    ranks = np.empty(len(score), dtype=np.float64)
    sorted_scores = score[order]
    i = 0
    while i < len(score):
        j = i
        while j + 1 < len(score) and sorted_scores[j + 1] == sorted_scores[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    pos = y == 1
    n_pos, n_neg = int(pos.sum()), int((~pos).sum())
    if n_pos == 0 or n_neg == 0:
        return float("nan")
    return float((ranks[pos].sum() - n_pos * (n_pos + 1) / 2) / (n_pos * n_neg))


def variant_weights(model: Family, v: Variant) -> dict[str, F32]:
    """The initialisers one variant's graph carries (only what it uses)."""
    keep = [DENSE_COLUMNS.index(c) for c in v.dense]
    d = v.dim
    w: dict[str, F32] = {
        "mean": model.mean[keep].reshape(1, -1),
        "std": model.std[keep].reshape(1, -1),
        "w_dense": model.params["w_dense"][keep],
        "e_item": np.ascontiguousarray(model.params["e_item"][:, :d]),
        "e_cat": np.ascontiguousarray(model.params["e_cat"][:, :d]),
        "w_item": model.params["w_item"][:d],
        "b1": model.params["b1"],
        "w_out": model.params["w_out"],
        "b_out": model.params["b_out"],
    }
    if v.cross:
        w["u_cat"] = np.ascontiguousarray(model.params["u_cat"][:, :d])
        w["w_cross"] = model.params["w_cross"]
    return w


def to_onnx(
    model: Family, v: Variant, input_name: str = "features", output_name: str = "score"
) -> onnx.ModelProto:
    """The variant as a standalone graph over the full COLUMNS row (callers
    always send every column; the graph reads the ones it uses)."""
    w = variant_weights(model, v)
    keep = [COLUMNS.index(c) for c in v.dense]
    inits = [numpy_helper.from_array(a, k) for k, a in w.items()]
    consts: dict[str, npt.NDArray[Any]] = {
        "dense_idx": np.array(keep, np.int64),
        "id_idx": np.array([_ID_IDX], np.int64),
        "cat_idx": np.array([_CAT_IDX], np.int64),
        "id_max": np.array(ITEM_BUCKETS - 1, np.float32),
        "cat_max": np.array(N_CATS - 1, np.float32),
        "zero": np.array(0.0, np.float32),
        "flat": np.array([-1], np.int64),
    }
    inits += [numpy_helper.from_array(a, k) for k, a in consts.items()]
    node = helper.make_node
    nodes = [
        node("Gather", [input_name, "dense_idx"], ["dense"], axis=1),
        node("Sub", ["dense", "mean"], ["centered"]),
        node("Div", ["centered", "std"], ["scaled"]),
        node("MatMul", ["scaled", "w_dense"], ["h_dense"]),
        # ID features -> embedding rows (indices clipped into range, never an error).
        node("Gather", [input_name, "id_idx"], ["id_f"], axis=1),
        node("Clip", ["id_f", "zero", "id_max"], ["id_c"]),
        node("Cast", ["id_c"], ["id_i"], to=TensorProto.INT64),
        node("Reshape", ["id_i", "flat"], ["ids"]),
        node("Gather", ["e_item", "ids"], ["v_id"], axis=0),
        node("Gather", [input_name, "cat_idx"], ["cat_f"], axis=1),
        node("Clip", ["cat_f", "zero", "cat_max"], ["cat_c"]),
        node("Cast", ["cat_c"], ["cat_i"], to=TensorProto.INT64),
        node("Reshape", ["cat_i", "flat"], ["cats"]),
        node("Gather", ["e_cat", "cats"], ["v_cat"], axis=0),
        node("Add", ["v_id", "v_cat"], ["item"]),
        node("MatMul", ["item", "w_item"], ["h_item"]),
        node("Add", ["h_dense", "h_item"], ["h_sum"]),
    ]
    last = "h_sum"
    if v.cross:
        inits.append(numpy_helper.from_array(np.array(_INTENT_IDX, np.int64), "intent_idx"))
        inits.append(numpy_helper.from_array(np.array([1], np.int64), "sum_axis"))
        nodes += [
            node("Gather", [input_name, "intent_idx"], ["shares"], axis=1),
            node("MatMul", ["shares", "u_cat"], ["user"]),
            node("Mul", ["user", "item"], ["ui"]),
            node("ReduceSum", ["ui", "sum_axis"], ["cross"], keepdims=1),
            node("MatMul", ["cross", "w_cross"], ["h_cross"]),
            node("Add", ["h_sum", "h_cross"], ["h_all"]),
        ]
        last = "h_all"
    nodes += [
        node("Add", [last, "b1"], ["h_pre"]),
        node("Relu", ["h_pre"], ["h"]),
        node("MatMul", ["h", "w_out"], ["z_mm"]),
        node("Add", ["z_mm", "b_out"], ["z"]),
        node("Sigmoid", ["z"], ["prob"]),
        node("Reshape", ["prob", "flat"], [output_name]),
    ]
    graph = helper.make_graph(
        nodes,
        f"recmesh_ctr_level{v.level}",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["batch", len(COLUMNS)])],
        [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, ["batch"])],
        initializer=inits,
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    onnx.checker.check_model(proto)
    return proto


def weight_bytes(model: Family, v: Variant) -> int:
    return sum(int(a.nbytes) for a in variant_weights(model, v).values())
