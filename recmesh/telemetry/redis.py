"""Redis client spans: the OpenTelemetry instrumentation, with the request's SLO class on each span."""

from __future__ import annotations

from typing import Any

from opentelemetry.trace import Span

from recmesh.resilience import current_slo_class
from recmesh.telemetry.http import opt_in_stable_http


def _redis_request_hook(span: Span, instance: Any, args: Any, kwargs: Any) -> None:
    if span.is_recording():
        span.set_attribute("recmesh.slo_class", current_slo_class())


def _redis_response_hook(span: Span, instance: Any, response: Any) -> None:
    # Pipelines call only the response hook.
    if span.is_recording():
        span.set_attribute("recmesh.slo_class", current_slo_class())


def instrument_redis() -> None:
    """One CLIENT span per Redis command or pipeline (db.system=redis, server.address,
    server.port), with the request's class."""
    from opentelemetry.instrumentation.redis import RedisInstrumentor

    opt_in_stable_http()  # server.address/server.port on the spans (the instrumentation's HTTP mode)
    instrumentor = RedisInstrumentor()
    if not instrumentor.is_instrumented_by_opentelemetry:
        instrumentor.instrument(request_hook=_redis_request_hook, response_hook=_redis_response_hook)
