"""gRPC RankerService."""

from __future__ import annotations

import grpc

from recmesh.errors import InvalidArgument
from recmesh.grpcserver import MeshServer, Registration
from recmesh.metadata import SKIP_HEADER
from recmesh.settings import RankerSettings
from recmesh.v1 import features_pb2, ranker_pb2, ranker_pb2_grpc
from services.ranker.pipeline import RankPipeline

MAX_COUNT = 500


class RankerServicer(ranker_pb2_grpc.RankerServiceServicer):
    def __init__(self, pipeline: RankPipeline) -> None:
        self._pipeline = pipeline

    async def Rank(
        self, request: ranker_pb2.RankRequest, context: grpc.aio.ServicerContext
    ) -> ranker_pb2.RankResponse:
        if not request.user_id:
            raise InvalidArgument("user_id is required")
        if not 0 < request.count <= MAX_COUNT:
            raise InvalidArgument(f"count must be in 1..{MAX_COUNT}")
        skip = _skipped(context.invocation_metadata())
        ranked = await self._pipeline.rank(
            request.user_id,
            request.count,
            request.as_of_ms,
            dict(request.context),
            skip=frozenset(skip),
        )
        shadow = ranked.shadow
        return ranker_pb2.RankResponse(
            items=[features_pb2.ScoredItem(item_id=i, score=s) for i, s in ranked.items],
            model_version=ranked.model_version,
            feature_version=ranked.feature_version,
            degraded=ranked.degraded,
            recall_counts=ranked.recall_counts,
            sigma=ranked.sigma,
            arm=ranked.arm,
            shadow_scores=[] if shadow is None else [shadow.scores.get(i, 0.0) for i, _ in ranked.items],
            shadow_model_version="" if shadow is None else shadow.model_version,
        )


def _skipped(metadata: object) -> set[str]:
    """The dependencies the caller asked this request not to call (SKIP_HEADER)."""
    for key, value in metadata or ():  # type: ignore[attr-defined]
        if key == SKIP_HEADER:
            return {part.strip() for part in str(value).split(",") if part.strip()}
    return set()


def build_server(settings: RankerSettings, pipeline: RankPipeline) -> MeshServer:
    return MeshServer(
        "ranker",
        f"{settings.bind_host}:{settings.ranker_port}",
        [Registration("recmesh.v1.RankerService", ranker_pb2_grpc.add_RankerServiceServicer_to_server,
                      RankerServicer(pipeline))],
    )  # fmt: skip
