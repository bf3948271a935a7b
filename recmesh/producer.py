"""Producing events to Kafka from the command line and `recmesh up`."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from aiokafka import AIOKafkaProducer

from recmesh.credentials import kafka_options
from recmesh.events import Event
from recmesh.telemetry import kafka_produce_span, kafka_trace_headers


async def produce(bootstrap: str, topic: str, events: Sequence[Event]) -> None:
    """Send with acks=all and wait for every acknowledgement."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5, **kafka_options())
    await producer.start()
    try:
        with kafka_produce_span(topic, len(events)):
            headers = kafka_trace_headers()
            futures = [
                await producer.send(topic, value=e.to_json(), key=e.user_id.encode(), headers=headers)
                for e in events
            ]
            await asyncio.gather(*futures)
    finally:
        await producer.stop()
