"""The engine every client of a mesh service shares: one downstream's channel,
its retry, circuit breaker and hedging, and health probes.

Handlers never touch stubs: each client method (recmesh.clients.feature,
.inference, .ranker) derives its timeout from the request budget
(resilience.call_timeout), sends the SLO class as metadata, records the call's
latency, and translates gRPC errors into the recmesh hierarchy here and only
here. Each call's CLIENT span is opened here and its `traceparent` sent in the
call's metadata (no channel interceptors), so the trace travels on every hop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import grpc
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc

from recmesh.errors import CircuitOpen, DeadlineExceeded, RecmeshError, Unavailable, from_grpc
from recmesh.metadata import SLO_HEADER
from recmesh.resilience import (
    BreakerState,
    CircuitBreaker,
    LatencyTracker,
    RetryBudget,
    call_timeout,
    current_slo_class,
    remaining_s,
)
from recmesh.security import open_secure_channel
from recmesh.telemetry import (
    CIRCUIT_OPENED,
    CIRCUIT_STATE,
    DEADLINES_EXPIRED,
    DOWNSTREAM_LATENCY,
    EXTRA_ATTEMPTS,
    GRPC_PORT,
    end_rpc_span,
    grpc_client_span,
    server_attributes,
)

R = TypeVar("R")
_log = structlog.get_logger("recmesh.clients")

CHANNEL_OPTIONS = (
    ("grpc.max_receive_message_length", 16 * 1024 * 1024),
    ("grpc.max_send_message_length", 16 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 30_000),
    ("grpc.enable_retries", 0),  # retries happen at one layer only, not in the channel
    # gRPC's default reconnect backoff starts at 1 s and grows x1.6 up to 120 s: a
    # caller whose peer was down (scaled to zero, restarting) would stay blind to it
    # for that long after it is back. Cap it at 1 s; a refused loopback connect is cheap.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)
# A readiness poll on a process that is starting retries the connection every
# 10-20 ms, so it sees SERVING within a poll of when it happened.
PROBE_CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 10),
    ("grpc.min_reconnect_backoff_ms", 10),
    ("grpc.max_reconnect_backoff_ms", 20),
)


def open_channel(
    address: str, server_name: str | None = None, *, plaintext: bool = False
) -> grpc.aio.Channel:
    """A channel without interceptors: GrpcClient opens each call's CLIENT span
    and sends `traceparent` itself (telemetry.grpc_client_span). Mutual TLS
    with this process's certificate unless RECMESH_TLS=off (recmesh.security);
    `server_name`: the name the server's certificate must carry (the service's
    name), else the address's host. `plaintext`: for servers that are not part
    of the mesh (the benchmarks' canned-answer floor)."""
    if plaintext:
        return grpc.aio.insecure_channel(address, options=CHANNEL_OPTIONS)
    return open_secure_channel(address, server_name, CHANNEL_OPTIONS)


class HealthProbe:
    """grpc.health polls for a process that is starting (benchmarks, `recmesh up`)."""

    def __init__(self, address: str, server_name: str | None = None, *, plaintext: bool = False) -> None:
        """`plaintext`: a public port without TLS (the gateway's, by default)."""
        self.channel = (
            grpc.aio.insecure_channel(address, options=PROBE_CHANNEL_OPTIONS)
            if plaintext
            else open_secure_channel(address, server_name, PROBE_CHANNEL_OPTIONS)
        )
        self._stub = health_pb2_grpc.HealthStub(self.channel)

    async def serving(self, timeout_s: float = 0.2, service: str = "") -> bool:
        try:
            resp = await self._stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.aio.AioRpcError:
            return False
        return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)

    async def close(self) -> None:
        await self.channel.close()


# Codes that say the downstream is unhealthy (they count against its breaker);
# anything else (a bad request, a schema mismatch) means it answered.
# RESOURCE_EXHAUSTED is an answer too: the server shed work it had no room
# for. Counting it would let a flood of one RPC (say Embed) open the breaker
# and cut every other RPC to that service (say Score) while it is healthy.
BREAKER_FAILURES = frozenset(
    {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.INTERNAL,
     grpc.StatusCode.UNKNOWN}
)  # fmt: skip


@dataclass(frozen=True)
class ResiliencePolicy:
    """How a client protects its caller: breaker thresholds and the retry budget."""

    failure_threshold: int = 5
    open_s: float = 2.0
    retry_ratio: float = 0.1  # retries + hedges <= 10% of requests (plus a small initial allowance)
    hedge_quantile: float = 0.95  # hedge an idempotent read once it is slower than this


class GrpcClient:
    """One downstream. Retries happen here and only here (the channel's own
    retries are off, and the gateway never retries the ranker): an idempotent
    call that fails UNAVAILABLE is tried once more if the retry budget allows,
    and a hedged read sends a second copy once the first is slower than the
    observed p95. A circuit breaker fails calls fast while the target is down,
    so callers go straight to their fallback."""

    target = "unknown"
    service_name = "unknown"  # the gRPC service's full name, for span names

    def __init__(
        self, address: str, caller: str, margin_ms: float = 5.0, policy: ResiliencePolicy | None = None,
        *, plaintext: bool = False,
    ) -> None:  # fmt: skip
        """`plaintext`: a tool's own throwaway mesh started with RECMESH_TLS=off."""
        self.address = address
        self._server = server_attributes(address, GRPC_PORT)  # server.address/port of its client spans
        self._caller = caller
        self._margin_s = margin_ms / 1000
        self.policy = policy or ResiliencePolicy()
        # The server must hold a certificate for the service's name (e.g. `ranker`).
        name = None if self.target == "unknown" else self.target
        self.channel = open_channel(address, name, plaintext=plaintext)
        self._health = health_pb2_grpc.HealthStub(self.channel)
        self.breaker = CircuitBreaker(self.policy.failure_threshold, self.policy.open_s)
        self.retry_budget = RetryBudget(self.policy.retry_ratio)
        self._latency: dict[str, LatencyTracker] = {}
        self._published = BreakerState.CLOSED
        CIRCUIT_STATE.labels(caller, self.target).set(0)

    async def _call(
        self,
        method: str,
        rpc: Callable[..., Awaitable[R]],
        request: Any,
        cap_s: float | None = None,
        *,
        retry: bool = False,
        hedge: bool = False,
        metadata: tuple[tuple[str, str], ...] = (),
        latency_key: str | None = None,
    ) -> R:
        response, _ = await self._call_with_trailers(
            method, rpc, request, cap_s, want_trailers=False, retry=retry, hedge=hedge, metadata=metadata,
            latency_key=latency_key,
        )  # fmt: skip
        return response

    async def _call_with_trailers(
        self,
        method: str,
        rpc: Callable[..., Awaitable[R]],
        request: Any,
        cap_s: float | None = None,
        want_trailers: bool = True,
        *,
        retry: bool = False,
        hedge: bool = False,
        metadata: tuple[tuple[str, str], ...] = (),
        latency_key: str | None = None,
    ) -> tuple[R, dict[str, str]]:
        """`latency_key` (default: the method) names the latency history whose
        p95 is the hedge delay: calls of one method that differ in size (a
        user-only look-up and one for 200 items) keep apart histories, or the
        slow kind would be hedged far more often than 5 % and the fast one late."""
        self.retry_budget.on_request()
        key = latency_key or method
        tracker = self._latency.get(key)
        if tracker is None:
            tracker = self._latency[key] = LatencyTracker()

        def attempt() -> Awaitable[tuple[R, dict[str, str]]]:
            return self._attempt(method, rpc, request, cap_s, want_trailers, metadata, tracker)

        # Racing a second copy needs the first as a task plus a timed wait; with
        # no budget left for a hedge there is nothing to race, so call directly.
        hedgeable = hedge and self.retry_budget.has_room()
        delay = tracker.quantile(self.policy.hedge_quantile) if hedgeable else None
        try:
            if delay is not None:
                return await self._hedged(method, attempt, delay)
            return await attempt()
        except Unavailable as err:
            if not retry or isinstance(err, CircuitOpen) or not self._spend(method, "retry"):
                raise
            return await attempt()

    def _spend(self, method: str, kind: str) -> bool:
        ok = self.retry_budget.try_spend()
        EXTRA_ATTEMPTS.labels(self._caller, self.target, method, kind if ok else f"{kind}_denied").inc()
        return ok

    async def _hedged(
        self, method: str, attempt: Callable[[], Awaitable[tuple[R, dict[str, str]]]], delay_s: float
    ) -> tuple[R, dict[str, str]]:
        first = asyncio.ensure_future(attempt())
        pending: set[asyncio.Future[tuple[R, dict[str, str]]]] = {first}
        try:
            done, _ = await asyncio.wait(pending, timeout=delay_s)
            left = remaining_s()
            # A second copy only pays when it can still finish in time.
            no_time = left is not None and left - self._margin_s <= delay_s
            if done or no_time or not self._spend(method, "hedge"):
                return await first
            pending.add(asyncio.ensure_future(attempt()))
            error: BaseException | None = None
            while pending:
                finished, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in finished:
                    if task.exception() is None:
                        return task.result()
                    error = task.exception()
            assert error is not None
            raise error
        finally:
            for task in pending:
                task.cancel()

    async def _attempt(
        self,
        method: str,
        rpc: Callable[..., Awaitable[R]],
        request: Any,
        cap_s: float | None,
        want_trailers: bool,
        metadata: tuple[tuple[str, str], ...],
        tracker: LatencyTracker,
    ) -> tuple[R, dict[str, str]]:
        slo = current_slo_class()
        try:
            timeout = call_timeout(self._margin_s, cap_s)
        except DeadlineExceeded:
            DEADLINES_EXPIRED.labels(self._caller, "before_call", slo).inc()
            raise
        if not self.breaker.allow():
            DOWNSTREAM_LATENCY.labels(self._caller, self.target, method, slo, "CIRCUIT_OPEN").observe(0)
            raise CircuitOpen(f"{self.target}.{method}: circuit open after {self.breaker.failures} failures")
        self._publish_state()
        started = time.perf_counter()
        code = "OK"
        with grpc_client_span(f"/{self.service_name}/{method}", slo, self._server) as (span, trace_md):
            try:
                call: Any = rpc(request, timeout=timeout, metadata=((SLO_HEADER, slo), *metadata, *trace_md))
                response: R = await call
                trailers = (
                    {k: str(v) for k, v in (await call.trailing_metadata() or ())} if want_trailers else {}
                )
                end_rpc_span(span, grpc.StatusCode.OK)
                tracker.add(time.perf_counter() - started)
                self.breaker.record_success()
                return response, trailers
            except grpc.aio.AioRpcError as err:
                code = err.code().name
                end_rpc_span(span, err.code(), err.details() or "")
                if err.code() in BREAKER_FAILURES:
                    self.breaker.record_failure()
                else:
                    self.breaker.record_success()
                raise from_grpc(err.code(), f"{self.target}.{method}: {err.details()}") from None
            except RecmeshError as err:
                code = err.grpc_code.name
                raise
            except asyncio.CancelledError:
                code = "CANCELLED"  # e.g. the slower copy of a hedged read
                end_rpc_span(span, grpc.StatusCode.CANCELLED)
                if timeout is not None and time.perf_counter() - started >= 0.9 * timeout:
                    # Cancelled because the whole request ran out of time (our caller
                    # gave up at about our deadline): for the breaker that is a timeout.
                    self.breaker.record_failure()
                raise
            finally:
                self._publish_state()
                DOWNSTREAM_LATENCY.labels(self._caller, self.target, method, slo, code).observe(
                    time.perf_counter() - started
                )

    def _publish_state(self) -> None:
        state = self.breaker.state
        if state is self._published:
            return
        if state is BreakerState.OPEN:
            CIRCUIT_OPENED.labels(self._caller, self.target).inc()
            _log.warning("circuit_opened", target=self.target, failures=self.breaker.failures)
        elif self._published is not BreakerState.CLOSED and state is BreakerState.CLOSED:
            _log.info("circuit_closed", target=self.target)
        CIRCUIT_STATE.labels(self._caller, self.target).set(state.value)
        self._published = state

    async def health(self, timeout_s: float = 1.0) -> bool:
        """True when the server reports SERVING for its whole server."""
        try:
            resp = await self._health.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout_s)
        except grpc.aio.AioRpcError:
            return False
        return bool(resp.status == health_pb2.HealthCheckResponse.SERVING)

    async def close(self) -> None:
        await self.channel.close()
