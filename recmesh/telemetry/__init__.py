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

The package keeps one concern per module, imported one way (config, export,
http <- redis <- tracing; spans <- rpc, tracing; peer <- kafka): `metrics` (the Prometheus metrics,
observe_many, observe, children), `logs` (setup_logging, process_age_s), `config` (the `OTEL_*`
variables that choose exporters, protocol and sampler, TelemetryConfigError),
`export` (the spans file, OTLP exporters, dropped-span counts, Tracing and its
bounded flush), `tracing` (setup_tracing, current_trace_id), `spans` (child_span: no span
built where nothing could record it), `http` (the HTTP
semantic-convention opt-in and mode), `redis` (the Redis instrumentation),
`peer` (server_attributes of a dialled address), `kafka` (the Kafka spans and
trace headers) and `rpc` (the gRPC client and server spans). Every name is
re-exported here: import from `recmesh.telemetry`.
"""

from __future__ import annotations

from recmesh.telemetry.config import (
    OTLP_PROTOCOLS,
    SAMPLERS,
    TRACES_EXPORTERS,
    TelemetryConfigError,
    check_sampler,
    otlp_protocol,
    sdk_disabled,
    traces_exporters,
)
from recmesh.telemetry.export import (
    ABANDON_GRACE_S,
    DEFAULT_FLUSH_S,
    FINAL_ATTEMPT_S,
    SPANS_DROPPED,
    SPANS_FILE_DELAY_MS,
    JsonLinesSpanExporter,
    Tracing,
    _CountedProcessor,
    _GuardedExporter,
)
from recmesh.telemetry.http import (
    HTTP_SEMCONV_MODES,
    SEMCONV_OPT_IN,
    http_semconv_mode,
    opt_in_stable_http,
    semconv_opt_in,
)
from recmesh.telemetry.kafka import (
    MAX_LINKS,
    kafka_consume_span,
    kafka_produce_span,
    kafka_server_attributes,
    kafka_trace_headers,
    set_kafka_partition,
)
from recmesh.telemetry.logs import process_age_s, setup_logging
from recmesh.telemetry.metrics import (
    CIRCUIT_OPENED,
    CIRCUIT_STATE,
    DEADLINES_EXPIRED,
    DOWNSTREAM_LATENCY,
    EXTRA_ATTEMPTS,
    FALLBACKS,
    LATENCY_BUCKETS,
    REQUEST_LATENCY,
    children,
    observe,
    observe_many,
)
from recmesh.telemetry.peer import GRPC_PORT, KAFKA_PORT, SERVER_ADDRESS, SERVER_PORT, server_attributes
from recmesh.telemetry.redis import instrument_redis
from recmesh.telemetry.rpc import RPC_STATUS_ATTRIBUTE, end_rpc_span, grpc_client_span, grpc_server_span
from recmesh.telemetry.spans import child_span
from recmesh.telemetry.tracing import current_trace_id, setup_tracing

__all__ = [
    "ABANDON_GRACE_S",
    "CIRCUIT_OPENED",
    "CIRCUIT_STATE",
    "DEADLINES_EXPIRED",
    "DEFAULT_FLUSH_S",
    "DOWNSTREAM_LATENCY",
    "EXTRA_ATTEMPTS",
    "FALLBACKS",
    "FINAL_ATTEMPT_S",
    "GRPC_PORT",
    "HTTP_SEMCONV_MODES",
    "KAFKA_PORT",
    "LATENCY_BUCKETS",
    "MAX_LINKS",
    "OTLP_PROTOCOLS",
    "REQUEST_LATENCY",
    "RPC_STATUS_ATTRIBUTE",
    "SAMPLERS",
    "SEMCONV_OPT_IN",
    "SERVER_ADDRESS",
    "SERVER_PORT",
    "SPANS_DROPPED",
    "SPANS_FILE_DELAY_MS",
    "TRACES_EXPORTERS",
    "JsonLinesSpanExporter",
    "TelemetryConfigError",
    "Tracing",
    "_CountedProcessor",
    "_GuardedExporter",
    "check_sampler",
    "child_span",
    "children",
    "current_trace_id",
    "end_rpc_span",
    "grpc_client_span",
    "grpc_server_span",
    "http_semconv_mode",
    "instrument_redis",
    "kafka_consume_span",
    "kafka_produce_span",
    "kafka_server_attributes",
    "kafka_trace_headers",
    "observe",
    "observe_many",
    "opt_in_stable_http",
    "otlp_protocol",
    "process_age_s",
    "sdk_disabled",
    "semconv_opt_in",
    "server_attributes",
    "set_kafka_partition",
    "setup_logging",
    "setup_tracing",
    "traces_exporters",
]
