"""Sampled log of served feature vectors to Kafka, off the request path.

A look-up only decides whether it is sampled and, if so, puts a reference to
what it served on a bounded queue (no copy, no encoding). A background task
builds the JSON record (recmesh/features/served.py) and produces it. When the
queue is full the record is dropped and counted; a look-up never waits for
the log. When Kafka is unreachable the producer keeps retrying in the
background and the queue sheds the overflow.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import orjson
import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from opentelemetry import context as otel_context
from opentelemetry.context import Context
from prometheus_client import Counter

from recmesh.features.served import Applied, served_record
from recmesh.producer import make_producer, produce
from recmesh.resilience import current_slo_class, retry_until
from recmesh.settings import FeatureSettings
from services.feature.store import Lookup

_log = structlog.get_logger("recmesh.feature.served_log")

SERVED = Counter(
    "recmesh_served_features_total",
    "Served feature vectors offered to the served-feature log, by outcome.",
    ("outcome",),
)
_QUEUED, _SENT, _DROPPED, _FAILED = (
    SERVED.labels(o) for o in ("queued", "sent", "dropped_queue_full", "send_failed")
)


@dataclass(frozen=True, slots=True)
class _Served:
    request_id: str
    trace_id: str
    served_at_ms: int
    as_of_ms: int
    user_id: str
    item_ids: Sequence[str]
    lookup: Lookup
    context: Context  # the look-up's trace context: the send's span is its child
    slo_class: str
    applied: Applied | None  # keys.applied read before and after the look-up


class ServedLog:
    def __init__(
        self,
        make_producer: Callable[[], AIOKafkaProducer],
        topic: str,
        rate: float,
        queue_max: int = 1000,
        rand: Callable[[], float] = random.random,
        *,
        feature_version: str,
    ) -> None:
        self._make_producer = make_producer
        self.feature_version = feature_version
        self.topic = topic
        self.rate = rate
        self._rand = rand
        self._queue: asyncio.Queue[_Served] = asyncio.Queue(maxsize=queue_max)
        self.sent = 0
        self.dropped = 0

    def sampled(self) -> bool:
        return self.rate > 0 and (self.rate >= 1 or self._rand() < self.rate)

    def offer(
        self,
        *,
        request_id: str,
        trace_id: str,
        as_of_ms: int,
        user_id: str,
        item_ids: Sequence[str],
        lookup: Lookup,
        applied: Applied | None = None,
    ) -> None:
        """Queue a served look-up (call only when `sampled()`); never blocks."""
        now_ms = int(time.time() * 1000)
        request_id = request_id or uuid.uuid4().hex
        entry = _Served(
            request_id, trace_id, now_ms, as_of_ms, user_id, item_ids, lookup,
            otel_context.get_current(), current_slo_class(), applied,
        )  # fmt: skip
        try:
            self._queue.put_nowait(entry)
        except asyncio.QueueFull:
            self.dropped += 1
            _DROPPED.inc()
            return
        _QUEUED.inc()

    async def run(self, stop: asyncio.Event) -> None:
        """Produce queued records until `stop`, then flush what is queued (bounded)."""
        producer = self._make_producer()
        started = await self._start(producer, stop)
        try:
            while started and not (stop.is_set() and self._queue.empty()):
                try:
                    entry = await asyncio.wait_for(self._queue.get(), 0.2)
                except TimeoutError:
                    continue
                await self._send(producer, entry)
        finally:
            if started:
                await producer.stop()

    async def _start(self, producer: AIOKafkaProducer, stop: asyncio.Event) -> bool:
        starting = asyncio.create_task(
            retry_until(producer.start, "served-log producer", retry_on=(KafkaError, OSError), stop=stop)
        )
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if starting.done() and starting.exception() is None:
            return True
        starting.cancel()
        return False

    async def _send(self, producer: AIOKafkaProducer, entry: _Served) -> None:
        lk = entry.lookup
        record = served_record(
            feature_version=self.feature_version,
            request_id=entry.request_id,
            trace_id=entry.trace_id,
            served_at_ms=entry.served_at_ms,
            as_of_ms=entry.as_of_ms,
            user_id=entry.user_id,
            user=lk.user,
            item_ids=entry.item_ids,
            item_columns=lk.item_columns,
            degraded=lk.degraded,
            applied=entry.applied,
        )
        try:
            # The send is awaited only until the record is in the producer's
            # batch, not for the broker's acknowledgement.
            await produce(
                producer, self.topic, [(entry.user_id.encode(), orjson.dumps(record))],
                wait=False, parent=entry.context, slo_class=entry.slo_class,
            )  # fmt: skip
        except KafkaError as err:
            _FAILED.inc()
            _log.warning("served_log_send_failed", error=repr(err))
            return
        self.sent += 1
        _SENT.inc()


def served_log_from(settings: FeatureSettings, feature_version: str) -> ServedLog | None:
    """The service's served-feature log, or None when RECMESH_SERVED_LOG_RATE is 0."""
    if settings.served_log_rate <= 0:
        return None
    return ServedLog(
        lambda: make_producer(settings.kafka_bootstrap, acks=1, linger_ms=50),
        settings.served_topic,
        settings.served_log_rate,
        settings.served_log_queue,
        feature_version=feature_version,
    )
