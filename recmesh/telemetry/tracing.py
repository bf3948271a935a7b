"""The process's tracer provider, built from the `OTEL_*` variables, and the current trace id."""

from __future__ import annotations

import atexit
import functools
import os

import structlog
from opentelemetry import trace
from opentelemetry.sdk.resources import SERVICE_NAME, OTELResourceDetector, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased

from recmesh.telemetry.config import check_sampler, otlp_protocol, sdk_disabled, traces_exporters
from recmesh.telemetry.export import (
    DEFAULT_FLUSH_S,
    SPANS_FILE_DELAY_MS,
    JsonLinesSpanExporter,
    Tracing,
    _CountedProcessor,
    _GuardedExporter,
    _otlp_exporter,
)
from recmesh.telemetry.http import opt_in_stable_http
from recmesh.telemetry.redis import instrument_redis
from recmesh.telemetry.spans import follow_parent

_log = structlog.get_logger("recmesh.telemetry")


def setup_tracing(service: str, *, redis: bool = True, flush_s: float = DEFAULT_FLUSH_S) -> Tracing:
    """The process's tracer provider, from the standard OpenTelemetry
    variables (OTEL_SDK_DISABLED, OTEL_TRACES_EXPORTER, OTEL_EXPORTER_OTLP_*,
    OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES, OTEL_TRACES_SAMPLER[_ARG],
    OTEL_BSP_*), plus `RECMESH_SPANS_FILE`. At exit it flushes for at most
    `flush_s` (Tracing.shutdown). `redis=False` for a service that never talks
    to Redis: instrumenting it imports redis-py (~0.3 s of start-up).

    With no exporter configured (and no `OTEL_TRACES_SAMPLER`), traces that
    start here are not recorded: building spans nobody exports cost the
    ranker a tenth of its CPU. Trace context still flows (ids for logs,
    `traceparent` on every hop) with the not-sampled flag. A caller that sends
    a sampled `traceparent` is still honoured (its spans are built and the
    flag travels on), so hops further on that do export record its trace.

    Sets OTEL_SEMCONV_STABILITY_OPT_IN (opt_in_stable_http) before any
    instrumentation reads it."""
    env = os.environ
    opt_in_stable_http(env)
    spans_file = env.get("RECMESH_SPANS_FILE")
    if sdk_disabled(env):
        # The SDK's provider hands out no-op tracers: no spans, no trace ids.
        if spans_file:
            _log.warning("spans_file_ignored", reason="OTEL_SDK_DISABLED=true", path=spans_file)
        disabled = TracerProvider(shutdown_on_exit=False)
        trace.set_tracer_provider(disabled)
        return Tracing(service, disabled, [])
    check_sampler(env)
    pipelines: list[_CountedProcessor] = []
    for name in traces_exporters(env):
        if name == "otlp":
            protocol = otlp_protocol(env)
            final = functools.partial(_otlp_exporter, protocol)
            exporter = _GuardedExporter(_otlp_exporter(protocol), service, name, final)
        else:
            exporter = _GuardedExporter(ConsoleSpanExporter(), service, name)
        pipelines.append(_CountedProcessor(exporter))
    if spans_file:
        # Batched on the SDK's export thread: the request path only queues the
        # finished span (a synchronous exporter opened and appended to the
        # file once per span, on the event loop). A full queue drops spans
        # rather than slow requests; the flush at exit writes the rest.
        pipelines.append(_CountedProcessor(
            _GuardedExporter(JsonLinesSpanExporter(spans_file), service, "spans_file"),
            max_queue_size=8192, schedule_delay_millis=SPANS_FILE_DELAY_MS, max_export_batch_size=1024,
        ))  # fmt: skip
    unexported = not pipelines and "OTEL_TRACES_SAMPLER" not in env
    sampler = ParentBased(ALWAYS_OFF) if unexported else None  # None: the SDK's, from OTEL_TRACES_SAMPLER
    # OTEL_SERVICE_NAME, else service.name in OTEL_RESOURCE_ATTRIBUTES, else this process's name.
    named = SERVICE_NAME in OTELResourceDetector().detect().attributes
    resource = Resource.create({} if named else {SERVICE_NAME: service})
    # shutdown_on_exit=False: the SDK's own exit hook would wait out retries (see Tracing.shutdown).
    provider = TracerProvider(resource=resource, sampler=sampler, shutdown_on_exit=False)
    # A child of an unsampled parent is never sampled under these: child_span skips building it.
    follow_parent(isinstance(provider.sampler, ParentBased) or provider.sampler is ALWAYS_OFF)
    for pipeline in pipelines:
        provider.add_span_processor(pipeline)
    trace.set_tracer_provider(provider)
    tracing = Tracing(service, provider, pipelines)
    if pipelines:
        atexit.register(tracing.shutdown, flush_s)
    if redis:
        instrument_redis()
    return tracing


def current_trace_id() -> str:
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else ""
