"""One way to build and run a recmesh gRPC server.

Every service gets the same stack: the request interceptor (SERVER span from
the caller's `traceparent`, budget, class, error translation, latency histogram),
`grpc.health.v1` (NOT_SERVING until the service says it is warm) and server
reflection. Stopping enters graceful shutdown on the health service first, so
probes see NOT_SERVING while in-flight RPCs finish within the grace period.
"""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from recmesh.telemetry import Classify, RequestInterceptor

_log = structlog.get_logger("recmesh.grpcserver")

GRPC_OPTIONS = (
    ("grpc.max_receive_message_length", 16 * 1024 * 1024),
    ("grpc.max_send_message_length", 16 * 1024 * 1024),
    ("grpc.so_reuseport", 0),
)


@dataclass(frozen=True)
class Registration:
    """A servicer and how to add it: `full_name` is e.g. 'recmesh.v1.FeatureService'."""

    full_name: str
    add_to_server: Callable[[Any, grpc.aio.Server], None]
    servicer: Any


class MeshServer:
    def __init__(
        self,
        service: str,
        address: str,
        registrations: Sequence[Registration],
        classify: Classify | None = None,
    ) -> None:
        self.service = service
        self._names = [r.full_name for r in registrations]
        self.server = grpc.aio.server(
            interceptors=[RequestInterceptor(service, classify)],
            options=GRPC_OPTIONS,
        )
        for reg in registrations:
            reg.add_to_server(reg.servicer, self.server)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            [*self._names, health.SERVICE_NAME, reflection.SERVICE_NAME], self.server
        )
        self.port = self.server.add_insecure_port(address)
        if self.port == 0:
            raise OSError(f"{service}: cannot bind {address}")
        self.address = f"{address.rsplit(':', 1)[0]}:{self.port}"

    async def start(self) -> None:
        for name in ["", *self._names]:
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.start()
        _log.info("grpc_listening", address=self.address)

    async def set_serving(self) -> None:
        for name in ["", *self._names]:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        _log.info("serving", address=self.address)

    async def stop(self, grace_s: float) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace_s)
        _log.info("stopped")


async def wait_for_shutdown_signal() -> None:
    """Return on the first SIGINT or SIGTERM."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)
