"""One way to build and run a recmesh gRPC server.

Every service gets the same stack: the request interceptor (SERVER span from
the caller's `traceparent`, budget, class, error translation, latency histogram),
`grpc.health.v1` (NOT_SERVING until the service says it is warm) and server
reflection. Stopping enters graceful shutdown on the health service first, so
probes see NOT_SERVING while in-flight RPCs finish within the grace period.

Transport (recmesh.security): an internal service listens with mutual TLS and
checks each caller's identity against its peer policy before anything else,
unless RECMESH_TLS=off; the gateway's public server (`public=True`) has no peer
check and listens as RECMESH_GATEWAY_GRPC_TLS says (plaintext by default).
The serving state is mirrored to the metrics port's /readyz (metrics_http.py).
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

from recmesh import metrics_http
from recmesh.security import TlsConfigError, peer_policy, process_tls, tls_settings
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
        *,
        public: bool = False,
    ) -> None:
        self.service = service
        self._names = [r.full_name for r in registrations]
        credentials, authorize = self._transport(public)
        self.tls = credentials is not None
        self.server = grpc.aio.server(
            interceptors=[RequestInterceptor(service, classify, authorize)],
            options=GRPC_OPTIONS,
        )
        for reg in registrations:
            reg.add_to_server(reg.servicer, self.server)
        self.health = health.aio.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            [*self._names, health.SERVICE_NAME, reflection.SERVICE_NAME], self.server
        )
        if credentials is None:
            self.port = self.server.add_insecure_port(address)
        else:
            self.port = self.server.add_secure_port(address, credentials)
        if self.port == 0:
            raise OSError(f"{service}: cannot bind {address}")
        self.address = f"{address.rsplit(':', 1)[0]}:{self.port}"

    def _transport(self, public: bool) -> tuple[grpc.ServerCredentials | None, Any]:
        """The port's credentials (None: plaintext) and the peer check (None: none)."""
        tls = process_tls()
        if not public:
            if tls is None:
                return None, None
            return tls.server_credentials(), peer_policy(self.service).authorize
        settings = tls_settings()
        if settings.public == "off":
            _log.info("public_grpc_plaintext", detail="RECMESH_GATEWAY_GRPC_TLS=off: TLS ends in front of it")
            return None, None
        if tls is None:
            raise TlsConfigError(
                f"RECMESH_GATEWAY_GRPC_TLS={settings.public} needs the gateway's certificate: "
                "set RECMESH_TLS=on with RECMESH_TLS_CA, RECMESH_TLS_CERT and RECMESH_TLS_KEY"
            )
        return tls.public_credentials(settings.public, settings.public_client_ca), None

    async def start(self) -> None:
        metrics_http.SERVING.clear()
        for name in ["", *self._names]:
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        await self.server.start()
        _log.info("grpc_listening", address=self.address)

    async def set_serving(self) -> None:
        for name in ["", *self._names]:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)
        metrics_http.SERVING.set()
        _log.info("serving", address=self.address, tls=self.tls)

    async def stop(self, grace_s: float) -> None:
        metrics_http.SERVING.clear()
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
