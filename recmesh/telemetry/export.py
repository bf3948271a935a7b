"""Span export: the spans file, OTLP exporters, dropped-span counts and the bounded flush at exit."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import orjson
import structlog
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult
from prometheus_client import Counter

_log = structlog.get_logger("recmesh.telemetry")


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
