"""gRPC InferenceService: batch scoring with schema checks.

A request names the degradation level it wants (0 = full model .. 3); the
response carries the level actually served: the requested one, or the
nearest less degraded level the served version has (recmesh.modeldir).
"""

from __future__ import annotations

import grpc
import numpy as np
from prometheus_client import Counter

from recmesh.errors import FailedPrecondition, InvalidArgument
from recmesh.grpcserver import MeshServer, Registration
from recmesh.modeldir import LEVELS
from recmesh.resilience import remaining_s
from recmesh.settings import InferenceSettings
from recmesh.v1 import inference_pb2 as pb
from recmesh.v1 import inference_pb2_grpc
from services.inference.batcher import MicroBatcher
from services.inference.model import ModelRegistry
from services.inference.pressure import SUGGESTED, SUGGESTED_LEVEL_KEY, GpuProbe, suggest_level

ROWS = Counter("recmesh_inference_rows_total", "Rows scored.")
SERVED = Counter("recmesh_inference_served_total", "Score requests by level asked and served.",
                 ("requested", "served"))  # fmt: skip
SCHEMA_MISMATCH = Counter(
    "recmesh_inference_schema_mismatch_total", "Requests refused for a feature schema mismatch."
)


class InferenceServicer(inference_pb2_grpc.InferenceServiceServicer):
    def __init__(
        self,
        registry: ModelRegistry,
        settings: InferenceSettings,
        batcher: MicroBatcher | None = None,
        gpu: GpuProbe | None = None,
    ) -> None:
        self._registry = registry
        self._settings = settings
        self._batcher = batcher
        self._gpu = gpu

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
        model = self._registry.model
        cols = len(request.feature_names)
        if cols == 0:
            raise InvalidArgument("feature_names is empty")
        if len(request.values) % cols:
            raise InvalidArgument(
                f"values has {len(request.values)} entries, not a multiple of {cols} columns"
            )
        rows = len(request.values) // cols
        if request.level not in LEVELS:
            raise InvalidArgument(f"level {request.level} is not one of {list(LEVELS)}")
        if rows > self._settings.max_rows:
            raise InvalidArgument(f"{rows} rows; at most {self._settings.max_rows} per request")
        try:
            model.check_schema(request.feature_version, list(request.feature_names))
        except FailedPrecondition:
            SCHEMA_MISMATCH.inc()
            raise
        self._suggest(context)
        variant = model.variant(request.level)
        SERVED.labels(str(request.level), str(variant.level)).inc()
        if rows == 0:
            return pb.ScoreResponse(model_version=model.version, level=variant.level)
        matrix = np.asarray(request.values, dtype=np.float32).reshape(rows, cols)
        if self._batcher is None:
            scores = variant.score(matrix)
        else:
            # A batch holds one variant's jobs only (take_batch splits on the job's model).
            scores = await self._batcher.submit(variant, matrix, remaining_s())
        ROWS.inc(rows)
        return pb.ScoreResponse(scores=scores.tolist(), model_version=model.version, level=variant.level)

    async def ModelInfo(
        self, request: pb.ModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInfoResponse:
        model = self._registry.model
        return pb.ModelInfoResponse(
            model_version=model.version,
            feature_version=model.feature_version,
            feature_names=list(model.columns),
            execution_provider=model.provider,
        )


def build_batcher(settings: InferenceSettings) -> MicroBatcher | None:
    if not settings.batching:
        return None
    return MicroBatcher(
        lambda variant, rows: variant.score(rows),
        max_rows=settings.batch_max_rows,
        max_delay_us=settings.batch_max_delay_us,
        max_queue=settings.batch_max_queue,
    )


def build_server(
    settings: InferenceSettings,
    registry: ModelRegistry,
    batcher: MicroBatcher | None = None,
    gpu: GpuProbe | None = None,
) -> MeshServer:
    return MeshServer(
        "inference",
        f"{settings.bind_host}:{settings.inference_port}",
        [
            Registration(
                "recmesh.v1.InferenceService",
                inference_pb2_grpc.add_InferenceServiceServicer_to_server,
                InferenceServicer(registry, settings, batcher, gpu),
            )
        ],
    )
