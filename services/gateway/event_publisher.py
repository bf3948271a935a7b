"""Publishing behaviour events to Kafka with acks=all.

`publish` returns only once the broker acknowledged every event; if it cannot
(broker down, timeout) it raises Unavailable and the caller answers 503, so
nothing is silently dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from opentelemetry import trace
from prometheus_client import Counter

from recmesh.errors import Unavailable
from recmesh.events import Event
from recmesh.producer import make_producer, produce

_log = structlog.get_logger("recmesh.gateway.events")

PUBLISHED = Counter(
    "recmesh_gateway_events_total", "Events accepted by the broker, by outcome.", ("outcome",)
)


class EventPublisher:
    def __init__(self, bootstrap: str, topic: str, timeout_s: float) -> None:
        self._bootstrap = bootstrap
        self._topic = topic
        self._timeout_s = timeout_s
        self._producer: AIOKafkaProducer | None = None
        self._lock = asyncio.Lock()

    @property
    def ready(self) -> bool:
        return self._producer is not None

    async def _ensure(self) -> AIOKafkaProducer:
        async with self._lock:
            if self._producer is None:
                producer = make_producer(
                    self._bootstrap, linger_ms=2, request_timeout_ms=int(self._timeout_s * 1000)
                )
                try:
                    await producer.start()
                except (KafkaError, OSError) as err:
                    await producer.stop()
                    raise Unavailable(f"event broker unreachable: {err}") from err
                self._producer = producer
            return self._producer

    async def start(self) -> None:
        try:
            await self._ensure()
        except Unavailable as err:
            _log.warning("producer_not_started", error=str(err))

    async def publish(self, events: Sequence[Event]) -> None:
        producer = await self._ensure()
        try:
            async with asyncio.timeout(self._timeout_s):
                # One PRODUCER span; the consumer's span links back to this trace.
                await produce(producer, self._topic, [(e.user_id.encode(), e.to_json()) for e in events])
        except (KafkaError, TimeoutError, OSError) as err:
            PUBLISHED.labels("failed").inc(len(events))
            # On the request's span (the PRODUCER span has ended, with the error recorded).
            trace.get_current_span().set_attribute("recmesh.fallback_reason", "broker_unavailable")
            raise Unavailable(f"broker did not acknowledge the events: {err!r}") from err
        PUBLISHED.labels("accepted").inc(len(events))

    async def stop(self) -> None:
        if self._producer is not None:
            await self._producer.stop()
            self._producer = None
