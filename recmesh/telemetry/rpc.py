"""gRPC spans: the CLIENT span of an outbound call, the SERVER span of an inbound one, their status."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import grpc
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode

from recmesh.telemetry.spans import unsampled_parent

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
    parent = unsampled_parent()
    if parent is not None:  # nothing would record it (recmesh.telemetry.spans): the context travels on
        carrier: dict[str, str] = {}
        propagate.inject(carrier)
        yield parent, list(carrier.items())
        return
    attributes = _rpc_attributes(full_method, slo_class)
    if server:
        attributes.update(server)
    with _grpc_tracer.start_as_current_span(
        full_method, kind=SpanKind.CLIENT, attributes=attributes,
        record_exception=False, set_status_on_exception=False,
    ) as span:  # fmt: skip
        carrier = {}
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
