"""Sentence encoder on CPU: the model's own WordPiece tokenizer (tokenizer.json
through `tokenizers`) and the exported ONNX graph through ONNX Runtime."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
from tokenizers import Tokenizer

from recmesh.modeldir import EMBEDDER_DIR
from recmesh.modeldir import ENCODER_FILE as ONNX_FILE


@dataclass(frozen=True)
class Encoded:
    input_ids: npt.NDArray[np.int64]
    attention_mask: npt.NDArray[np.int64]

    @property
    def tokens(self) -> int:
        return int(self.attention_mask.sum())


def load_tokenizer(path: Path, max_length: int) -> Tokenizer:
    tok = Tokenizer.from_file(str(path))
    tok.enable_truncation(max_length=max_length)
    tok.enable_padding(pad_id=0, pad_token="[PAD]")
    return tok


class TextEncoder:
    """all-MiniLM-L6-v2 sentence embeddings (unit vectors) from MODEL_DIR/embedder/."""

    def __init__(self, directory: Path, intra_op_threads: int = 1) -> None:
        if not (directory / ONNX_FILE).exists():
            raise FileNotFoundError(f"{directory / ONNX_FILE} missing: run `recmesh embed export`")
        self.card: dict[str, Any] = json.loads((directory / "card.json").read_text())
        self.model = str(self.card["model"])
        self.dim = int(self.card["dim"])
        self.tokenizer = load_tokenizer(directory / "tokenizer.json", int(self.card["max_seq_length"]))
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = intra_op_threads
        opts.inter_op_num_threads = 1
        self._session = ort.InferenceSession(
            str(directory / ONNX_FILE), sess_options=opts, providers=["CPUExecutionProvider"]
        )

    @classmethod
    def from_model_dir(cls, model_dir: Path, intra_op_threads: int = 1) -> TextEncoder:
        return cls(model_dir / EMBEDDER_DIR, intra_op_threads)

    def tokenize(self, texts: list[str]) -> Encoded:
        batch = self.tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in batch], dtype=np.int64)
        mask = np.array([e.attention_mask for e in batch], dtype=np.int64)
        return Encoded(ids.reshape(len(texts), -1), mask.reshape(len(texts), -1))

    def count_tokens(self, text: str) -> int:
        """Tokens the model would see for `text` (with [CLS]/[SEP], after truncation)."""
        return len(self.tokenizer.encode(text).ids)

    def run(self, encoded: Encoded) -> npt.NDArray[np.float32]:
        out = self._session.run(
            ["embedding"], {"input_ids": encoded.input_ids, "attention_mask": encoded.attention_mask}
        )[0]
        return np.asarray(out, dtype=np.float32)

    def encode(self, texts: list[str]) -> npt.NDArray[np.float32]:
        """[len(texts), dim] float32, rows L2-normalised."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return self.run(self.tokenize(texts))
