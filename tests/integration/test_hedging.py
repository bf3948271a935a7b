"""Hedged reads in `GrpcClient`, against a real gRPC server on a socket: a read
slower than the observed p95 gets a second copy, which answers first; with no
retry budget left there is no second copy and the caller waits for the first."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from recmesh.clients.base import GrpcClient, ResiliencePolicy
from recmesh.grpcserver import GRPC_OPTIONS
from recmesh.telemetry import EXTRA_ATTEMPTS
from tests.helpers import free_port

SLOW_S = 1.0


class _Health(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    """Fast, except that the caller can make the next call of a kind slow. Each
    call names this server's token and its kind ("<token>/<kind>" as the
    request's service name): a Check from anything else that reaches the port
    (another test's client or process) is answered and neither counted nor
    slowed, and a straggling copy of an earlier call of another kind cannot
    take the slowness meant for the next one."""

    def __init__(self) -> None:
        self.token = uuid.uuid4().hex
        self.slow_next = False
        self.slow_kind = ""
        self.calls = 0
        self.by_kind: dict[str, int] = {}
        self.foreign = 0

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: object
    ) -> health_pb2.HealthCheckResponse:
        token, _, kind = request.service.partition("/")
        if token != self.token:
            self.foreign += 1
            return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)
        self.calls += 1
        self.by_kind[kind] = self.by_kind.get(kind, 0) + 1
        if self.slow_next and kind == self.slow_kind:
            self.slow_next = False
            await asyncio.sleep(SLOW_S)
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


class _Client(GrpcClient):
    target = "hedge-test"
    service_name = "grpc.health.v1.Health"

    def __init__(self, address: str, policy: ResiliencePolicy, token: str) -> None:
        super().__init__(address, "test", policy=policy)
        self.stub = health_pb2_grpc.HealthStub(self.channel)
        self.token = token

    async def check(self, kind: str | None = None) -> health_pb2.HealthCheckResponse:
        req = health_pb2.HealthCheckRequest(service=f"{self.token}/{kind or ''}")
        return await self._call("Check", self.stub.Check, req, cap_s=5.0, hedge=True, latency_key=kind)


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, _Health]]:
    # No SO_REUSEPORT (grpc's default): another listener that drew the same port would
    # otherwise bind beside this one and silently take part of its connections, answering
    # the slow call fast; without it, that bind fails instead.
    srv = grpc.aio.server(options=GRPC_OPTIONS)
    servicer = _Health()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, srv)
    address = f"127.0.0.1:{free_port()}"
    srv.add_insecure_port(address)  # raises when the port is taken (no SO_REUSEPORT)
    await srv.start()
    try:
        yield address, servicer
    finally:
        await srv.stop(0)


async def _warm(client: _Client) -> None:
    for _ in range(30):  # enough samples for a p95
        await client.check()
    # About one warm-up call in twenty is slower than the p95 and hedged; the copy
    # it no longer needs may still reach the server: let it land before counting.
    await asyncio.sleep(0.2)


def _hedges() -> float:
    return EXTRA_ATTEMPTS.labels("test", "hedge-test", "Check", "hedge")._value.get()  # type: ignore[no-any-return]


async def test_a_slow_read_is_hedged_and_the_fast_copy_answers(server: tuple[str, _Health]) -> None:
    address, servicer = server
    client = _Client(address, ResiliencePolicy(retry_ratio=0.5), servicer.token)
    try:
        await _warm(client)
        before, calls = _hedges(), servicer.calls
        servicer.slow_next = True
        t = time.perf_counter()
        resp = await client.check()
        took = time.perf_counter() - t
        assert resp.status == health_pb2.HealthCheckResponse.SERVING
        assert _hedges() == before + 1 and servicer.calls == calls + 2
        assert took < SLOW_S / 2, took  # the second copy answered, not the slow first one
    finally:
        await client.close()


async def test_no_budget_no_hedge(server: tuple[str, _Health]) -> None:
    address, servicer = server
    client = _Client(address, ResiliencePolicy(retry_ratio=0.0), servicer.token)
    client.retry_budget.tokens = 0.0  # the initial allowance spent
    try:
        await _warm(client)
        before, calls = _hedges(), servicer.calls
        servicer.slow_next = True
        t = time.perf_counter()
        await client.check()
        assert time.perf_counter() - t >= SLOW_S * 0.9
        assert _hedges() == before and servicer.calls == calls + 1
    finally:
        await client.close()


async def test_each_latency_key_hedges_on_its_own_history(server: tuple[str, _Health]) -> None:
    """A kind of call with no history of its own (say, the large look-ups) is not
    hedged on the p95 of another kind of the same method (the small ones)."""
    address, servicer = server
    client = _Client(address, ResiliencePolicy(retry_ratio=0.5), servicer.token)
    try:
        await _warm(client)  # history for the default key (the method) only
        before = _hedges()
        servicer.slow_next, servicer.slow_kind = True, "large"
        t = time.perf_counter()
        await client.check("large")
        assert time.perf_counter() - t >= SLOW_S * 0.9, "no p95 for 'large' yet: no hedge"
        assert _hedges() == before and servicer.by_kind["large"] == 1
        servicer.slow_next, servicer.slow_kind = True, ""
        t = time.perf_counter()
        await client.check()
        took = time.perf_counter() - t
        assert took < SLOW_S / 2 and _hedges() == before + 1, "the method's own history hedges"
    finally:
        await client.close()
