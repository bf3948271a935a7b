"""gRPC InferenceService: batch scoring with schema checks.

A request names the degradation level it wants (0 = full model .. 3); the
response carries the level actually served: the requested one, or the
nearest less degraded level the served version has (recmesh.modeldir).

Readiness: grpc.health "" and "recmesh.v1.InferenceService" go SERVING once
the CTR model is loaded and warmed; the text models load after that, and
TEXT_HEALTH_NAME says when they are in. Until then Embed and Generate shed
with RESOURCE_EXHAUSTED ("not ready"), the lanes' answer for "no room now",
which callers treat as an answer, not as a sick service: it does not count
against their circuit breaker (which also guards Score), and their fallbacks
(semantic recall without the query, extractive summaries) apply.
"""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import numpy.typing as npt
import structlog
from grpc_health.v1 import health_pb2
from prometheus_client import Counter, Gauge

from recmesh.errors import FailedPrecondition, InvalidArgument, ResourceExhausted
from recmesh.evaluation.experiment import CANDIDATE
from recmesh.evaluation.impression import CONTROL
from recmesh.features.block import BlockView
from recmesh.features.vectorize import Vectorizer
from recmesh.features.wire import row_values, table_columns
from recmesh.grpcserver import MeshServer, Registration
from recmesh.metadata import SUGGESTED_LEVEL_KEY
from recmesh.modeldir import LEVELS
from recmesh.resilience import remaining_s
from recmesh.settings import InferenceSettings
from recmesh.v1 import inference_pb2 as pb
from recmesh.v1 import inference_pb2_grpc
from services.inference.batcher import MicroBatcher
from services.inference.lanes import LANE_SHED, Lane, LaneLimits, lower_priority
from services.inference.model import LoadedModel, ModelRegistry, ModelVariant
from services.inference.pressure import SUGGESTED, GpuProbe, suggest_level
from services.inference.textloader import load_text_models
from services.inference.textmodels import TextModels, TextSlot

_log = structlog.get_logger("recmesh.inference")

# grpc.health name that turns SERVING when the text models (Embed, Generate) are loaded.
TEXT_HEALTH_NAME = "recmesh.v1.InferenceService/text"
ROWS = Counter("recmesh_inference_rows_total", "Rows scored.")
ARMS = Counter("recmesh_inference_arm_total", "Score requests by experiment arm.", ("arm",))
SERVED = Counter("recmesh_inference_served_total", "Score requests by level asked and served.",
                 ("requested", "served"))  # fmt: skip
TEXT_TOKENS = Counter("recmesh_inference_text_tokens_total", "Tokens processed by text models.", ["method"])
SCHEMA_MISMATCH = Counter(
    "recmesh_inference_schema_mismatch_total", "Requests refused for a feature schema mismatch."
)
TEXT_READY = Gauge("recmesh_inference_text_ready", "1 once the text models' start-up load has finished.")


def _score_values(request: pb.ScoreRequest) -> npt.NDArray[np.float32]:
    """The request's matrix, flat: from `values_f32` (raw float32 bytes) or `values`."""
    if not request.values_f32:
        return np.asarray(request.values, dtype=np.float32)
    if request.values:
        raise InvalidArgument("set values or values_f32, not both")
    if len(request.values_f32) % 4:
        raise InvalidArgument(f"values_f32 has {len(request.values_f32)} bytes, not a multiple of 4")
    return np.frombuffer(request.values_f32, dtype="<f4").astype(np.float32, copy=False)


class InferenceServicer(inference_pb2_grpc.InferenceServiceServicer):
    def __init__(
        self,
        registry: ModelRegistry,
        settings: InferenceSettings,
        batcher: MicroBatcher | None = None,
        gpu: GpuProbe | None = None,
        text: TextModels | TextSlot | None = None,
    ) -> None:
        self._registry = registry
        self._settings = settings
        self._batcher = batcher
        self._gpu = gpu
        self.text = text if isinstance(text, TextSlot) else TextSlot(text or TextModels())
        self.embed_lane = Lane(
            "embed", LaneLimits(settings.embed_concurrency, settings.embed_max_queue, settings.text_nice)
        )
        self.generate_lane = Lane(
            "generate",
            LaneLimits(settings.generate_concurrency, settings.generate_max_queue, settings.text_nice),
        )

    def _text_models(self, lane: Lane) -> TextModels:
        models = self.text.models
        if models is None:
            LANE_SHED.labels(lane.name, "not_ready").inc()
            raise ResourceExhausted(f"{lane.name} lane not ready: text models still loading; retry shortly")
        return models

    def _suggest(self, context: grpc.aio.ServicerContext) -> None:
        depth = self._batcher.depth if self._batcher is not None else 0
        level = suggest_level(
            self._gpu.memory_ratio() if self._gpu is not None else None,
            depth,
            self._settings.batch_max_queue,
            self._settings.batch_queue_threshold,
        )
        SUGGESTED.set(level)
        context.set_trailing_metadata(((SUGGESTED_LEVEL_KEY, str(level)),))

    async def Score(self, request: pb.ScoreRequest, context: grpc.aio.ServicerContext) -> pb.ScoreResponse:
        if request.level not in LEVELS:
            raise InvalidArgument(f"level {request.level} is not one of {list(LEVELS)}")
        model, level, arm = self._arm(request)
        try:
            matrix = self._matrix(model, request)
        except FailedPrecondition:
            SCHEMA_MISMATCH.inc()
            raise
        rows = len(matrix)
        self._suggest(context)
        variant = model.variant(level)
        SERVED.labels(str(request.level), str(variant.level)).inc()
        ARMS.labels(arm).inc()
        if rows == 0:
            return pb.ScoreResponse(model_version=model.version, level=variant.level, arm=arm)
        scores = await self._run(variant, matrix)
        ROWS.inc(rows)
        resp = pb.ScoreResponse(
            scores=scores.tolist(), model_version=model.version, level=variant.level, arm=arm
        )
        shadow = self._registry.candidate
        experiment = self._registry.experiment
        if shadow is not None and experiment is not None and experiment.shadow and arm == CONTROL:
            # Scored the same way, never served: the candidate's AUC on real answers.
            shadow_scores = await self._run(shadow.variant(level), self._matrix(shadow, request))
            resp.shadow_scores.extend(shadow_scores.tolist())
            resp.shadow_model_version = shadow.version
        return resp

    def _arm(self, request: pb.ScoreRequest) -> tuple[LoadedModel, int, str]:
        """The model, level and experiment arm a request is scored in (a user's arm is sticky,
        recmesh/evaluation/experiment.py; rows without a user are always control)."""
        model, experiment = self._registry.model, self._registry.experiment
        if experiment is None or not request.HasField("user"):
            return model, request.level, CONTROL
        arm = experiment.arm(request.user.entity_id)
        candidate = self._registry.candidate
        if arm == CANDIDATE and candidate is not None:
            return candidate, request.level, arm
        if arm != CONTROL and experiment.kind == "level":
            return model, max(request.level, experiment.level), arm
        return model, request.level, CONTROL

    async def _run(self, variant: ModelVariant, matrix: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        if self._batcher is None:
            return variant.score(matrix)
        # A batch holds one variant's jobs only (take_batch splits on the job's model).
        return await self._batcher.submit(variant, matrix, remaining_s())

    def _served_features(self, model: LoadedModel, request: pb.ScoreRequest, rows: int) -> Vectorizer:
        """The checks of a request that sends served features (a table or a block)."""
        if request.feature_names or request.values or request.values_f32:
            raise InvalidArgument("send items (served features) or rows (feature_names + values), not both")
        if rows > self._settings.max_rows:
            raise InvalidArgument(f"{rows} items; at most {self._settings.max_rows} per request")
        if request.feature_version != model.feature_version:
            raise FailedPrecondition(
                f"feature set {request.feature_version!r} does not match model {model.version} "
                f"(trained on {model.feature_version!r})"
            )
        if model.vectorizer is None:
            raise FailedPrecondition(
                f"model {model.version} declares no input transforms (an older card): "
                "send rows, or retrain it"
            )
        return model.vectorizer

    def _block_matrix(self, model: LoadedModel, request: pb.ScoreRequest) -> npt.NDArray[np.float32]:
        """The input rows of a request that sends its items as a packed block."""
        if request.HasField("items"):
            raise InvalidArgument("send items or item_block, not both")
        block = request.item_block
        vectorizer = self._served_features(model, request, len(block.entity_ids))
        view = BlockView(block, model.feature_version)
        return vectorizer.matrix_from_block(row_values(request.user), view, request.user.entity_id)

    def _matrix(self, model: LoadedModel, request: pb.ScoreRequest) -> npt.NDArray[np.float32]:
        """The request's input rows: built from its served features with the
        model's declared transforms, or the rows the caller built."""
        if request.HasField("item_block"):
            return self._block_matrix(model, request)
        if request.HasField("items"):
            vectorizer = self._served_features(model, request, len(request.items.entity_ids))
            return vectorizer.matrix(
                [row_values(request.user)],
                table_columns(request.items),
                list(request.items.entity_ids),
                [request.user.entity_id],
            )
        cols = len(request.feature_names)
        if cols == 0:
            raise InvalidArgument("send items (served features), or feature_names with values")
        flat = _score_values(request)
        if flat.size % cols:
            raise InvalidArgument(f"values has {flat.size} entries, not a multiple of {cols} columns")
        rows = flat.size // cols
        if rows > self._settings.max_rows:
            raise InvalidArgument(f"{rows} rows; at most {self._settings.max_rows} per request")
        model.check_schema(request.feature_version, list(request.feature_names))
        return flat.reshape(rows, cols)

    async def ModelInfo(
        self, request: pb.ModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInfoResponse:
        model = self._registry.model
        return pb.ModelInfoResponse(
            model_version=model.version,
            feature_version=model.feature_version,
            feature_names=list(model.columns),
            execution_provider=model.provider,
            origin=model.origin,
            features_read=model.features_read,
        )

    async def Embed(self, request: pb.EmbedRequest, context: grpc.aio.ServicerContext) -> pb.EmbedResponse:
        embedder = self._text_models(self.embed_lane).embedder
        if embedder is None:
            raise FailedPrecondition("no embedding model loaded (run `recmesh embed export`)")
        texts = list(request.texts)
        if not texts:
            raise InvalidArgument("texts is empty")
        if len(texts) > self._settings.embed_max_texts:
            raise InvalidArgument(f"{len(texts)} texts; at most {self._settings.embed_max_texts} per request")
        for n, text in enumerate(texts):
            if not text.strip():
                raise InvalidArgument(f"texts[{n}] is blank")
            if len(text) > self._settings.embed_max_chars:
                raise InvalidArgument(
                    f"texts[{n}] has {len(text)} characters; at most {self._settings.embed_max_chars}"
                )
        matrix, tokens = await self.embed_lane.run(lambda: embedder.embed(texts), remaining_s())
        TEXT_TOKENS.labels("Embed").inc(sum(tokens))
        return pb.EmbedResponse(
            values=matrix.reshape(-1).tolist(),
            dim=int(matrix.shape[1]),
            model=embedder.model,
            backend=embedder.backend,
            tokens=tokens,
        )

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> pb.GenerateResponse:
        generator = self._text_models(self.generate_lane).generator
        if generator is None:
            raise FailedPrecondition("no generative model on this inference service")
        if not request.prompt.strip():
            raise InvalidArgument("prompt is empty")
        if request.max_tokens < 1:
            raise InvalidArgument("max_tokens must be >= 1")
        schema = request.json_schema or None
        out = await self.generate_lane.run(
            lambda: generator.generate(request.prompt, request.max_tokens, schema), remaining_s()
        )
        TEXT_TOKENS.labels("Generate").inc(out.prompt_tokens + out.completion_tokens)
        return pb.GenerateResponse(
            text=out.text,
            model=generator.model,
            backend=generator.backend,
            prompt_tokens=out.prompt_tokens,
            completion_tokens=out.completion_tokens,
        )

    async def Capabilities(
        self, request: pb.CapabilitiesRequest, context: grpc.aio.ServicerContext
    ) -> pb.CapabilitiesResponse:
        # While the text models load this says none (the truth for now).
        text = self.text.models or TextModels()
        embedder, generator = text.embedder, text.generator
        return pb.CapabilitiesResponse(
            embedding_model=embedder.model if embedder else "",
            embedding_backend=embedder.backend if embedder else "",
            generation_model=generator.model if generator else "",
            generation_backend=generator.backend if generator else "",
        )


def build_batcher(settings: InferenceSettings) -> MicroBatcher | None:
    if not settings.batching:
        return None
    return MicroBatcher(
        lambda variant, rows: variant.score(rows),
        max_rows=settings.batch_max_rows,
        max_delay_us=settings.batch_max_delay_us,
        max_queue=settings.batch_max_queue,
        solo_rows=settings.batch_solo_rows,
    )


def build_server(
    settings: InferenceSettings,
    registry: ModelRegistry,
    batcher: MicroBatcher | None = None,
    gpu: GpuProbe | None = None,
    text: TextModels | TextSlot | None = None,
) -> MeshServer:
    return MeshServer(
        "inference",
        f"{settings.bind_host}:{settings.inference_port}",
        [
            Registration(
                "recmesh.v1.InferenceService",
                inference_pb2_grpc.add_InferenceServiceServicer_to_server,
                InferenceServicer(registry, settings, batcher, gpu, text),
            )
        ],
    )


async def load_text_into(slot: TextSlot, settings: InferenceSettings, server: MeshServer) -> None:
    """The start-up load of the text models, run once the service is SERVING for
    Score: on its own thread at the text lanes' niceness, so the first Score
    requests get the CPU first; then TEXT_HEALTH_NAME turns SERVING."""
    await server.health.set(TEXT_HEALTH_NAME, health_pb2.HealthCheckResponse.NOT_SERVING)
    started = time.perf_counter()
    pool = ThreadPoolExecutor(1, "text-load", lower_priority, (settings.text_nice,))
    try:
        models = await asyncio.get_running_loop().run_in_executor(pool, load_text_models, settings)
    finally:
        pool.shutdown(wait=False)  # a shutdown during the load must not wait for it
    slot.models = models
    TEXT_READY.set(1)
    await server.health.set(TEXT_HEALTH_NAME, health_pb2.HealthCheckResponse.SERVING)
    for note in models.notes:
        _log.info("text_models", note=note)
    _log.info("text_models_loaded", seconds=round(time.perf_counter() - started, 3),
              embedding=models.embedder.model if models.embedder else None,
              embedding_backend=models.embedder.backend if models.embedder else None,
              generation=models.generator.model if models.generator else None)  # fmt: skip
