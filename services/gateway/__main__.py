"""python -m services.gateway: REST on GATEWAY_HTTP_PORT and gRPC on
GATEWAY_GRPC_PORT, in one process and one event loop (recmesh.service)."""

from __future__ import annotations

import asyncio

import uvicorn

from recmesh.clients.feature import FeatureClient
from recmesh.clients.inference import InferenceClient
from recmesh.clients.ranker import RankerClient
from recmesh.controller import build_overload
from recmesh.features.repository import served_feature_set
from recmesh.grpcserver import MeshServer
from recmesh.service import Job, Parts, Step, run_service
from recmesh.settings import GatewaySettings
from services.gateway.ai_tool_calls import AiTools, build_tool_gate
from services.gateway.app import GatewayApp, GatewayDeps, create_app
from services.gateway.cold import build_cold_guard
from services.gateway.edge import ClassPolicy, Edge
from services.gateway.event_publisher import EventPublisher
from services.gateway.grpc_api import build_grpc_server
from services.gateway.impressions import impression_log_from
from services.gateway.recommend import Recommender

# The most the impression log may take to flush what it holds at shutdown.
IMPRESSION_FLUSH_S = 5.0


class Servers:
    """The public gRPC server and the HTTP server as one: gRPC binds first, HTTP
    serves once the gateway is SERVING, and stopping ends HTTP, then drains gRPC."""

    def __init__(self, grpc_server: MeshServer, app: GatewayApp, settings: GatewaySettings) -> None:
        self._grpc = grpc_server
        self._http = uvicorn.Server(
            uvicorn.Config(
                app, host=settings.bind_host, port=settings.gateway_http_port,
                log_level="warning", access_log=False, lifespan="off",
            )
        )  # fmt: skip
        self._http.install_signal_handlers = lambda: None  # type: ignore[attr-defined]
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        await self._grpc.start()

    async def set_serving(self) -> None:
        await self._grpc.set_serving()
        self._task = asyncio.create_task(self._http.serve())

    async def http_ended(self) -> None:
        """Returns (or raises) when the HTTP server ends; cancelling this leaves it running."""
        assert self._task is not None
        await asyncio.wait({self._task})
        if self._task.exception() is not None:
            raise SystemExit(f"HTTP server failed: {self._task.exception()!r}")

    async def stop(self, grace_s: float) -> None:
        self._http.should_exit = True
        await self._grpc.stop(grace_s)
        if self._task is not None:
            await asyncio.wait({self._task})


async def build(settings: GatewaySettings) -> Parts:
    ranker = RankerClient(settings.ranker_addr, "gateway", settings.hop_margin_ms)
    features = FeatureClient(settings.feature_addr, "gateway", settings.hop_margin_ms)
    inference = InferenceClient(settings.inference_addr, "gateway", settings.hop_margin_ms)
    # AI tools get their own client (own breaker and retry budget) and their own admission gate.
    tool_inference = InferenceClient(settings.inference_addr, "gateway_ai_tool", settings.hop_margin_ms)
    publisher = EventPublisher(settings.kafka_bootstrap, settings.events_topic, settings.produce_timeout_s)
    gate, controller = build_overload(settings.admission)
    cold = build_cold_guard(settings, {"ranker": ranker.health, "inference": inference.health})
    feature_set = served_feature_set(settings.repository, "gateway")
    impressions = impression_log_from(settings)
    stop_log = asyncio.Event()
    log_task = asyncio.create_task(impressions.run(stop_log)) if impressions is not None else None
    on_answer = impressions.offer if impressions is not None else None
    recommender = Recommender(ranker, features, settings.max_count, cold, feature_set.version, on_answer)
    policy = ClassPolicy.from_settings(settings)
    checks = {"ranker": ranker.health, "feature": features.health, "inference": inference.health}
    deps = GatewayDeps(
        recommender,
        policy,
        publisher,
        {name: check for name, check in checks.items() if name not in settings.may_be_cold},
        AiTools(tool_inference, settings.ai_tool),
        feature_set.event_schema,
        gate,
        build_tool_gate(settings.ai_tool),
    )
    app = create_app(settings, deps)
    servers = Servers(build_grpc_server(settings, recommender, Edge(policy, gate)), app, settings)
    background: list[Step] = [recommender.keep_popular_fresh, app.readiness.watch]
    if controller is not None:
        background.append(controller.run)
    if gate is not None:
        background.append(gate.watch_loop_lag)

    async def flush_impressions() -> None:
        if log_task is not None:
            stop_log.set()
            await asyncio.wait_for(log_task, IMPRESSION_FLUSH_S)

    closers: list[Step] = [publisher.stop, flush_impressions]  # every event answered 202 is on the topic
    if cold is not None:
        closers.append(cold.close)
    closers += [ranker.close, features.close, inference.close, tool_inference.close]
    return Parts(
        servers,
        warm=publisher.start,
        background=background,
        after_serving=[Job("http", servers.http_ended, until_stop=True)],
        closers=closers,
    )


if __name__ == "__main__":
    run_service("gateway", GatewaySettings(), build, redis=False)  # the gateway never talks to Redis
