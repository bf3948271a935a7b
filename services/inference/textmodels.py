"""Text models behind two small interfaces, so the servicer does not care
which runtime serves them: `Embedder` (sentence vectors) and `Generator`
(text, optionally JSON-schema guided). The CPU path is ONNX Runtime for
embeddings and no generator; the GPU path (vllm_backend.py, `gpu` extra) is
chosen by RECMESH_TEXT_BACKEND and only when vLLM imports (the `llm` extra).

Text models load after the service is SERVING for `Score` (see __main__): a
`TextSlot` is empty until then, and the Embed/Generate lanes shed with
RESOURCE_EXHAUSTED ("not ready") meanwhile. The encoder module (tokenizers)
is imported only when an encoder is loaded, off the start-up path.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt
import structlog

from recmesh.modeldir import EMBEDDER_DIR
from recmesh.settings import InferenceSettings

if TYPE_CHECKING:
    from recmesh.embedding.encoder import TextEncoder

_log = structlog.get_logger("recmesh.inference")


class Embedder(Protocol):
    model: str
    backend: str

    def embed(self, texts: list[str]) -> tuple[npt.NDArray[np.float32], list[int]]:
        """([len(texts), dim] unit rows, tokens per text)."""
        ...


@dataclass(frozen=True)
class Generated:
    text: str
    prompt_tokens: int
    completion_tokens: int


class Generator(Protocol):
    model: str
    backend: str

    def generate(self, prompt: str, max_tokens: int, json_schema: str | None) -> Generated: ...


class OnnxEmbedder:
    backend = "onnxruntime-cpu"

    def __init__(self, encoder: TextEncoder) -> None:
        self._encoder = encoder
        self.model = encoder.model

    def embed(self, texts: list[str]) -> tuple[npt.NDArray[np.float32], list[int]]:
        encoded = self._encoder.tokenize(texts)
        return self._encoder.run(encoded), [int(n) for n in encoded.attention_mask.sum(axis=1)]


@dataclass
class TextModels:
    embedder: Embedder | None = None
    generator: Generator | None = None
    notes: list[str] = field(default_factory=list)  # said once at start-up


class TextSlot:
    """The text models as the servicer sees them: `models` is None while the
    start-up load runs (Score is served meanwhile), then what was loaded."""

    def __init__(self, models: TextModels | None = None) -> None:
        self.models = models


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
