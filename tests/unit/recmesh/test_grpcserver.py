"""RequestInterceptor's per-request wrapper, driven with a stand-in context."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from recmesh.errors import InvalidArgument, ResourceExhausted
from recmesh.grpcserver import RequestInterceptor, hop_class
from recmesh.resilience import current_slo_class, remaining_s


class Aborted(Exception):
    pass


class Context:
    def __init__(self, time_remaining: float | None, metadata: tuple[tuple[str, str], ...] = ()) -> None:
        self._remaining = time_remaining
        self._metadata = metadata
        self.aborted: tuple[grpc.StatusCode, str] | None = None
        self.trailers: tuple[tuple[str, str], ...] = ()

    def set_trailing_metadata(self, trailers: tuple[tuple[str, str], ...]) -> None:
        self.trailers = trailers

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def time_remaining(self) -> float | None:
        return self._remaining

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        self.aborted = (code, details)
        raise Aborted

    def code(self) -> grpc.StatusCode | None:
        return None if self.aborted is None else self.aborted[0]


async def test_expired_work_is_refused_before_the_handler_runs() -> None:
    calls: list[Any] = []

    async def handler(request: Any, context: Any) -> str:
        calls.append(request)
        return "done"

    wrapped = RequestInterceptor("test")._wrap("Rank", handler)
    ctx = Context(time_remaining=-0.01, metadata=(("x-slo-class", "A"),))
    with pytest.raises(Aborted):
        await wrapped("req", ctx)
    assert calls == []
    assert ctx.aborted is not None and ctx.aborted[0] == grpc.StatusCode.DEADLINE_EXCEEDED


async def test_handler_sees_the_class_and_budget_and_errors_map_to_status() -> None:
    seen: list[tuple[str, float | None]] = []

    async def handler(request: Any, context: Any) -> str:
        seen.append((current_slo_class(), remaining_s()))
        raise InvalidArgument("count must be positive")

    wrapped = RequestInterceptor("test")._wrap("Rank", handler)
    ctx = Context(time_remaining=0.25, metadata=(("x-slo-class", "B"),))
    with pytest.raises(Aborted):
        await wrapped("req", ctx)
    ((cls, left),) = seen
    assert cls == "B" and left is not None and 0.2 < left <= 0.25
    assert ctx.aborted == (grpc.StatusCode.INVALID_ARGUMENT, "count must be positive")


async def test_shed_work_is_resource_exhausted_with_a_retry_after_trailer() -> None:
    async def handler(request: Any, context: Any) -> str:
        raise ResourceExhausted("overloaded: class C shed", retry_after_s=2)

    wrapped = RequestInterceptor("test")._wrap("Recommend", handler)
    ctx = Context(time_remaining=1.0, metadata=(("x-slo-class", "C"),))
    with pytest.raises(Aborted):
        await wrapped("req", ctx)
    assert ctx.aborted is not None and ctx.aborted[0] == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert ctx.trailers == (("retry-after", "2"), ("x-slo-class", "C"), ("grpc-retry-pushback-ms", "2000"))


async def test_a_methods_wrapper_is_built_once_and_health_passes_through() -> None:
    async def handler(request: Any, context: Any) -> str:
        return "done"

    rank = grpc.unary_unary_rpc_method_handler(handler)
    health = grpc.unary_unary_rpc_method_handler(handler)

    async def continuation(details: Any) -> grpc.RpcMethodHandler:
        return health if details.method.startswith("/grpc.") else rank

    class Details:
        def __init__(self, method: str) -> None:
            self.method = method

    interceptor = RequestInterceptor("test")
    first = await interceptor.intercept_service(continuation, Details("/recmesh.v1.RankerService/Rank"))
    again = await interceptor.intercept_service(continuation, Details("/recmesh.v1.RankerService/Rank"))
    assert first is again and first is not rank, "wrapped once, then reused"
    assert await first.unary_unary("req", Context(1.0)) == "done"
    passed = await interceptor.intercept_service(continuation, Details("/grpc.health.v1.Health/Check"))
    assert passed is health


def test_an_internal_hop_takes_only_a_known_class_from_metadata() -> None:
    assert hop_class({"x-slo-class": "A"}) == "A"
    assert hop_class({"x-slo-class": "drop table"}) == "unknown", "a label must not take any string"
    assert hop_class({}) == "unknown"
