"""GrpcClient, the engine every mesh client shares, against a real grpc.aio
server on a socket: the call's deadline comes from the request's budget, the
breaker opens after N failures and then fails fast, a retry spends the retry
budget, and a gRPC status becomes a recmesh error once."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from recmesh.clients.base import GrpcClient, ResiliencePolicy
from recmesh.errors import CircuitOpen, DeadlineExceeded, InvalidArgument, RecmeshError, Unavailable
from recmesh.metadata import SLO_HEADER
from recmesh.resilience import BreakerState, request_scope
from recmesh.telemetry import EXTRA_ATTEMPTS
from tests.helpers import grpc_server

SERVING = health_pb2.HealthCheckResponse.SERVING


class _Scripted(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    """Answers SERVING, or fails with the next scripted status; records what each call carried."""

    def __init__(self) -> None:
        self.fail_with: list[grpc.StatusCode] = []
        self.calls = 0
        self.time_remaining: list[float | None] = []
        self.classes: list[str | None] = []

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        self.calls += 1
        self.time_remaining.append(context.time_remaining())
        self.classes.append(dict(context.invocation_metadata() or ()).get(SLO_HEADER))
        if self.fail_with:
            await context.abort(self.fail_with.pop(0), "scripted failure")
        return health_pb2.HealthCheckResponse(status=SERVING)


class _Client(GrpcClient):
    target = "base-test"
    service_name = "grpc.health.v1.Health"

    def __init__(self, address: str, policy: ResiliencePolicy | None = None, margin_ms: float = 5.0) -> None:
        super().__init__(address, "test", margin_ms, policy)
        self.stub = health_pb2_grpc.HealthStub(self.channel)

    async def check(self, cap_s: float | None = None, retry: bool = False) -> health_pb2.HealthCheckResponse:
        req = health_pb2.HealthCheckRequest(service="")
        return await self._call("Check", self.stub.Check, req, cap_s, retry=retry)


@pytest.fixture
async def server() -> AsyncIterator[tuple[str, _Scripted]]:
    servicer = _Scripted()
    async with grpc_server(health_pb2_grpc.add_HealthServicer_to_server, servicer) as address:
        yield address, servicer


def _extra(kind: str) -> float:
    return EXTRA_ATTEMPTS.labels("test", "base-test", "Check", kind)._value.get()  # type: ignore[no-any-return]


async def test_the_deadline_is_the_budget_left_less_the_margin(server: tuple[str, _Scripted]) -> None:
    address, servicer = server
    client = _Client(address, margin_ms=50.0)
    try:
        with request_scope("A", 0.5):
            await client.check()
            await client.check(cap_s=0.1)  # a stage's own share, below what is left
        await client.check()  # outside any request: no deadline
    finally:
        await client.close()
    budget, capped, unbounded = servicer.time_remaining
    # (the server reads the deadline to within a millisecond of what was sent)
    assert budget is not None and 0.3 < budget <= 0.451, "0.5 s budget less the 50 ms margin"
    assert capped is not None and capped <= 0.101
    assert unbounded is None
    assert servicer.classes[:2] == ["A", "A"], "the class travels as x-slo-class"


async def test_a_spent_budget_fails_before_calling(server: tuple[str, _Scripted]) -> None:
    address, servicer = server
    client = _Client(address)
    try:
        with request_scope("B", 0.002):
            await asyncio.sleep(0.01)
            with pytest.raises(DeadlineExceeded):
                await client.check()
    finally:
        await client.close()
    assert servicer.calls == 0


async def test_the_breaker_opens_after_n_failures_then_fails_fast(server: tuple[str, _Scripted]) -> None:
    address, servicer = server
    client = _Client(address, ResiliencePolicy(failure_threshold=3, open_s=30.0))
    try:
        servicer.fail_with = [grpc.StatusCode.UNAVAILABLE] * 3
        for _ in range(3):
            with pytest.raises(Unavailable) as failed:
                await client.check()
            assert not isinstance(failed.value, CircuitOpen)
        assert client.breaker.state is BreakerState.OPEN and servicer.calls == 3
        started = time.perf_counter()
        with pytest.raises(CircuitOpen):
            await client.check()
        assert time.perf_counter() - started < 0.05
        assert servicer.calls == 3, "an open breaker does not call the downstream"
    finally:
        await client.close()


async def test_an_answer_that_is_an_error_does_not_open_the_breaker(server: tuple[str, _Scripted]) -> None:
    address, servicer = server
    client = _Client(address, ResiliencePolicy(failure_threshold=2, open_s=30.0))
    try:
        servicer.fail_with = [grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED] * 2
        for _ in range(4):
            with pytest.raises(RecmeshError):
                await client.check()
        assert client.breaker.state is BreakerState.CLOSED
        assert (await client.check()).status == SERVING and servicer.calls == 5
    finally:
        await client.close()


async def test_a_retry_spends_the_retry_budget(server: tuple[str, _Scripted]) -> None:
    address, servicer = server
    client = _Client(address, ResiliencePolicy(retry_ratio=0.0))
    try:
        retries, denied = _extra("retry"), _extra("retry_denied")
        servicer.fail_with = [grpc.StatusCode.UNAVAILABLE]
        assert (await client.check(retry=True)).status == SERVING, "the initial allowance pays one retry"
        assert servicer.calls == 2 and _extra("retry") == retries + 1
        client.retry_budget.tokens = 0.0  # spent; ratio 0 earns nothing back
        servicer.fail_with = [grpc.StatusCode.UNAVAILABLE]
        with pytest.raises(Unavailable):
            await client.check(retry=True)
        assert servicer.calls == 3 and _extra("retry_denied") == denied + 1
        servicer.fail_with = [grpc.StatusCode.UNAVAILABLE]
        with pytest.raises(Unavailable):
            await client.check()  # not idempotent: never retried, whatever the budget
        assert servicer.calls == 4
    finally:
        await client.close()


async def test_a_grpc_status_becomes_a_recmesh_error_once(server: tuple[str, _Scripted]) -> None:
    address, servicer = server
    client = _Client(address)
    try:
        servicer.fail_with = [grpc.StatusCode.INVALID_ARGUMENT]
        with pytest.raises(InvalidArgument) as err:
            await client.check()
    finally:
        await client.close()
    assert str(err.value) == "base-test.Check: scripted failure"
    assert err.value.grpc_code is grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.__cause__ is None and err.value.__suppress_context__, "the AioRpcError stays behind"
