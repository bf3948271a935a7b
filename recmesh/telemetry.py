"""Tracing, metrics and structured logs, set up the same way in every process.

- Traces: OpenTelemetry with W3C `traceparent` propagation. Exporters follow the
  standard variables as the SDK reads them (setup_tracing): OTLP over grpc or
  http/protobuf once an endpoint is set (or `OTEL_TRACES_EXPORTER=otlp`);
  `RECMESH_SPANS_FILE` additionally writes finished spans as JSON lines (used by
  tests and latency attribution). At exit a process spends at most
  `RECMESH_TELEMETRY_FLUSH_S` exporting what it holds (Tracing.shutdown).
  Spans follow the stable semantic conventions: HTTP (`OTEL_SEMCONV_STABILITY_OPT_IN`
  gets `http` unless it names an HTTP mode, opt_in_stable_http), messaging for
  Kafka, and `server.address`/`server.port` on every client span.
- Metrics: Prometheus histograms labelled by service, method and SLO class with
  buckets fine enough to read P95/P99 between 1 ms and 1 s.
- Logs: structlog JSON lines carrying service, trace_id and span_id.
"""

from __future__ import annotations

import atexit
import bisect
import collections
import functools
import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, MutableMapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Any

import grpc
import orjson
import structlog
from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import SERVICE_NAME, OTELResourceDetector, Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ParentBased
from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode
from prometheus_client import Counter, Gauge, Histogram

from recmesh.resilience import current_slo_class

LATENCY_BUCKETS = (
    0.0005, 0.001, 0.002, 0.003, 0.004, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.02, 0.025,
    0.03, 0.04, 0.05, 0.075, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5,
    2.0, 3.0, 5.0,
)  # fmt: skip

REQUEST_LATENCY = Histogram(
    "recmesh_request_duration_seconds",
    "Server-side latency of one request, by service, method, SLO class and outcome.",
    ("service", "method", "slo_class", "code"),
    buckets=LATENCY_BUCKETS,
)
DOWNSTREAM_LATENCY = Histogram(
    "recmesh_downstream_duration_seconds",
    "Client-side latency of one call to a downstream, by caller, target and outcome.",
    ("service", "target", "method", "slo_class", "code"),
    buckets=LATENCY_BUCKETS,
)
FALLBACKS = Counter(
    "recmesh_fallbacks_total",
    "Requests served through a fallback, by service and reason.",
    ("service", "reason", "slo_class"),
)

CIRCUIT_STATE = Gauge(
    "recmesh_circuit_state",
    "Circuit breaker per downstream: 0 closed, 1 half-open, 2 open.",
    ("service", "target"),
)
CIRCUIT_OPENED = Counter("recmesh_circuit_opened_total", "Times a breaker opened.", ("service", "target"))
EXTRA_ATTEMPTS = Counter(
    "recmesh_downstream_extra_attempts_total",
    "Retries and hedged requests sent (kind), or denied by the retry budget (kind=*_denied).",
    ("service", "target", "method", "kind"),
)
DEADLINES_EXPIRED = Counter(
    "recmesh_deadline_expired_total",
    "Work refused because the request's deadline had passed: on arrival at a server, or before a call.",
    ("service", "where", "slo_class"),
)

_log = structlog.get_logger("recmesh.telemetry")


# --- logs -------------------------------------------------------------------


def _add_trace_ids(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    ctx = trace.get_current_span().get_span_context()
    if ctx.is_valid:
        event["trace_id"] = format(ctx.trace_id, "032x")
        event["span_id"] = format(ctx.span_id, "016x")
    return event


def _json_line(obj: Any, **_: Any) -> str:
    # A log call must never raise: int dict keys become strings, unknown objects their str().
    return orjson.dumps(obj, option=orjson.OPT_NON_STR_KEYS, default=str).decode()


def process_age_s() -> float | None:
    """Seconds since this process was created (Linux: /proc/self/stat, 10 ms
    ticks), so a cold-start figure includes interpreter start and imports;
    None where /proc is not available."""
    try:
        after_name = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        started_ticks = int(after_name[19])  # field 22, starttime (fields 1-2 precede the split)
    except (OSError, ValueError, IndexError):
        return None
    return time.clock_gettime(time.CLOCK_BOOTTIME) - started_ticks / os.sysconf("SC_CLK_TCK")


def setup_logging(service: str, level: str = "INFO", fmt: str = "json") -> None:
    numeric = logging.getLevelName(level.upper())
    if not isinstance(numeric, int):
        raise ValueError(f"unknown log level {level!r}")
    logging.basicConfig(level=max(numeric, logging.WARNING), stream=sys.stderr)
    renderer: Any = (
        structlog.processors.JSONRenderer(serializer=_json_line)
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _add_trace_ids,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(numeric),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=True,
    )
    structlog.contextvars.bind_contextvars(service=service)


# --- traces -----------------------------------------------------------------


class JsonLinesSpanExporter(SpanExporter):
    """Appends finished spans to a file, one JSON object a line."""

    def __init__(self, path: str) -> None:
        self._path = path
        self._lock = threading.Lock()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        lines = []
        for span in spans:
            ctx = span.get_span_context()
            if ctx is None:
                continue
            lines.append(
                orjson.dumps(
                    {
                        "name": span.name,
                        "service": span.resource.attributes.get("service.name"),
                        "trace_id": format(ctx.trace_id, "032x"),
                        "span_id": format(ctx.span_id, "016x"),
                        "parent_id": format(span.parent.span_id, "016x") if span.parent else None,
                        "kind": span.kind.name,
                        "start_ns": span.start_time,
                        "end_ns": span.end_time,
                        "status": span.status.status_code.name,
                        "attributes": dict(span.attributes or {}),
                        "links": [format(link.context.trace_id, "032x") for link in span.links],
                    },
                    default=str,
                )
            )
        with self._lock, open(self._path, "ab") as fh:
            for line in lines:
                fh.write(line + b"\n")
        return SpanExportResult.SUCCESS


SPANS_FILE_DELAY_MS = 200
DEFAULT_FLUSH_S = 1.0
# The timeout of each export during the shutdown flush: below the OTLP
# exporters' first retry back-off (1 s +-20 %), so a batch gets one attempt.
FINAL_ATTEMPT_S = 0.75
# After the flush budget: how long the export threads get to notice that they
# were cut off (so what they drop is counted) before the process goes on exiting.
ABANDON_GRACE_S = 0.2

SPANS_DROPPED = Counter(
    "recmesh_spans_dropped_total",
    "Sampled spans that never reached an exporter's backend, by exporter and reason: export_failed "
    "(the backend refused them or could not be reached, after the exporter's retries); unsent (still "
    "queued when the shutdown flush budget ran out, or pushed out of a full queue).",
    ("service", "exporter", "reason"),
)

OTLP_PROTOCOLS = ("grpc", "http/protobuf")
TRACES_EXPORTERS = ("otlp", "console", "none")
SAMPLERS = ("always_on", "always_off", "traceidratio",
            "parentbased_always_on", "parentbased_always_off", "parentbased_traceidratio")  # fmt: skip


class TelemetryConfigError(ValueError):
    """An `OTEL_*` variable that recmesh cannot honour; the message names it."""


def sdk_disabled(env: Mapping[str, str]) -> bool:
    return env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true"


def traces_exporters(env: Mapping[str, str]) -> list[str]:
    """The exporters `OTEL_TRACES_EXPORTER` names (comma-separated; `none`
    for none). Unset, recmesh exports OTLP only when an OTLP endpoint is set
    (`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` or `OTEL_EXPORTER_OTLP_ENDPOINT`),
    where the SDK's default would send to localhost: a mesh started without a
    collector must not keep failing exports."""
    raw = env.get("OTEL_TRACES_EXPORTER", "").strip()
    if not raw:
        endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        return ["otlp"] if endpoint else []
    names = [name.strip().lower() for name in raw.split(",") if name.strip()]
    unknown = [name for name in names if name not in TRACES_EXPORTERS]
    if unknown:
        raise TelemetryConfigError(
            f"OTEL_TRACES_EXPORTER: unsupported exporter {', '.join(unknown)}; use one or more of "
            f"{', '.join(TRACES_EXPORTERS)}"
        )
    return [] if "none" in names else list(dict.fromkeys(names))


def otlp_protocol(env: Mapping[str, str]) -> str:
    """The OTLP transport for traces: `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`,
    else `OTEL_EXPORTER_OTLP_PROTOCOL`, else `grpc`. The specification lets an
    SDK keep grpc as its default where grpc already was (OpenTelemetry Python's
    default, and recmesh's before it read the variable), so existing
    deployments that point at a collector's 4317 keep working."""
    for var in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        value = env.get(var, "").strip()
        if value:
            if value not in OTLP_PROTOCOLS:
                raise TelemetryConfigError(
                    f"{var}={value!r} is not supported; use one of {', '.join(OTLP_PROTOCOLS)}"
                )
            return value
    return "grpc"


def check_sampler(env: Mapping[str, str]) -> None:
    """Refuse a sampler the SDK would silently replace with its default."""
    name = env.get("OTEL_TRACES_SAMPLER", "").strip().lower()
    if name and name not in SAMPLERS:
        raise TelemetryConfigError(f"OTEL_TRACES_SAMPLER={name!r} is not one of {', '.join(SAMPLERS)}")
    if name.endswith("traceidratio") and "OTEL_TRACES_SAMPLER_ARG" in env:
        arg = env["OTEL_TRACES_SAMPLER_ARG"]
        try:
            ratio = float(arg)
        except ValueError:
            ratio = -1.0
        if not 0.0 <= ratio <= 1.0:
            raise TelemetryConfigError(f"OTEL_TRACES_SAMPLER_ARG={arg!r} is not a ratio between 0 and 1")


def _otlp_exporter(protocol: str, timeout_s: float | None = None) -> SpanExporter:
    """An OTLP exporter for `protocol`. Each reads the rest of its standard
    variables itself: the endpoint (http/protobuf appends /v1/traces to
    OTEL_EXPORTER_OTLP_ENDPOINT and takes OTEL_EXPORTER_OTLP_TRACES_ENDPOINT as
    it is), headers, timeout (unless `timeout_s`), compression, certificates
    and, for grpc, OTEL_EXPORTER_OTLP_INSECURE."""
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

        return HttpExporter(timeout=timeout_s)
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter

    return GrpcExporter(timeout=timeout_s)


class _GuardedExporter(SpanExporter):
    """Wraps an exporter: counts the spans it fails to deliver, and gives the
    shutdown flush its own rules. `finalize` switches to a `final` exporter
    whose timeout (FINAL_ATTEMPT_S) is below the OTLP exporters' first retry
    back-off, so each remaining batch gets one attempt, and interrupts a retry
    of the running exporter (that batch goes to the final one); `cut_off`
    drops everything from then on (the caller counts it as unsent)."""

    def __init__(self, inner: SpanExporter, service: str, name: str,
                 final: Callable[[float], SpanExporter] | None = None) -> None:  # fmt: skip
        self.name = name
        self.exported = 0
        self.failed = 0
        self.final_failed = False  # an export during the shutdown flush failed
        self._inner = inner
        self._make_final = final
        self._final: SpanExporter | None = None
        self._deadline: float | None = None
        self._failed_metric = SPANS_DROPPED.labels(service, name, "export_failed")
        self._cut = threading.Event()
        self._shut_lock = threading.Lock()
        self._shut: set[int] = set()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._cut.is_set():
            return SpanExportResult.FAILURE
        if self._final is None:
            try:
                result = self._inner.export(spans)
            except Exception:
                if self._final is None:
                    self._count(SpanExportResult.FAILURE, len(spans))
                    raise
                result = SpanExportResult.FAILURE  # the flush closed its connection under it
            if result is SpanExportResult.SUCCESS or self._final is None:
                return self._count(result, len(spans))
            # The flush began during this export (and interrupted its retries): one final attempt.
        return self._export_final(spans)

    def _export_final(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        assert self._final is not None and self._deadline is not None
        if time.monotonic() >= self._deadline:
            return SpanExportResult.FAILURE
        result = SpanExportResult.FAILURE
        try:
            result = self._final.export(spans)
        finally:
            if not self._cut.is_set():
                self.final_failed |= result is not SpanExportResult.SUCCESS
                self._count(result, len(spans))
        return result if not self._cut.is_set() else SpanExportResult.FAILURE

    def _count(self, result: SpanExportResult, n: int) -> SpanExportResult:
        if result is SpanExportResult.SUCCESS:
            self.exported += n
        else:
            self.failed += n
            self._failed_metric.inc(n)
        return result

    def finalize(self, deadline: float) -> None:
        self._deadline = deadline
        if self._make_final is None:
            self._final = self._inner
            return
        self._final = self._make_final(FINAL_ATTEMPT_S)
        self._shutdown(self._inner)

    def cut_off(self) -> None:
        self._cut.set()
        self.shutdown()

    def shutdown(self) -> None:
        self._shutdown(self._inner)
        if self._final is not None:
            self._shutdown(self._final)

    def _shutdown(self, exporter: SpanExporter) -> None:
        with self._shut_lock:
            if id(exporter) in self._shut:
                return
            self._shut.add(id(exporter))
        exporter.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return (self._final or self._inner).force_flush(timeout_millis)


class _CountedProcessor(BatchSpanProcessor):
    """The SDK's batching processor, counting the sampled spans it is handed."""

    def __init__(self, exporter: _GuardedExporter, **options: Any) -> None:
        super().__init__(exporter, **options)
        self.exporter = exporter
        self._lock = threading.Lock()
        self.queued = 0

    def on_end(self, span: ReadableSpan) -> None:
        if span.context is not None and span.context.trace_flags.sampled:
            with self._lock:
                self.queued += 1
        super().on_end(span)


class Tracing:
    """The process's tracer provider and its exporting pipelines."""

    def __init__(
        self, service: str, provider: TracerProvider, pipelines: Sequence[_CountedProcessor]
    ) -> None:
        self.service = service
        self.provider = provider
        self.pipelines = list(pipelines)
        self._done = False

    def shutdown(self, flush_s: float = DEFAULT_FLUSH_S) -> None:
        """Export what is queued, spending at most `flush_s` on it, then drop
        the rest, count it (recmesh_spans_dropped_total) and log it once.
        Pipelines flush side by side, each batch with one attempt and no
        retries; the first failure cuts a pipeline off (a collector that is
        down or speaks the other protocol fails fast, and retrying it would
        only use up the budget). The SDK's own shutdown waits out each
        exporter's retries, up to its 10 s timeout per batch: that held a
        stopping service for 10-30 s with the collector down."""
        if self._done or not self.pipelines:
            return
        self._done = True
        started = time.monotonic()
        deadline = started + flush_s
        flushing = {}
        for pipeline in self.pipelines:
            pipeline.exporter.finalize(deadline)
            thread = threading.Thread(target=pipeline.shutdown, name=f"flush-{pipeline.exporter.name}",
                                      daemon=True)  # fmt: skip
            thread.start()
            flushing[pipeline] = thread
        while True:
            waiting = [p for p, t in flushing.items() if t.is_alive() and not p.exporter.final_failed]
            left = deadline - time.monotonic()
            if not waiting or left <= 0:
                break
            flushing[waiting[0]].join(min(left, 0.01))
        cut_off = [p for p, t in flushing.items() if t.is_alive()]
        for pipeline in cut_off:
            pipeline.exporter.cut_off()
        grace_end = time.monotonic() + ABANDON_GRACE_S
        for pipeline in cut_off:
            flushing[pipeline].join(max(0.0, grace_end - time.monotonic()))
        self._report(flush_s, round(time.monotonic() - started, 3), [p.exporter.name for p in cut_off])

    def _report(self, flush_s: float, took_s: float, cut_off: list[str]) -> None:
        dropped: dict[str, dict[str, int]] = {}
        for pipeline in self.pipelines:
            exporter = pipeline.exporter
            unsent = max(0, pipeline.queued - exporter.exported - exporter.failed)
            if unsent:
                SPANS_DROPPED.labels(self.service, exporter.name, "unsent").inc(unsent)
            if unsent or exporter.failed:
                dropped[exporter.name] = {"unsent": unsent, "export_failed": exporter.failed}
        if dropped:
            _log.warning("spans_dropped", dropped=dropped, flush_s=flush_s, took_s=took_s, cut_off=cut_off)


# --- semantic conventions ---------------------------------------------------

SEMCONV_OPT_IN = "OTEL_SEMCONV_STABILITY_OPT_IN"
HTTP_SEMCONV_MODES = ("http", "http/dup")


def semconv_opt_in(value: str | None) -> str:
    """The OTEL_SEMCONV_STABILITY_OPT_IN a recmesh process runs with: `value`
    (comma-separated) with `http` added, unless it already names an HTTP mode
    (`http`, or `http/dup` for the old and the stable names side by side)."""
    opted = [part.strip() for part in (value or "").split(",") if part.strip()]
    if value and any(part in HTTP_SEMCONV_MODES for part in opted):
        return value
    return ",".join([*opted, "http"])


def opt_in_stable_http(env: MutableMapping[str, str] = os.environ) -> None:
    """Ask the OpenTelemetry instrumentations for the stable HTTP conventions
    (`http.request.method`, `http.response.status_code`, `url.scheme`, and
    `server.address`/`server.port` on the Redis client spans), keeping a
    user's own choice. Must run before an instrumentation initialises its
    stability mode (once per process, from the environment: FastAPIInstrumentor
    .instrument_app, RedisInstrumentor.instrument)."""
    env[SEMCONV_OPT_IN] = semconv_opt_in(env.get(SEMCONV_OPT_IN))


def http_semconv_mode() -> Any:
    """The HTTP stability mode the instrumentations of this process use
    (opentelemetry.instrumentation._semconv._StabilityMode): the gateway's
    hand-written SERVER span follows it, so every route speaks one vocabulary."""
    from opentelemetry.instrumentation._semconv import (
        _OpenTelemetrySemanticConventionStability as Stability,
    )
    from opentelemetry.instrumentation._semconv import _OpenTelemetryStabilitySignalType as Signal

    opt_in_stable_http()
    Stability._initialize()  # type: ignore[no-untyped-call]
    return Stability._get_opentelemetry_stability_opt_in_mode(Signal.HTTP)


SERVER_ADDRESS = "server.address"
SERVER_PORT = "server.port"
GRPC_PORT = 443  # gRPC's default for a target without a port
KAFKA_PORT = 9092


def server_attributes(address: str, default_port: int | None = None) -> dict[str, str | int]:
    """`server.address` and `server.port` of the peer a client dials at
    `address`: a gRPC target (`host:port`, `dns:///host:port`, `ipv4:`/`ipv6:`
    lists, `[::1]:port`, `unix:path` with no port) or a Kafka bootstrap list
    (its first server). `default_port` where the address has none."""
    target = address.split(",", 1)[0].strip()
    scheme, _, rest = target.partition(":")
    if scheme in ("unix", "unix-abstract"):
        path = rest.removeprefix("//")
        return {SERVER_ADDRESS: path} if path else {}
    if scheme in ("dns", "ipv4", "ipv6"):
        target = rest[2:].partition("/")[2] if rest.startswith("//") else rest  # dns://authority/host:port
    if target.startswith("["):
        host, _, tail = target[1:].partition("]")
        port_text = tail.removeprefix(":")
    elif target.count(":") == 1:
        host, _, port_text = target.partition(":")
    else:  # a name without a port, or an IPv6 address without brackets
        host, port_text = target, ""
    port = int(port_text) if port_text.isdigit() else default_port
    attributes: dict[str, str | int] = {SERVER_ADDRESS: host} if host else {}
    if host and port is not None:
        attributes[SERVER_PORT] = port
    return attributes


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
    for pipeline in pipelines:
        provider.add_span_processor(pipeline)
    trace.set_tracer_provider(provider)
    tracing = Tracing(service, provider, pipelines)
    if pipelines:
        atexit.register(tracing.shutdown, flush_s)
    if redis:
        instrument_redis()
    return tracing


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


# --- Kafka spans (aiokafka has no instrumentation matching our OTel version) --

_kafka_tracer = trace.get_tracer("recmesh.kafka")
MAX_LINKS = 32


def kafka_trace_headers() -> list[tuple[str, bytes]]:
    """The current trace context as Kafka record headers (traceparent)."""
    carrier: dict[str, str] = {}
    propagate.inject(carrier)
    return [(k, v.encode()) for k, v in carrier.items()]


def kafka_server_attributes(client: Any) -> dict[str, str | int]:
    """`server.address`/`server.port` of an aiokafka producer or consumer: its
    first bootstrap server (aiokafka keeps the list on its client, unexposed);
    none for anything else."""
    kafka_client = getattr(client, "client", None) or getattr(client, "_client", None)
    bootstrap = getattr(kafka_client, "_bootstrap_servers", None)
    if isinstance(bootstrap, (list, tuple)) and bootstrap:
        bootstrap = bootstrap[0]
    return _kafka_server(bootstrap) if isinstance(bootstrap, str) and bootstrap else {}


@functools.lru_cache(maxsize=64)
def _kafka_server(bootstrap: str) -> dict[str, str | int]:  # callers copy it, never change it
    return server_attributes(bootstrap, KAFKA_PORT)


def set_kafka_partition(span: Span, partitions: Iterable[int]) -> None:
    """`messaging.destination.partition.id` where the records of a span's batch
    were all on one partition; a batch across partitions names none."""
    if not span.is_recording():
        return
    distinct = set(partitions)
    if len(distinct) == 1:
        span.set_attribute("messaging.destination.partition.id", str(distinct.pop()))


@contextmanager
def kafka_produce_span(
    topic: str, count: int, parent: Context | None = None, slo_class: str | None = None,
    producer: Any = None,
) -> Iterator[Span]:  # fmt: skip
    """A PRODUCER span `send {topic}` (messaging conventions) around sending
    `count` records (and waiting for their acks); `parent` and `slo_class` for
    a send made later, off the request that caused it (default: the current
    context and class); `producer`, the aiokafka producer, for `server.*`."""
    attributes: dict[str, str | int] = {
        "messaging.system": "kafka", "messaging.operation.name": "send",
        "messaging.operation.type": "send", "messaging.destination.name": topic,
        "messaging.batch.message_count": count, **kafka_server_attributes(producer),
        "recmesh.slo_class": slo_class or current_slo_class(),
    }  # fmt: skip
    with _kafka_tracer.start_as_current_span(
        f"send {topic}", context=parent, kind=SpanKind.PRODUCER, attributes=attributes
    ) as span:
        yield span


@contextmanager
def kafka_consume_span(records: Sequence[Any], consumer: Any = None) -> Iterator[Span]:
    """A CONSUMER span `process {topic}` (messaging conventions) around
    processing one batch, linked to the traces that produced it; `consumer`,
    the aiokafka consumer, for its group and `server.*`. One span per batch
    (its work is shared): a batch across partitions names no partition."""
    links = []
    # One link per distinct producing trace (a batch usually holds a few
    # traces' records); compare raw headers so most records cost a set look-up.
    seen: set[tuple[tuple[str, bytes], ...]] = set()
    for rec in records:
        headers = tuple(getattr(rec, "headers", None) or ())
        if not headers or headers in seen:
            continue
        seen.add(headers)
        carrier = {k: v.decode("latin-1") for k, v in headers}
        ctx = trace.get_current_span(propagate.extract(carrier)).get_span_context()
        if ctx.is_valid:
            links.append(Link(ctx))
            if len(links) >= MAX_LINKS:
                break
    topic = records[0].topic if records else "unknown"
    attributes: dict[str, str | int] = {
        "messaging.system": "kafka", "messaging.operation.name": "process",
        "messaging.operation.type": "process", "messaging.destination.name": topic,
        "messaging.batch.message_count": len(records), **kafka_server_attributes(consumer),
    }  # fmt: skip
    group = getattr(consumer, "_group_id", None)
    if isinstance(group, str) and group:
        attributes["messaging.consumer.group.name"] = group
    with _kafka_tracer.start_as_current_span(
        f"process {topic}", kind=SpanKind.CONSUMER, links=links, attributes=attributes
    ) as span:
        set_kafka_partition(span, (rec.partition for rec in records))
        yield span


def current_trace_id() -> str:
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else ""


# --- gRPC spans --------------------------------------------------------------

_grpc_tracer = trace.get_tracer("recmesh.grpc")
RPC_STATUS_ATTRIBUTE = "rpc.grpc.status_code"


def _rpc_attributes(full_method: str, slo_class: str) -> dict[str, str | int]:
    service, _, method = full_method.lstrip("/").partition("/")
    return {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method,
            "recmesh.slo_class": slo_class}  # fmt: skip


@contextmanager
def grpc_client_span(
    full_method: str, slo_class: str, server: Mapping[str, str | int] | None = None
) -> Iterator[tuple[Span, list[tuple[str, str]]]]:
    """The CLIENT span of one outbound call and the metadata that carries its
    context (`traceparent`) to the callee; `server`: the dialled target's
    `server.address`/`server.port` (server_attributes). recmesh.clients.base
    opens it around each attempt instead of a channel interceptor: grpc.aio
    runs every intercepted call through an extra task and wrapper call
    object, about a third of a call's client-side CPU on this box."""
    attributes = _rpc_attributes(full_method, slo_class)
    if server:
        attributes.update(server)
    with _grpc_tracer.start_as_current_span(
        full_method, kind=SpanKind.CLIENT, attributes=attributes,
        record_exception=False, set_status_on_exception=False,
    ) as span:  # fmt: skip
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        yield span, list(carrier.items())


def grpc_server_span(
    full_method: str, slo_class: str, metadata: Mapping[str, Any]
) -> AbstractContextManager[Span]:
    """The SERVER span of one inbound call, continuing the caller's trace from
    its metadata (`traceparent`); recmesh.grpcserver's interceptor opens it."""
    return _grpc_tracer.start_as_current_span(
        full_method, context=propagate.extract(metadata), kind=SpanKind.SERVER,
        attributes=_rpc_attributes(full_method, slo_class),
        record_exception=False, set_status_on_exception=False,
    )  # fmt: skip


def end_rpc_span(span: Span, code: grpc.StatusCode, details: str = "") -> None:
    """Status of an RPC span: the gRPC code as an attribute, ERROR unless OK."""
    if not span.is_recording():
        return
    span.set_attribute(RPC_STATUS_ATTRIBUTE, code.value[0])
    if code is not grpc.StatusCode.OK:
        span.set_status(Status(StatusCode.ERROR, f"{code.name}: {details}"))


def observe_many(histogram: Histogram, amounts: Sequence[float]) -> None:
    """`histogram.observe(a)` for every amount, in one pass: the same buckets
    and sum, without a per-value call (the ingest consumer observes two values
    per event; one by one that was ~10 % of its CPU). Relies on
    prometheus_client's bucket layout; tests/unit/recmesh/test_telemetry.py compares it
    with `observe`. Amounts must not be NaN."""
    if not amounts:
        return
    histogram._raise_if_not_observable()  # type: ignore[no-untyped-call]
    bounds = histogram._upper_bounds
    indexes = map(functools.partial(bisect.bisect_left, bounds), amounts)
    for index, count in collections.Counter(indexes).items():
        histogram._buckets[index].inc(count)
    histogram._sum.inc(sum(amounts))
