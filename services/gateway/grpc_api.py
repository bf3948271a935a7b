"""The public gRPC API: recmesh.v1.Recommender, the twin of POST /v1/recommend."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import grpc

from recmesh.grpcserver import Classify, MeshServer, Registration
from recmesh.metadata import SLO_HEADER
from recmesh.settings import GatewaySettings
from recmesh.v1 import features_pb2, recommender_pb2, recommender_pb2_grpc
from services.gateway.recommend import ClassPolicy, Recommender

# A request's count when it sets none (proto3 sends 0), as REST's default.
DEFAULT_COUNT = 10


class RecommenderServicer(recommender_pb2_grpc.RecommenderServicer):
    def __init__(self, recommender: Recommender, policy: ClassPolicy) -> None:
        self._recommender = recommender
        self._policy = policy

    async def Recommend(
        self, request: recommender_pb2.RecommendRequest, context: grpc.aio.ServicerContext
    ) -> recommender_pb2.RecommendResponse:
        metadata = {k: v for k, v in (context.invocation_metadata() or ())}
        decision = self._policy.decide(metadata)
        rec = await self._recommender.recommend(
            request.user_id, request.count or DEFAULT_COUNT, dict(request.context), decision
        )
        # The granted class, as REST's x-slo-class response header.
        await context.send_initial_metadata(((SLO_HEADER, rec.slo_class),))
        return recommender_pb2.RecommendResponse(
            items=[features_pb2.ScoredItem(item_id=i, score=s) for i, s in rec.items],
            slo_class=rec.slo_class,
            trace_id=rec.trace_id,
            model_version=rec.model_version,
            feature_version=rec.feature_version,
            degraded=rec.degraded,
        )


def granted_class(policy: ClassPolicy) -> Classify:
    """What the public server labels and scopes a call with: the class the
    caller is granted (its header capped by its entitlement), as REST does;
    "invalid" when the class or the key is refused."""

    def classify(metadata: Mapping[str, Any]) -> str:
        try:
            return policy.decide(metadata).slo.name
        except Exception:
            return "invalid"

    return classify


def build_grpc_server(settings: GatewaySettings, recommender: Recommender, policy: ClassPolicy) -> MeshServer:
    return MeshServer(
        "gateway",
        f"{settings.bind_host}:{settings.gateway_grpc_port}",
        [
            Registration(
                "recmesh.v1.Recommender",
                recommender_pb2_grpc.add_RecommenderServicer_to_server,
                RecommenderServicer(recommender, policy),
            )
        ],
        classify=granted_class(policy),
        public=True,  # callers authenticate with API keys; TLS as RECMESH_GATEWAY_GRPC_TLS says
    )
