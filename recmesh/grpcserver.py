"""One way to build and run a recmesh gRPC server, and its error boundary.

Every service gets the same stack: the request interceptor (RequestInterceptor:
SERVER span from the caller's `traceparent`, budget, class, error translation
once, latency histogram),
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
import contextlib
import signal
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
import structlog
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from opentelemetry.trace import Span

from recmesh import metrics_http
from recmesh.errors import DeadlineExceeded, RecmeshError
from recmesh.metadata import RETRY_AFTER_HEADER, RETRY_PUSHBACK_TRAILER, SLO_HEADER
from recmesh.resilience import UNKNOWN_CLASS, remaining_s, request_scope
from recmesh.security import TlsConfigError, peer_policy, process_tls, tls_settings
from recmesh.slo import DEFAULT_CLASSES
from recmesh.telemetry import DEADLINES_EXPIRED, REQUEST_LATENCY, end_rpc_span, grpc_server_span

_log = structlog.get_logger("recmesh.grpcserver")

GRPC_OPTIONS = (
    ("grpc.max_receive_message_length", 16 * 1024 * 1024),
    ("grpc.max_send_message_length", 16 * 1024 * 1024),
    ("grpc.so_reuseport", 0),
)


# --- the error boundary ---------------------------------------------------------

Behavior = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]
Classify = Callable[[Mapping[str, Any]], str]


def hop_class(metadata: Mapping[str, Any]) -> str:
    """The class an internal hop runs in: what the caller put in `x-slo-class`,
    if it is a class at all (a metric label must not take any string)."""
    name = metadata.get(SLO_HEADER)
    return name if isinstance(name, str) and name in DEFAULT_CLASSES else UNKNOWN_CLASS


class RequestInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Per request: continue the caller's trace in a SERVER span, open the budget
    scope from the incoming deadline and class, refuse expired work, translate
    RecmeshError to a status once, and record latency by method and class.
    Health and reflection pass through untouched (and untraced). One
    interceptor does all of it: each grpc.aio server interceptor is another
    await chain per call."""

    def __init__(
        self,
        service: str,
        classify: Classify | None = None,
        authorize: Callable[[grpc.aio.ServicerContext, str], tuple[grpc.StatusCode, str, str] | None]
        | None = None,
    ) -> None:
        self._service = service
        # The peer check (recmesh.security.PeerPolicy.authorize) of an internal
        # service with mutual TLS: it runs first, so the class, deadline and
        # trace of a call are read only from a peer allowed to make it.
        self._authorize = authorize
        # The class a request is labelled and scoped with, from its metadata:
        # by default the `x-slo-class` the previous hop set (a known class, else
        # "unknown"); a public server passes the class it grants instead.
        self._classify = classify or hop_class
        # The wrapped handler of each method, built on its first call: a
        # service's handlers do not change while it runs, and building the
        # wrapper and its handler object per call cost every RPC.
        self._wrapped: dict[tuple[str, object], grpc.RpcMethodHandler] = {}

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        handler = await continuation(details)
        if handler is None or handler.unary_unary is None or details.method.startswith("/grpc."):
            return handler
        key = (details.method, handler.unary_unary)
        wrapped = self._wrapped.get(key)
        if wrapped is None:
            method = details.method.rsplit("/", 1)[-1]
            wrapped = self._wrapped[key] = grpc.unary_unary_rpc_method_handler(
                self._wrap(method, handler.unary_unary, details.method),
                request_deserializer=handler.request_deserializer,
                response_serializer=handler.response_serializer,
            )
        return wrapped

    def _wrap(self, method: str, behavior: Behavior, full_method: str | None = None) -> Behavior:
        service = self._service
        span_name = full_method or f"/{service}/{method}"
        classify = self._classify
        authorize = self._authorize

        async def wrapper(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if authorize is not None:
                denial = authorize(context, method)
                if denial is not None:
                    await context.abort(denial[0], denial[2])
            metadata = {k: v for k, v in (context.invocation_metadata() or ())}
            slo_class = classify(metadata)
            with grpc_server_span(span_name, slo_class, metadata) as span:
                return await self._serve(behavior, request, context, span, method, slo_class)

        return wrapper

    async def _serve(
        self,
        behavior: Behavior,
        request: Any,
        context: grpc.aio.ServicerContext,
        span: Span,
        method: str,
        slo_class: str,
    ) -> Any:
        service = self._service
        started = time.perf_counter()
        code = "OK"
        with request_scope(slo_class, context.time_remaining()):
            try:
                left = remaining_s()
                if left is not None and left <= 0:
                    DEADLINES_EXPIRED.labels(service, "arrival", slo_class).inc()
                    raise DeadlineExceeded("deadline already passed on arrival")
                return await behavior(request, context)
            except RecmeshError as err:
                code = err.grpc_code.name
                _log.info("request_failed", method=method, code=code, error=str(err))
                retry_after = getattr(err, "retry_after_s", None)
                if retry_after is not None:  # when to retry, and in which class, as REST's 429 says
                    trailers = ((RETRY_AFTER_HEADER, str(retry_after)), (SLO_HEADER, slo_class),
                                (RETRY_PUSHBACK_TRAILER, str(int(retry_after * 1000))))  # fmt: skip
                    context.set_trailing_metadata(trailers)
                await context.abort(err.grpc_code, str(err))
            except Exception as err:
                if isinstance(err, grpc.aio.AbortError):
                    code = context.code().name if context.code() else "ABORTED"
                    raise
                code = "INTERNAL"
                _log.exception("request_crashed", method=method)
                await context.abort(grpc.StatusCode.INTERNAL, f"internal error: {err!r}")
            finally:
                end_rpc_span(span, getattr(grpc.StatusCode, code, grpc.StatusCode.UNKNOWN))
                REQUEST_LATENCY.labels(service, method, slo_class, code).observe(
                    time.perf_counter() - started
                )


# --- the server -----------------------------------------------------------------


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


@contextlib.contextmanager
def shutdown_signals() -> Iterator[asyncio.Event]:
    """An event set by the first SIGINT or SIGTERM while the block runs (from
    its start: a signal during start-up is not asyncio's KeyboardInterrupt)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        yield stop
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


async def wait_for_shutdown_signal() -> None:
    """Return on the first SIGINT or SIGTERM."""
    with shutdown_signals() as stop:
        await stop.wait()
