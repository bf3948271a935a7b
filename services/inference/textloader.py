"""Which text models this process serves: the GPU path (vllm_backend.py, the
`gpu` and `llm` extras) when RECMESH_TEXT_BACKEND asks for it and vLLM imports,
else embeddings on ONNX Runtime CPU and no generator.

The encoder module (tokenizers) and vLLM are imported only when the models
load, off the start-up path.
"""

from __future__ import annotations

from pathlib import Path

from recmesh.modeldir import EMBEDDER_DIR
from recmesh.settings import InferenceSettings
from services.inference.textmodels import OnnxEmbedder, TextModels


def load_text_models(settings: InferenceSettings) -> TextModels:
    """What this process can serve; every absence is explained in `notes`."""
    models = TextModels()
    if settings.text_backend in ("vllm", "auto"):
        try:
            from services.inference import vllm_backend
        except ImportError as err:
            if settings.text_backend == "vllm":
                raise
            models.notes.append(
                f"vLLM not installed ({err.name}): embeddings on ONNX Runtime CPU, no generation"
            )
        else:
            return vllm_backend.load(settings, models)
    return _load_onnx(settings.model_dir, settings.embed_ort_threads, models)


def _load_onnx(model_dir: Path, threads: int, models: TextModels) -> TextModels:
    if (model_dir / EMBEDDER_DIR).exists():
        from recmesh.embedding.encoder import TextEncoder

        models.embedder = OnnxEmbedder(TextEncoder.from_model_dir(model_dir, threads))
    else:
        models.notes.append(f"no {model_dir / EMBEDDER_DIR}: Embed unavailable until `recmesh embed export`")
    models.notes.append("no generative model on this backend: summarize/action use their CPU fallbacks")
    return models
