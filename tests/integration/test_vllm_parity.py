"""Where vLLM is installed (a GPU machine with `.[gpu,llm]`): its embedding
runner gives the same vectors as the CPU path, within the tolerance the CPU
path meets against sentence-transformers. Skipped where vLLM is absent (CPU CI)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from recmesh.embedding.encoder import TextEncoder

pytest.importorskip("vllm", reason="vLLM is installed only with the llm extra, on a GPU machine")

REFERENCE = json.loads((Path(__file__).parent.parent / "data" / "minilm_reference.json").read_text())


def test_vllm_and_onnx_embeddings_agree(embed_model_dir: Path) -> None:
    from services.inference.vllm_backend import VllmEmbedder

    sentences: list[str] = REFERENCE["sentences"]
    on_gpu, tokens = VllmEmbedder(gpu_memory_utilization=0.3).embed(sentences)
    on_cpu = TextEncoder.from_model_dir(embed_model_dir).encode(sentences)
    cosine = (on_gpu * on_cpu).sum(axis=1)
    assert cosine.min() > 0.9999, cosine
    assert tokens == [len(ids) for ids in REFERENCE["input_ids"]]
    assert np.abs(on_gpu - on_cpu).max() < 1e-3
