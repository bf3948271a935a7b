"""Text models behind two small interfaces, so the servicer does not care
which runtime serves them: `Embedder` (sentence vectors) and `Generator`
(text, optionally JSON-schema guided). The CPU path is ONNX Runtime for
embeddings (`OnnxEmbedder`) and no generator; the GPU path is
vllm_backend.py. textloader.py chooses between them.

Text models load after the service is SERVING for `Score` (see __main__): a
`TextSlot` is empty until then, and the Embed/Generate lanes shed with
RESOURCE_EXHAUSTED ("not ready") meanwhile.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import numpy as np
import numpy.typing as npt
import structlog

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
