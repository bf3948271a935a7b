"""vLLM text models for a GPU machine (`pip install -e '.[gpu,llm]'`; see README).

Importing this module fails without vLLM, which is how textloader.py falls back
to the CPU path. Embeddings: the packaged all-MiniLM-L6-v2 directory through
vLLM's pooling (embedding) runner. Generation: weights from the local
directory RECMESH_GENERATION_MODEL_DIR (never the hub), with JSON-schema guided
decoding when a schema is given. Untested in CI (no GPU there); the CPU path
is the tested one and gives the same embeddings within the tolerance stated in
tests/unit/recmesh/embedding/test_encoder.py.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np
import numpy.typing as npt
import vllm

from recmesh.embedding.weights import MODEL_NAME, packaged_model_dir
from recmesh.settings import InferenceSettings
from services.inference.textmodels import Generated, TextModels

os.environ.setdefault("HF_HUB_OFFLINE", "1")


class VllmEmbedder:
    backend = "vllm"

    def __init__(self, gpu_memory_utilization: float) -> None:
        self.model = MODEL_NAME
        self._llm = vllm.LLM(
            model=str(packaged_model_dir()),
            runner="pooling",
            gpu_memory_utilization=gpu_memory_utilization,
            enforce_eager=True,
        )

    def embed(self, texts: list[str]) -> tuple[npt.NDArray[np.float32], list[int]]:
        outputs: list[Any] = self._llm.embed(texts, use_tqdm=False)
        matrix = np.asarray([o.outputs.embedding for o in outputs], dtype=np.float32)
        matrix /= np.maximum(np.linalg.norm(matrix, axis=1, keepdims=True), 1e-12)
        return matrix, [len(o.prompt_token_ids) for o in outputs]


class VllmGenerator:
    backend = "vllm"

    def __init__(self, model_dir: str, gpu_memory_utilization: float) -> None:
        self.model = os.path.basename(model_dir.rstrip("/"))
        self._llm = vllm.LLM(model=model_dir, gpu_memory_utilization=gpu_memory_utilization, max_num_seqs=256)

    def generate(self, prompt: str, max_tokens: int, json_schema: str | None) -> Generated:
        params: dict[str, Any] = {"max_tokens": max_tokens, "temperature": 0.0}
        if json_schema:
            from vllm.sampling_params import StructuredOutputsParams

            params["structured_outputs"] = StructuredOutputsParams(json=json_schema)
        out: Any = self._llm.generate([prompt], vllm.SamplingParams(**params), use_tqdm=False)[0]
        completion = out.outputs[0]
        return Generated(completion.text, len(out.prompt_token_ids), len(completion.token_ids))


def load(settings: InferenceSettings, models: TextModels) -> TextModels:
    """Both models share the GPU: each gets half of the configured memory share."""
    share = settings.vllm_gpu_memory_utilization
    gen_dir = settings.generation_model_dir
    if gen_dir is not None and (gen_dir / "config.json").exists():
        models.generator = VllmGenerator(str(gen_dir), share / 2)
        models.notes.append(f"generation: vLLM with local weights {gen_dir}")
    else:
        models.notes.append(
            f"no generative weights (RECMESH_GENERATION_MODEL_DIR={gen_dir}): "
            "summarize/action use their CPU fallbacks"
        )
    models.embedder = VllmEmbedder(share / 2 if models.generator else share)
    models.notes.append("embeddings: vLLM pooling runner over the packaged all-MiniLM-L6-v2 weights")
    return models
