"""python -m services.gateway: REST on GATEWAY_HTTP_PORT and gRPC on
GATEWAY_GRPC_PORT, in one process and one event loop."""

from __future__ import annotations

import asyncio
import contextlib
import gc

import uvicorn

from recmesh import eventloop
from recmesh.clients.feature import FeatureClient
from recmesh.clients.inference import InferenceClient
from recmesh.clients.ranker import RankerClient
from recmesh.controller import build_overload
from recmesh.features.repository import serving_repository
from recmesh.grpcserver import wait_for_shutdown_signal
from recmesh.metrics_http import start_metrics_server
from recmesh.security import process_tls
from recmesh.settings import GatewaySettings
from recmesh.telemetry import setup_logging, setup_tracing
from services.gateway.ai_tool_calls import AiTools, build_tool_gate
from services.gateway.app import GatewayDeps, create_app
from services.gateway.cold import build_cold_guard
from services.gateway.edge import ClassPolicy, Edge
from services.gateway.event_publisher import EventPublisher
from services.gateway.grpc_api import build_grpc_server
from services.gateway.recommend import Recommender


async def main(settings: GatewaySettings) -> None:
    ranker = RankerClient(settings.ranker_addr, "gateway", settings.hop_margin_ms)
    features = FeatureClient(settings.feature_addr, "gateway", settings.hop_margin_ms)
    inference = InferenceClient(settings.inference_addr, "gateway", settings.hop_margin_ms)
    # AI tools get their own client (own breaker and retry budget) and their own admission gate.
    tool_inference = InferenceClient(settings.inference_addr, "gateway_ai_tool", settings.hop_margin_ms)
    ai_tools = AiTools(tool_inference, settings.ai_tool)
    tool_gate = build_tool_gate(settings.ai_tool)
    publisher = EventPublisher(settings.kafka_bootstrap, settings.events_topic, settings.produce_timeout_s)
    gate, controller = build_overload(settings.admission)
    cold = build_cold_guard(settings, {"ranker": ranker.health, "inference": inference.health})
    fs = serving_repository(settings.repository, "gateway")
    recommender = Recommender(ranker, features, settings.max_count, cold, fs.version)
    policy = ClassPolicy.from_settings(settings)
    checks = {"ranker": ranker.health, "feature": features.health, "inference": inference.health}
    deps = GatewayDeps(
        recommender,
        policy,
        publisher,
        {name: check for name, check in checks.items() if name not in settings.may_be_cold},
        ai_tools,
        fs.event_schema,
        gate,
        tool_gate,
    )
    app = create_app(settings, deps)
    await publisher.start()
    popular_task = asyncio.create_task(recommender.keep_popular_fresh())
    ready_task = asyncio.create_task(app.readiness.watch())
    controller_task = asyncio.create_task(controller.run()) if controller else None
    lag_task = asyncio.create_task(gate.watch_loop_lag()) if gate else None
    grpc_server = build_grpc_server(settings, recommender, Edge(policy, gate))
    await grpc_server.start()
    # Start-up objects live as long as the process: keep them out of full
    # collections (GC pauses dominate Python tail latency).
    gc.collect()
    gc.freeze()
    await grpc_server.set_serving()
    http = uvicorn.Server(
        uvicorn.Config(
            app, host=settings.bind_host, port=settings.gateway_http_port,
            log_level="warning", access_log=False, lifespan="off",
        )
    )  # fmt: skip
    http.install_signal_handlers = lambda: None  # type: ignore[attr-defined]
    http_task = asyncio.create_task(http.serve())
    stop_task = asyncio.create_task(wait_for_shutdown_signal())
    done, _ = await asyncio.wait({http_task, stop_task}, return_when=asyncio.FIRST_COMPLETED)
    http.should_exit = True
    await grpc_server.stop(settings.shutdown_grace_s)
    with contextlib.suppress(asyncio.CancelledError):
        await http_task
    stop_task.cancel()
    popular_task.cancel()
    ready_task.cancel()
    for task in (controller_task, lag_task):
        if task is not None:
            task.cancel()
    await publisher.stop()
    if cold is not None:
        await cold.close()
    for client in (ranker, features, inference, tool_inference):
        await client.close()
    if http_task in done and http_task.exception() is not None:
        raise SystemExit(f"HTTP server failed: {http_task.exception()!r}")


if __name__ == "__main__":
    cfg = GatewaySettings()
    setup_logging("gateway", cfg.log_level, cfg.log_format)
    setup_tracing("gateway", redis=False, flush_s=cfg.telemetry_flush_s)  # the gateway never talks to Redis
    process_tls()  # certificates read (or plaintext said) before anything listens
    start_metrics_server(cfg.metrics_port, addr=cfg.bind_host)  # /metrics (tenant labels), /healthz
    eventloop.run(main(cfg))
