"""Kafka producers: the one factory, and the one traced send.

`make_producer` builds every aiokafka producer recmesh runs (acks, linger and
this process's Kafka security options, recmesh.credentials.kafka_options);
`produce` sends a batch of records in one PRODUCER span (`send {topic}`,
messaging conventions) with the trace context as each record's headers, so
the consumer's span links back to the trace that caused it
(telemetry.kafka_consume_span).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from opentelemetry.context import Context

from recmesh.credentials import kafka_options
from recmesh.events import Event
from recmesh.telemetry import kafka_produce_span, kafka_trace_headers, set_kafka_partition

Record = tuple[bytes | None, bytes]  # key, value


def make_producer(
    bootstrap: str, *, acks: int | str = "all", linger_ms: int = 5, **options: Any
) -> AIOKafkaProducer:
    """An unstarted producer for `bootstrap`; `options`: more of aiokafka's
    producer settings (e.g. request_timeout_ms, max_batch_size)."""
    return AIOKafkaProducer(
        bootstrap_servers=bootstrap, acks=acks, linger_ms=linger_ms, **kafka_options(), **options
    )


async def produce(
    producer: AIOKafkaProducer,
    topic: str,
    records: Sequence[Record],
    *,
    wait: bool = True,
    parent: Context | None = None,
    slo_class: str | None = None,
) -> None:
    """Send `records` to `topic` in one PRODUCER span, each carrying the trace
    context (traceparent) as headers. `wait`: until the broker acknowledged
    every one, else until each is in the producer's batch. `parent` and
    `slo_class` for a send made later, off the request that caused it
    (default: the current context and class). Kafka errors propagate."""
    with kafka_produce_span(topic, len(records), parent, slo_class, producer) as span:
        headers = kafka_trace_headers()
        futures = [
            await producer.send(topic, value=value, key=key, headers=headers) for key, value in records
        ]
        if wait:
            acked = await asyncio.gather(*futures)
            set_kafka_partition(span, (meta.partition for meta in acked))


async def produce_events(bootstrap: str, topic: str, events: Sequence[Event]) -> None:
    """Send events keyed by user with acks=all and wait for every
    acknowledgement, from a producer of their own (the CLI, `recmesh up`)."""
    producer = make_producer(bootstrap)
    await producer.start()
    try:
        await produce(producer, topic, [(e.user_id.encode(), e.to_json()) for e in events])
    finally:
        await producer.stop()
