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
from recmesh.evaluation.experiment import Experiment, read_experiment
from recmesh.features.repository import FeatureSet
from recmesh.features.vectorize import Vectorizer, check_against, transforms_from_card
from recmesh.modeldir import LEVELS, MODEL_NAME, current_model, variant_file

_log = structlog.get_logger("recmesh.inference.model")

PROVIDER_INFO = Info("recmesh_inference_execution_provider", "ONNX Runtime provider in use.")
MODEL_INFO = Info(
    "recmesh_inference_model",
    "Served model version, feature set and model_origin (demo: trained on the demo's generated data).",
)
EXPERIMENT_INFO = Info(
    "recmesh_inference_experiment",
    "The experiment this inference service splits traffic for (id empty: none).",
)
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
    output_name: str | None = None  # None: the model's one output

    def score(self, matrix: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        wanted = None if self.output_name is None else [self.output_name]
        out = self.session.run(wanted, {self.input_name: matrix})[0]
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
    # Builds the input matrix from served features (None: the card declares no transforms).
    vectorizer: Vectorizer | None = None
    origin: str = "unknown"

    @property
    def features_read(self) -> list[str]:
        if self.vectorizer is None:
            return []
        return sorted(f"{e}.{n}" for e, n in self.vectorizer.features())

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
    path: Path,
    level: int,
    input_name: str,
    width: int,
    opts: ort.SessionOptions,
    output_name: str | None = None,
) -> ModelVariant:
    file = path / variant_file(level)
    try:
        session = ort.InferenceSession(str(file), opts, providers=choose_providers())
    except Exception as err:  # ONNX Runtime raises its own exception types
        raise FailedPrecondition(f"{file}: ONNX Runtime cannot load it: {err}") from None
    inputs = {i.name: i for i in session.get_inputs()}
    if input_name not in inputs or len(inputs) != 1:
        raise FailedPrecondition(
            f"{file}: the card's input {input_name!r} is not the model's one input ({sorted(inputs)})"
        )
    shape = inputs[input_name].shape
    if len(shape) != 2 or (isinstance(shape[1], int) and shape[1] != width):
        raise FailedPrecondition(
            f"{file}: input {input_name!r} has shape {shape}; the card's columns make [batch, {width}]"
        )
    outputs = [o.name for o in session.get_outputs()]
    if output_name is not None and output_name not in outputs:
        raise FailedPrecondition(f"{file}: no output {output_name!r} (outputs: {outputs})")
    if output_name is None and len(outputs) != 1:
        raise FailedPrecondition(
            f"{file}: {len(outputs)} outputs {outputs}; name the score in the card's output"
        )
    if output_name is not None and len(outputs) == 1:
        output_name = None  # the one output: run it without naming it
    variant = ModelVariant(level, session, input_name, file.stat().st_size, output_name)
    # A score per row: [batch] or [batch, 1].
    probe = variant.score(np.zeros((2, width), dtype=np.float32))
    if probe.shape != (2,):
        raise FailedPrecondition(
            f"{file}: 2 rows gave {probe.shape[0]} scores; a score model gives one per row"
        )
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


def read_card(path: Path, feature_set: FeatureSet | None = None) -> tuple[dict[str, Any], Vectorizer | None]:
    """A version's card and the vectorizer of its declared inputs, validated:
    the transforms against the served feature set (when given), the columns
    against the transforms. Raises FailedPrecondition naming what is wrong."""
    where = path / "card.json"
    try:
        card: dict[str, Any] = json.loads(where.read_text())
        columns = list(card["input"]["columns"])
        missing = [k for k in ("version", "feature_set_version") if k not in card]
        if "name" not in card["input"]:
            missing.append("input.name")
        if missing:
            raise KeyError(", ".join(missing))
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise FailedPrecondition(f"{where}: not a usable model card ({type(err).__name__}: {err})") from None
    raw = card["input"].get("transforms")
    if raw is None:
        return card, None
    try:
        transforms = transforms_from_card(raw)
    except (TypeError, ValueError) as err:
        raise FailedPrecondition(f"{where}: input.transforms: {err}") from None
    vectorizer = Vectorizer(transforms)
    if vectorizer.columns != columns:
        raise FailedPrecondition(
            f"{where}: input.columns ({len(columns)}) are not the columns its transforms make "
            f"({len(vectorizer.columns)}: {vectorizer.columns[:5]}...)"
        )
    if feature_set is not None:
        if card["feature_set_version"] != feature_set.version:
            raise FailedPrecondition(
                f"{where}: model {card['version']} was built on feature set {card['feature_set_version']!r}, "
                f"but this mesh serves {feature_set.version!r} (repository {feature_set.name!r}): retrain it "
                "(recmesh train) or set its feature_set_version after checking its inputs"
            )
        problems = check_against(transforms, feature_set)
        if problems:
            raise FailedPrecondition(f"{where}: " + "; ".join(problems))
    return card, vectorizer


def load(path: Path, threads: int = 1, feature_set: FeatureSet | None = None) -> LoadedModel:
    started = time.perf_counter()
    card, vectorizer = read_card(path, feature_set)
    opts = session_options(threads)
    columns = tuple(card["input"]["columns"])
    input_name = card["input"]["name"]
    output_name = card.get("output", {}).get("name")
    variants = {
        level: load_variant(path, level, input_name, len(columns), opts, output_name)
        for level in LEVELS
        if (path / variant_file(level)).exists()
    }
    if 0 not in variants:
        raise FailedPrecondition(f"{path}: no {variant_file(0)}")
    model = LoadedModel(
        version=card["version"],
        feature_version=card["feature_set_version"],
        columns=columns,
        input_name=input_name,
        variants=variants,
        provider=variants[0].session.get_providers()[0],
        path=path,
        vectorizer=vectorizer,
        origin=str(card.get("origin", "unknown")),
    )
    LOAD_SECONDS.set(time.perf_counter() - started)
    for v in variants.values():
        VARIANT_BYTES.labels(str(v.level)).set(v.file_bytes)
    return model


class ModelRegistry:
    """The served model, following MODEL_DIR's CURRENT pointer; checked against
    the served feature set `fs` when given."""

    def __init__(self, model_dir: Path, threads: int = 1, feature_set: FeatureSet | None = None) -> None:
        self._dir = model_dir
        self._threads = threads
        self._feature_set = feature_set
        self._model: LoadedModel | None = None
        self._experiment: Experiment | None = None  # running, and its candidate loaded
        self._candidate: LoadedModel | None = None

    @property
    def model(self) -> LoadedModel:
        if self._model is None:
            raise Unavailable("no model loaded")
        return self._model

    @property
    def experiment(self) -> Experiment | None:
        """The running experiment (recmesh/evaluation/experiment.py), or None."""
        return self._experiment

    @property
    def candidate(self) -> LoadedModel | None:
        """A running model experiment's candidate, loaded and warmed."""
        return self._candidate

    def load_experiment(self) -> None:
        """Follow MODEL_DIR/ctr/EXPERIMENT: load a running model experiment's candidate
        (checked like CURRENT) before its split takes effect; drop it once it ended.
        A file that does not parse or a candidate that does not load leaves no
        experiment running here, and says why."""
        try:
            exp = read_experiment(self._dir)
            if exp is not None and exp.running and exp.kind == "model":
                path = self._dir / MODEL_NAME / exp.candidate
                if self._candidate is None or self._candidate.path != path:
                    self._candidate = load(path, self._threads, self._feature_set)
            else:
                self._candidate = None
        except Exception as err:  # a bad file or candidate must never stop the served model
            if self._experiment is not None or self._candidate is not None:
                _log.warning("experiment_not_followed", error=repr(err))
            self._experiment, self._candidate = None, None
            EXPERIMENT_INFO.info({"id": "", "arm": "", "share": "0", "shadow": "false"})
            return
        running = exp if exp is not None and exp.running else None
        if running != self._experiment:
            _log.info("experiment_followed", experiment=None if running is None else running.describe())
            EXPERIMENT_INFO.info({
                "id": running.id if running else "", "arm": running.arm_name if running else "",
                "share": f"{running.share:g}" if running else "0",
                "shadow": str(bool(running and running.shadow)).lower(),
            })  # fmt: skip
        self._experiment = running

    def load_current(self) -> LoadedModel:
        path = current_model(self._dir)
        if path is None:
            raise FileNotFoundError(f"no model in {self._dir} (run `recmesh train`)")
        if self._model is None or self._model.path != path:
            model = load(path, self._threads, self._feature_set)
            self._model = model
            PROVIDER_INFO.info({"provider": model.provider})
            MODEL_INFO.info(
                {"version": model.version, "feature_set": model.feature_version, "model_origin": model.origin}
            )
            sizes = {str(level): v.file_bytes for level, v in model.variants.items()}
            _log.info(
                "model_loaded", version=model.version, provider=model.provider, variant_file_bytes=sizes,
                model_origin=model.origin,
            )  # fmt: skip
            if model.origin == "demo":
                _log.warning(
                    "serving_demo_model",
                    version=model.version,
                    detail="this model was trained on the demo's generated data, not on your events: "
                    "train yours with `recmesh train --events LOG` or bring one (`recmesh models activate`)",
                )
        self.load_experiment()
        return self._model

    async def follow(self, interval_s: float = 2.0) -> None:
        """Poll CURRENT and switch versions when it changes."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await asyncio.to_thread(self.load_current)
            except Exception as err:  # keep serving the old model
                _log.warning("model_reload_failed", error=repr(err))
