"""Two small, real OTLP trace receivers for tests: OTLP/HTTP (protobuf bodies
POSTed to a path, /v1/traces by default) and OTLP/gRPC
(opentelemetry.proto.collector.trace.v1.TraceService/Export). Each decodes
every ExportTraceServiceRequest into `spans` and keeps the headers it came
with (the span's kind, attributes and links' trace ids too); start with
`with Receiver() as r:` or start()/stop()."""

from __future__ import annotations

import gzip
import threading
import zlib
from collections.abc import Iterable
from concurrent import futures
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2


@dataclass(frozen=True)
class ReceivedSpan:
    service: str
    trace_id: str
    name: str
    resource: dict[str, str]
    kind: str = "INTERNAL"  # SERVER, CLIENT, PRODUCER, CONSUMER, INTERNAL
    attributes: dict[str, Any] = field(default_factory=dict)
    links: tuple[str, ...] = ()  # the linked spans' trace ids


def _value(value: common_pb2.AnyValue) -> Any:
    which = value.WhichOneof("value")
    if which == "array_value":
        return [_value(v) for v in value.array_value.values]
    return None if which is None else getattr(value, which)


def _span(service: str, resource: dict[str, str], span: trace_pb2.Span) -> ReceivedSpan:
    return ReceivedSpan(
        service, span.trace_id.hex(), span.name, resource,
        trace_pb2.Span.SpanKind.Name(span.kind).removeprefix("SPAN_KIND_"),
        {kv.key: _value(kv.value) for kv in span.attributes},
        tuple(link.trace_id.hex() for link in span.links),
    )  # fmt: skip


@dataclass
class _Received:
    spans: list[ReceivedSpan] = field(default_factory=list)
    headers: list[dict[str, str]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, request: trace_service_pb2.ExportTraceServiceRequest, headers: dict[str, str]) -> None:
        spans = []
        for resource_spans in request.resource_spans:
            resource = {kv.key: kv.value.string_value for kv in resource_spans.resource.attributes}
            service = resource.get("service.name", "")
            for scope_spans in resource_spans.scope_spans:
                spans += [_span(service, resource, span) for span in scope_spans.spans]
        with self.lock:
            self.spans += spans
            self.headers.append(headers)

    def in_trace(self, trace_id: str) -> list[ReceivedSpan]:
        with self.lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def per_service(self, trace_id: str) -> dict[str, int]:
        counts: dict[str, int] = {}
        for span in self.in_trace(trace_id):
            counts[span.service] = counts.get(span.service, 0) + 1
        return dict(sorted(counts.items()))


class _Receiver(_Received):
    def __enter__(self) -> Any:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:  # fmt: skip
        self.stop()

    def start(self) -> None:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


class HttpReceiver(_Receiver):
    """OTLP/HTTP with protobuf bodies; any other path answers 404."""

    def __init__(self, path: str = "/v1/traces", port: int = 0) -> None:
        super().__init__()
        self.path = path
        self.port = port
        self.refused: list[str] = []  # paths of requests answered 404
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> None:
        received = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                if self.path != received.path:
                    received.refused.append(self.path)
                    self.send_error(404)
                    return
                encoding = self.headers.get("content-encoding", "")
                if encoding == "gzip":
                    body = gzip.decompress(body)
                elif encoding == "deflate":
                    body = zlib.decompress(body)
                request = trace_service_pb2.ExportTraceServiceRequest.FromString(body)
                received.add(request, {k.lower(): v for k, v in self.headers.items()})
                reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class GrpcReceiver(_Receiver):
    """OTLP/gRPC: the collector's TraceService."""

    def __init__(self, port: int = 0) -> None:
        super().__init__()
        self.port = port
        self._server: grpc.Server | None = None

    def start(self) -> None:
        received = self

        class Service(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(
                self, request: trace_service_pb2.ExportTraceServiceRequest, context: grpc.ServicerContext
            ) -> trace_service_pb2.ExportTraceServiceResponse:
                metadata: Iterable[tuple[str, str]] = context.invocation_metadata() or ()
                received.add(request, dict(metadata))
                return trace_service_pb2.ExportTraceServiceResponse()

        self._server = grpc.server(futures.ThreadPoolExecutor(4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Service(), self._server)  # type: ignore[no-untyped-call]
        self.port = self._server.add_insecure_port(f"127.0.0.1:{self.port}")
        self._server.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop(0).wait()
            self._server = None
