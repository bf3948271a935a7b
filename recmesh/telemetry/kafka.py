"""Kafka spans and trace headers, by hand (aiokafka has no instrumentation matching our OTel version)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, Span, SpanKind

from recmesh.resilience import current_slo_class
from recmesh.telemetry.peer import KAFKA_PORT, server_attributes

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
