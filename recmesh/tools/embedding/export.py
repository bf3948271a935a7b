"""Build the ONNX graph of the sentence encoder from the packaged weights.

The graph is written node by node with `onnx.helper` (no torch): BERT
embeddings, the encoder layers (multi-head self-attention with the padding
mask, exact-erf GELU feed-forward, post-LayerNorm), then what
sentence-transformers does after the transformer for this model: mean pooling
over real tokens and L2 normalisation. Inputs are `input_ids` and
`attention_mask` (int64, [batch, seq]); the output `embedding` is
[batch, hidden] float32 with unit rows. Token types are all 0 for single
sentences, so that row of the token-type table is folded into the embeddings.

Run once by `recmesh embed export` (and by `recmesh up` when missing); the
result lives in MODEL_DIR/embedder/ beside a copy of tokenizer.json and a card.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

from recmesh.embedding.weights import (
    MODEL_NAME,
    BertConfig,
    packaged_model_dir,
    read_config,
    read_safetensors,
)
from recmesh.modeldir import EMBEDDER_DIR
from recmesh.modeldir import ENCODER_FILE as ONNX_FILE

OPSET = 18


class _Graph:
    def __init__(self) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self._n = 0

    def const(self, name: str, value: npt.NDArray[Any]) -> str:
        self.inits.append(numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], **attrs: Any) -> str:
        self._n += 1
        out = f"{op_type.lower()}_{self._n}"
        self.nodes.append(helper.make_node(op_type, inputs, [out], **attrs))
        return out

    def linear(self, x: str, w: npt.NDArray[np.float32], b: npt.NDArray[np.float32], name: str) -> str:
        # torch Linear stores [out, in]; MatMul wants [in, out].
        wt = self.const(f"{name}.weight_t", w.T.astype(np.float32))
        bias = self.const(f"{name}.bias", b.astype(np.float32))
        return self.op("Add", [self.op("MatMul", [x, wt]), bias])

    def ints(self, name: str, values: list[int]) -> str:
        return self.const(name, np.array(values, dtype=np.int64))

    def layer_norm(self, x: str, tensors: dict[str, npt.NDArray[Any]], prefix: str, eps: float) -> str:
        scale = self.const(f"{prefix}.weight", tensors[f"{prefix}.weight"].astype(np.float32))
        bias = self.const(f"{prefix}.bias", tensors[f"{prefix}.bias"].astype(np.float32))
        return self.op("LayerNormalization", [x, scale, bias], axis=-1, epsilon=eps)


@dataclass(frozen=True)
class _LayerInputs:
    """What every encoder layer reads besides its own weights: the padding
    mask's additive bias and the shared constants (names in the graph)."""

    mask_bias: str
    heads_shape: str
    hidden_shape: str
    scale: str
    sqrt2: str
    half: str
    one_f: str


def build_model(tensors: dict[str, npt.NDArray[Any]], cfg: BertConfig) -> onnx.ModelProto:
    g = _Graph()
    x = _embeddings(g, tensors, cfg)
    mask_f = g.op("Cast", ["attention_mask"], to=TensorProto.FLOAT)
    shared = _layer_inputs(g, cfg, mask_f)
    for i in range(cfg.layers):
        x = _encoder_layer(g, tensors, cfg, shared, f"encoder.layer.{i}.", f"l{i}", x)
    _pool_and_normalise(g, x, mask_f)
    graph = helper.make_graph(
        g.nodes,
        "minilm_sentence_encoder",
        [
            helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", TensorProto.INT64, ["batch", "seq"]),
        ],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", cfg.hidden])],
        initializer=g.inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="recmesh")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def _embeddings(g: _Graph, t: dict[str, npt.NDArray[Any]], cfg: BertConfig) -> str:
    """word[ids] + position[0..seq) + token_type[0], then LayerNorm."""
    f32 = np.float32
    word = g.const("word_embeddings", t["embeddings.word_embeddings.weight"].astype(f32))
    pos_table = g.const("position_embeddings", t["embeddings.position_embeddings.weight"].astype(f32))
    type0 = g.const("token_type_0", t["embeddings.token_type_embeddings.weight"][0].astype(f32))
    # Positions 0..seq-1 are the first `seq` rows of the table: Slice it by the (1-D) sequence length.
    seq_len = g.op("Shape", ["input_ids"], start=1, end=2)
    zero = g.ints("zero_1d", [0])
    positions = g.op("Slice", [pos_table, zero, seq_len, zero])
    x = g.op("Add", [g.op("Gather", [word, "input_ids"], axis=0), positions])
    x = g.op("Add", [x, type0])
    return g.layer_norm(x, t, "embeddings.LayerNorm", cfg.layer_norm_eps)


def _layer_inputs(g: _Graph, cfg: BertConfig, mask_f: str) -> _LayerInputs:
    """The padding mask as an additive bias [batch, 1, 1, seq] (0 for tokens,
    -1e4 for padding, as BERT), and the constants the layers share."""
    f32 = np.float32
    neg = g.const("mask_neg", np.array(-10000.0, dtype=f32))
    one_f = g.const("one_f", np.array(1.0, dtype=f32))
    mask_bias = g.op("Mul", [g.op("Sub", [one_f, mask_f]), neg])
    mask_bias = g.op("Unsqueeze", [mask_bias, g.const("axes_1_2", np.array([1, 2], dtype=np.int64))])
    return _LayerInputs(
        mask_bias=mask_bias,
        heads_shape=g.const("heads_shape", np.array([0, 0, cfg.heads, cfg.head_dim], dtype=np.int64)),
        hidden_shape=g.const("hidden_shape", np.array([0, 0, cfg.hidden], dtype=np.int64)),
        scale=g.const("attn_scale", np.array(1.0 / math.sqrt(cfg.head_dim), dtype=f32)),
        sqrt2=g.const("sqrt2", np.array(math.sqrt(2.0), dtype=f32)),
        half=g.const("half", np.array(0.5, dtype=f32)),
        one_f=one_f,
    )


def _encoder_layer(
    g: _Graph, t: dict[str, npt.NDArray[Any]], cfg: BertConfig, s: _LayerInputs, p: str, name: str, x: str
) -> str:
    """One encoder layer (weights under prefix `p`): multi-head self-attention
    with the padding mask, then the exact-GELU feed-forward, each post-LayerNorm."""

    def heads(y: str) -> str:  # [b, s, hidden] -> [b, heads, s, head_dim]
        return g.op("Transpose", [g.op("Reshape", [y, s.heads_shape])], perm=[0, 2, 1, 3])

    def linear(y: str, weights: str, part: str) -> str:
        return g.linear(y, t[p + weights + ".weight"], t[p + weights + ".bias"], f"{name}.{part}")

    q = heads(linear(x, "attention.self.query", "q"))
    k = heads(linear(x, "attention.self.key", "k"))
    v = heads(linear(x, "attention.self.value", "v"))
    scores = g.op("Mul", [g.op("MatMul", [q, g.op("Transpose", [k], perm=[0, 1, 3, 2])]), s.scale])
    probs = g.op("Softmax", [g.op("Add", [scores, s.mask_bias])], axis=-1)
    ctx = g.op(
        "Reshape", [g.op("Transpose", [g.op("MatMul", [probs, v])], perm=[0, 2, 1, 3]), s.hidden_shape]
    )
    attn = linear(ctx, "attention.output.dense", "ao")
    x = g.layer_norm(g.op("Add", [x, attn]), t, p + "attention.output.LayerNorm", cfg.layer_norm_eps)
    h = linear(x, "intermediate.dense", "ff1")
    # Exact GELU: 0.5 * h * (1 + erf(h / sqrt(2))).
    h = g.op(
        "Mul", [g.op("Mul", [h, s.half]), g.op("Add", [g.op("Erf", [g.op("Div", [h, s.sqrt2])]), s.one_f])]
    )
    out = linear(h, "output.dense", "ff2")
    return g.layer_norm(g.op("Add", [x, out]), t, p + "output.LayerNorm", cfg.layer_norm_eps)


def _pool_and_normalise(g: _Graph, x: str, mask_f: str) -> None:
    """Mean pooling over real tokens, then L2 normalisation (sentence-transformers'
    Pooling + Normalize), into the output `embedding`."""
    f32 = np.float32
    m3 = g.op("Unsqueeze", [mask_f, g.const("axes_2", np.array([2], dtype=np.int64))])
    summed = g.op(
        "ReduceSum", [g.op("Mul", [x, m3]), g.const("axes_1", np.array([1], dtype=np.int64))], keepdims=0
    )
    tokens = g.op("ReduceSum", [mask_f, g.ints("axes_1b", [1])], keepdims=1)
    count = g.op("Max", [tokens, g.const("eps_count", np.array(1e-9, dtype=f32))])
    pooled = g.op("Div", [summed, count])
    l2 = g.op("ReduceL2", [pooled, g.ints("axes_last", [-1])], keepdims=1)
    norm = g.op("Max", [l2, g.const("eps_norm", np.array(1e-12, dtype=f32))])
    g.nodes.append(helper.make_node("Div", [pooled, norm], ["embedding"]))


def export(model_dir: Path, source: Path | None = None) -> dict[str, Any]:
    """Write MODEL_DIR/embedder/{encoder.onnx, tokenizer.json, card.json}; returns the card."""
    started = time.perf_counter()
    src = source or packaged_model_dir()
    cfg = read_config(src)
    model = build_model(read_safetensors(src / "model.safetensors"), cfg)
    target = model_dir / EMBEDDER_DIR
    tmp = model_dir / f".{EMBEDDER_DIR}-tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    onnx.save(model, str(tmp / ONNX_FILE))
    shutil.copy(src / "tokenizer.json", tmp / "tokenizer.json")
    card = {
        "model": MODEL_NAME,
        "source": str(src),
        "dim": cfg.hidden,
        "max_seq_length": cfg.max_seq_length,
        "pooling": "mean",
        "normalized": True,
        "opset": OPSET,
        "export_seconds": round(time.perf_counter() - started, 2),
    }
    (tmp / "card.json").write_text(json.dumps(card, indent=2))
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return card
