"""A small MLP trained with Adam in NumPy, exported to ONNX with onnx.helper.

Deterministic under a seed (full-batch training, seeded initialisation). The
exported graph standardises its inputs itself, so callers send raw columns.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

F32 = npt.NDArray[np.float32]


@dataclass
class Mlp:
    mean: F32
    std: F32
    w1: F32
    b1: F32
    w2: F32
    b2: F32

    def predict(self, x: F32) -> F32:
        h = np.maximum(0.0, ((x - self.mean) / self.std) @ self.w1 + self.b1)
        z = h @ self.w2 + self.b2
        prob: F32 = (1.0 / (1.0 + np.exp(-z))).astype(np.float32).ravel()
        return prob


def train_mlp(
    x: F32, y: npt.NDArray[np.float32], *, hidden: int = 32, epochs: int = 300,
    lr: float = 0.01, l2: float = 1e-4, seed: int = 0,
) -> Mlp:  # fmt: skip
    rng = np.random.default_rng(seed)
    mean = x.mean(axis=0).astype(np.float32)
    std = (x.std(axis=0) + 1e-6).astype(np.float32)
    xs = ((x - mean) / std).astype(np.float32)
    n, d = xs.shape
    params = {
        "w1": (rng.standard_normal((d, hidden)) * np.sqrt(2.0 / d)).astype(np.float32),
        "b1": np.zeros(hidden, np.float32),
        "w2": (rng.standard_normal((hidden, 1)) * np.sqrt(1.0 / hidden)).astype(np.float32),
        "b2": np.full(1, np.log(y.mean() / (1 - y.mean() + 1e-9) + 1e-9), np.float32),
    }
    m = {k: np.zeros_like(v) for k, v in params.items()}
    v = {k: np.zeros_like(p) for k, p in params.items()}
    yt = y.reshape(-1, 1)
    for step in range(1, epochs + 1):
        pre = xs @ params["w1"] + params["b1"]
        h = np.maximum(0.0, pre)
        p = 1.0 / (1.0 + np.exp(-(h @ params["w2"] + params["b2"])))
        dz = (p - yt) / n
        grads = {
            "w2": h.T @ dz + l2 * params["w2"],
            "b2": dz.sum(axis=0),
        }
        dh = (dz @ params["w2"].T) * (pre > 0)
        grads["w1"] = xs.T @ dh + l2 * params["w1"]
        grads["b1"] = dh.sum(axis=0)
        for k, grad in grads.items():
            m[k] = 0.9 * m[k] + 0.1 * grad
            v[k] = 0.999 * v[k] + 0.001 * grad**2
            mhat = m[k] / (1 - 0.9**step)
            vhat = v[k] / (1 - 0.999**step)
            params[k] = (params[k] - lr * mhat / (np.sqrt(vhat) + 1e-8)).astype(np.float32)
    return Mlp(mean, std, params["w1"], params["b1"], params["w2"], params["b2"])


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


def to_onnx(model: Mlp, input_name: str = "features", output_name: str = "score") -> onnx.ModelProto:
    d = model.w1.shape[0]
    inits = [
        numpy_helper.from_array(model.mean.reshape(1, d), "mean"),
        numpy_helper.from_array(model.std.reshape(1, d), "std"),
        numpy_helper.from_array(model.w1, "w1"),
        numpy_helper.from_array(model.b1, "b1"),
        numpy_helper.from_array(model.w2, "w2"),
        numpy_helper.from_array(model.b2, "b2"),
    ]
    nodes = [
        helper.make_node("Sub", [input_name, "mean"], ["centered"]),
        helper.make_node("Div", ["centered", "std"], ["scaled"]),
        helper.make_node("MatMul", ["scaled", "w1"], ["h_mm"]),
        helper.make_node("Add", ["h_mm", "b1"], ["h_pre"]),
        helper.make_node("Relu", ["h_pre"], ["h"]),
        helper.make_node("MatMul", ["h", "w2"], ["z_mm"]),
        helper.make_node("Add", ["z_mm", "b2"], ["z"]),
        helper.make_node("Sigmoid", ["z"], ["prob"]),
        helper.make_node("Reshape", ["prob", "flat"], [output_name]),
    ]
    inits.append(numpy_helper.from_array(np.array([-1], dtype=np.int64), "flat"))
    graph = helper.make_graph(
        nodes,
        "recmesh_ctr_mlp",
        [helper.make_tensor_value_info(input_name, TensorProto.FLOAT, ["batch", d])],
        [helper.make_tensor_value_info(output_name, TensorProto.FLOAT, ["batch"])],
        initializer=inits,
    )
    proto = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    proto.ir_version = 8
    onnx.checker.check_model(proto)
    return proto
