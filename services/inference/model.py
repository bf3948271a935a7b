"""Loaded models and the model directory.

Layout (recmesh.modeldir): MODEL_DIR/ctr/<version>/ holds card.json and one
ONNX file per degradation level; MODEL_DIR/ctr/CURRENT names the served
version. Every variant of a version gets its own session, loaded and warmed at
start. Writing a new CURRENT switches the served version without a restart:
all of the new version's sessions are loaded and warmed before it replaces the
old one, so no request sees a half-loaded model or a mix of versions.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import onnxruntime as ort
import structlog
from prometheus_client import Gauge, Info

from recmesh.errors import FailedPrecondition, Unavailable
from recmesh.modeldir import LEVELS, current_model, variant_file

_log = structlog.get_logger("recmesh.inference.model")

PROVIDER_INFO = Info("recmesh_inference_execution_provider", "ONNX Runtime provider in use.")
MODEL_INFO = Info("recmesh_inference_model", "Served model version and feature set.")
LOAD_SECONDS = Gauge("recmesh_inference_model_load_seconds", "Time to load and warm the model.")
VARIANT_BYTES = Gauge(
    "recmesh_inference_variant_bytes",
    "ONNX file bytes per degradation variant (its weights; `recmesh bench degrade` measures session memory).",
    ("level",),
)


def choose_providers() -> list[str]:
    """CUDA when onnxruntime-gpu sees a GPU, CPU otherwise."""
    available = ort.get_available_providers()
    if "CUDAExecutionProvider" in available:
        # The GPU image gets CUDA and cuDNN from pip (onnxruntime-gpu[cuda,cudnn]), not from
        # the base image: load them from site-packages before the first session.
        preload = getattr(ort, "preload_dlls", None)
        if preload is not None:
            try:
                preload()
            except Exception as err:  # no driver or no pip CUDA libs: the session falls back to CPU
                _log.warning("cuda_preload_failed", error=repr(err))
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


@dataclass(frozen=True)
class ModelVariant:
    """One degradation level's ONNX Runtime session."""

    level: int
    session: ort.InferenceSession
    input_name: str
    file_bytes: int

    def score(self, matrix: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        out = self.session.run(None, {self.input_name: matrix})[0]
        return np.asarray(out, dtype=np.float32).reshape(-1)


@dataclass(frozen=True)
class LoadedModel:
    version: str
    feature_version: str
    columns: tuple[str, ...]
    input_name: str
    variants: dict[int, ModelVariant]
    provider: str
    path: Path

    def variant(self, level: int) -> ModelVariant:
        """The variant for a requested level: that level if this version has
        it, else the nearest lower (less degraded) one; level 0 always exists."""
        return self.variants[max(lv for lv in self.variants if lv <= level)]

    def check_schema(self, feature_version: str, columns: list[str]) -> None:
        if feature_version != self.feature_version:
            raise FailedPrecondition(
                f"feature set {feature_version!r} does not match model {self.version} "
                f"(trained on {self.feature_version!r})"
            )
        if tuple(columns) != self.columns:
            missing = sorted(set(self.columns) - set(columns))
            extra = sorted(set(columns) - set(self.columns))
            raise FailedPrecondition(
                f"input columns do not match model {self.version}: missing {missing}, "
                f"unexpected {extra}" + ("" if missing or extra else ", order differs")
            )

    def score(self, matrix: npt.NDArray[np.float32], level: int = 0) -> npt.NDArray[np.float32]:
        return self.variant(level).score(matrix)


def load_variant(
    path: Path, level: int, input_name: str, width: int, opts: ort.SessionOptions
) -> ModelVariant:
    file = path / variant_file(level)
    session = ort.InferenceSession(str(file), opts, providers=choose_providers())
    variant = ModelVariant(level, session, input_name, file.stat().st_size)
    # Warm-up: the first runs allocate and pick kernels; do it before serving.
    for rows in (1, 64, 512):
        variant.score(np.zeros((rows, width), dtype=np.float32))
    return variant


def session_options(threads: int = 1) -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return opts


def load(path: Path, threads: int = 1) -> LoadedModel:
    started = time.perf_counter()
    card: dict[str, Any] = json.loads((path / "card.json").read_text())
    opts = session_options(threads)
    columns = tuple(card["input"]["columns"])
    input_name = card["input"]["name"]
    variants = {
        level: load_variant(path, level, input_name, len(columns), opts)
        for level in LEVELS
        if (path / variant_file(level)).exists()
    }
    model = LoadedModel(
        version=card["version"],
        feature_version=card["feature_set_version"],
        columns=columns,
        input_name=input_name,
        variants=variants,
        provider=variants[0].session.get_providers()[0],
        path=path,
    )
    LOAD_SECONDS.set(time.perf_counter() - started)
    for v in variants.values():
        VARIANT_BYTES.labels(str(v.level)).set(v.file_bytes)
    return model


class ModelRegistry:
    """The served model, following MODEL_DIR's CURRENT pointer."""

    def __init__(self, model_dir: Path, threads: int = 1) -> None:
        self._dir = model_dir
        self._threads = threads
        self._model: LoadedModel | None = None

    @property
    def model(self) -> LoadedModel:
        if self._model is None:
            raise Unavailable("no model loaded")
        return self._model

    def load_current(self) -> LoadedModel:
        path = current_model(self._dir)
        if path is None:
            raise FileNotFoundError(f"no model in {self._dir} (run `recmesh train`)")
        if self._model is None or self._model.path != path:
            model = load(path, self._threads)
            self._model = model
            PROVIDER_INFO.info({"provider": model.provider})
            MODEL_INFO.info({"version": model.version, "feature_set": model.feature_version})
            sizes = {str(level): v.file_bytes for level, v in model.variants.items()}
            _log.info(
                "model_loaded", version=model.version, provider=model.provider, variant_file_bytes=sizes
            )
        return self._model

    async def follow(self, interval_s: float = 2.0) -> None:
        """Poll CURRENT and switch versions when it changes."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await asyncio.to_thread(self.load_current)
            except Exception as err:  # keep serving the old model
                _log.warning("model_reload_failed", error=repr(err))
