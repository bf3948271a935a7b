"""The public gRPC API: recmesh.v1.Recommender, the twin of POST /v1/recommend.

The server's request interceptor labels and scopes each call with the class
the edge grants (`Edge.classify_grpc`, decided once per call); the servicer
takes that caller, is admitted by the edge and answers errors as the edge
maps them (edge.py), as the REST route does.
"""

from __future__ import annotations

import grpc

from recmesh.errors import RecmeshError
from recmesh.grpcserver import MeshServer, Registration
from recmesh.metadata import REQUEST_ID_HEADER, SLO_HEADER
from recmesh.settings import GatewaySettings
from recmesh.v1 import features_pb2, recommender_pb2, recommender_pb2_grpc
from services.gateway.edge import Caller, Edge, abort_grpc
from services.gateway.recommend import Recommender

# A request's count when it sets none (proto3 sends 0), as REST's default.
DEFAULT_COUNT = 10


class RecommenderServicer(recommender_pb2_grpc.RecommenderServicer):
    def __init__(self, recommender: Recommender, edge: Edge) -> None:
        self._recommender = recommender
        self._edge = edge

    async def Recommend(
        self, request: recommender_pb2.RecommendRequest, context: grpc.aio.ServicerContext
    ) -> recommender_pb2.RecommendResponse:
        caller: Caller | None = None
        user_id, count, ctx = request.user_id, request.count or DEFAULT_COUNT, dict(request.context)
        try:
            caller = self._edge.grpc_caller(context)
            self._recommender.check(user_id, count)
            async with self._edge.admit(caller) as admitted:
                rec = await self._recommender.recommend(user_id, count, ctx, admitted)
        except RecmeshError as err:
            await abort_grpc(context, err, None if caller is None else caller.slo.name)
        # The granted class, as REST's x-slo-class response header.
        await context.send_initial_metadata(
            ((SLO_HEADER, rec.slo_class), (REQUEST_ID_HEADER, rec.request_id))
        )
        return recommender_pb2.RecommendResponse(
            items=[features_pb2.ScoredItem(item_id=i, score=s) for i, s in rec.items],
            slo_class=rec.slo_class,
            trace_id=rec.trace_id,
            model_version=rec.model_version,
            feature_version=rec.feature_version,
            degraded=rec.degraded,
            request_id=rec.request_id,
        )


def build_grpc_server(settings: GatewaySettings, recommender: Recommender, edge: Edge) -> MeshServer:
    return MeshServer(
        "gateway",
        f"{settings.bind_host}:{settings.gateway_grpc_port}",
        [
            Registration(
                "recmesh.v1.Recommender",
                recommender_pb2_grpc.add_RecommenderServicer_to_server,
                RecommenderServicer(recommender, edge),
            )
        ],
        classify=edge.classify_grpc(),
        public=True,  # callers authenticate with API keys; TLS as RECMESH_GATEWAY_GRPC_TLS says
    )
