"""Typed clients for the mesh's gRPC services, one small method per RPC.

Handlers never touch stubs: each method derives its timeout from the request
budget (resilience.call_timeout), sends the SLO class as metadata, records the
call's latency, and translates gRPC errors into the recmesh hierarchy here and
only here. Channels carry OpenTelemetry client interceptors, so `traceparent`
travels on every hop.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import numpy as np
import numpy.typing as npt
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.instrumentation.grpc import aio_client_interceptors

from recmesh.errors import RecmeshError, Unavailable, from_grpc
from recmesh.resilience import call_timeout, current_slo_class
from recmesh.slo import SLO_HEADER
from recmesh.telemetry import DOWNSTREAM_LATENCY
from recmesh.v1 import (
    features_pb2,
    features_pb2_grpc,
    inference_pb2,
    inference_pb2_grpc,
    ranker_pb2,
    ranker_pb2_grpc,
)

R = TypeVar("R")

CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", 16 * 1024 * 1024),
    ("grpc.max_send_message_length", 16 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.enable_retries", 0),  # retries happen at one layer only, not in the channel
)


def open_channel(address: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS, interceptors=aio_client_interceptors())


class GrpcClient:
    target = "unknown"

    def __init__(self, address: str, caller: str, margin_ms: float = 5.0) -> None:
        self.address = address
        self._caller = caller
        self._margin_s = margin_ms / 1000
        self.channel = open_channel(address)
        self._health = health_pb2_grpc.HealthStub(self.channel)

    async def _call(
        self,
        method: str,
        rpc: Callable[..., Awaitable[R]],
        request: Any,
        cap_s: float | None = None,
    ) -> R:
        response, _ = await self._call_with_trailers(method, rpc, request, cap_s, want_trailers=False)
        return response

    async def _call_with_trailers(
        self,
        method: str,
        rpc: Callable[..., Awaitable[R]],
        request: Any,
        cap_s: float | None = None,
        want_trailers: bool = True,
    ) -> tuple[R, dict[str, str]]:
        timeout = call_timeout(self._margin_s, cap_s)
        slo = current_slo_class()
        started = time.perf_counter()
        code = "OK"
        try:
            call: Any = rpc(request, timeout=timeout, metadata=((SLO_HEADER, slo),))
            response: R = await call
            trailers = {k: str(v) for k, v in (await call.trailing_metadata() or ())} if want_trailers else {}
            return response, trailers
        except grpc.aio.AioRpcError as err:
            code = err.code().name
            raise from_grpc(err.code(), f"{self.target}.{method}: {err.details()}") from None
        except RecmeshError as err:
            code = err.grpc_code.name
            raise
        finally:
            DOWNSTREAM_LATENCY.labels(self._caller, self.target, method, slo, code).observe(
                time.perf_counter() - started
            )

    async def health(self, timeout_s: float = 1.0) -> bool:
        """True when the server reports SERVING for its whole server."""
        try:
            resp = await self._health.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
        except grpc.aio.AioRpcError:
            return False
        return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)

    async def close(self) -> None:
        await self.channel.close()


class FeatureClient(GrpcClient):
    target = "feature"

    def __init__(self, address: str, caller: str, margin_ms: float = 5.0) -> None:
        super().__init__(address, caller, margin_ms)
        self._stub = features_pb2_grpc.FeatureServiceStub(self.channel)

    async def get_features(
        self, user_id: str, item_ids: list[str], as_of_ms: int, cap_s: float | None = None
    ) -> features_pb2.GetFeaturesResponse:
        req = features_pb2.GetFeaturesRequest(user_id=user_id, item_ids=item_ids, as_of_ms=as_of_ms)
        return await self._call("GetFeatures", self._stub.GetFeatures, req, cap_s)

    async def popular(self, limit: int, cap_s: float | None = None) -> list[tuple[str, float]]:
        resp: features_pb2.GetPopularResponse = await self._call(
            "GetPopular", self._stub.GetPopular, features_pb2.GetPopularRequest(limit=limit), cap_s
        )
        return [(i.item_id, i.score) for i in resp.items]


SUGGESTED_LEVEL_KEY = "x-recmesh-suggested-level"


@dataclass(frozen=True)
class Scored:
    scores: list[float]
    model_version: str
    suggested_level: int  # the inference service's degradation hint (trailing metadata)


@dataclass(frozen=True)
class Embedded:
    matrix: npt.NDArray[np.float32]  # [len(texts), dim], unit rows
    model: str
    backend: str
    tokens: list[int]  # per text, as the model saw it


class InferenceClient(GrpcClient):
    target = "inference"

    def __init__(self, address: str, caller: str, margin_ms: float = 5.0) -> None:
        super().__init__(address, caller, margin_ms)
        self._stub = inference_pb2_grpc.InferenceServiceStub(self.channel)

    async def score(
        self, feature_version: str, columns: list[str], values: list[float], level: int = 0,
        cap_s: float | None = None,
    ) -> Scored:  # fmt: skip
        req = inference_pb2.ScoreRequest(
            feature_version=feature_version, feature_names=columns, values=values, level=level
        )
        resp, trailers = await self._call_with_trailers("Score", self._stub.Score, req, cap_s)
        return Scored(list(resp.scores), resp.model_version, int(trailers.get(SUGGESTED_LEVEL_KEY, "0")))

    async def embed(self, texts: list[str], cap_s: float | None = None) -> Embedded:
        resp: inference_pb2.EmbedResponse = await self._call(
            "Embed", self._stub.Embed, inference_pb2.EmbedRequest(texts=texts), cap_s
        )
        matrix = np.asarray(resp.values, dtype=np.float32).reshape(len(texts), resp.dim)
        return Embedded(matrix, resp.model, resp.backend, list(resp.tokens))

    async def generate(
        self, prompt: str, max_tokens: int, json_schema: str = "", cap_s: float | None = None
    ) -> inference_pb2.GenerateResponse:
        req = inference_pb2.GenerateRequest(prompt=prompt, max_tokens=max_tokens, json_schema=json_schema)
        return await self._call("Generate", self._stub.Generate, req, cap_s)

    async def capabilities(self, cap_s: float = 2.0) -> inference_pb2.CapabilitiesResponse:
        return await self._call(
            "Capabilities", self._stub.Capabilities, inference_pb2.CapabilitiesRequest(), cap_s
        )

    async def model_info(self) -> inference_pb2.ModelInfoResponse:
        return await self._call("ModelInfo", self._stub.ModelInfo, inference_pb2.ModelInfoRequest(), 2.0)


class RankerClient(GrpcClient):
    target = "ranker"

    def __init__(self, address: str, caller: str, margin_ms: float = 5.0) -> None:
        super().__init__(address, caller, margin_ms)
        self._stub = ranker_pb2_grpc.RankerServiceStub(self.channel)

    async def rank(
        self, user_id: str, count: int, context: dict[str, str], as_of_ms: int
    ) -> ranker_pb2.RankResponse:
        req = ranker_pb2.RankRequest(user_id=user_id, count=count, context=context, as_of_ms=as_of_ms)
        return await self._call("Rank", self._stub.Rank, req)


__all__ = [
    "Embedded",
    "FeatureClient",
    "GrpcClient",
    "InferenceClient",
    "RankerClient",
    "Unavailable",
    "open_channel",
]
