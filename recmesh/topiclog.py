"""A sampled log of what a service served, to a Kafka topic, off the request path.

The request path only decides whether it is sampled (`sampled`) and, if so,
puts a reference to what it served on a bounded queue (`offer`: no copy, no
encoding, never waits). A background task (`run`) encodes each entry and
produces it; a full queue drops the entry and counts it, and while Kafka is
unreachable the producer keeps retrying in the background and the queue sheds
the overflow. The feature service's served-feature log and the gateway's
impression log are two of these (services/feature/served_log.py,
services/gateway/impressions.py).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, TypeVar

import structlog
from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError
from opentelemetry.context import Context
from prometheus_client import Counter

from recmesh.producer import produce
from recmesh.resilience import retry_until

_log = structlog.get_logger("recmesh.topiclog")

T = TypeVar("T")

# The most entries one send carries (what queued up while the previous one was sent).
SEND_BATCH = 256
# How often a lingering send looks whether a batch is full or the log stopping.
LINGER_POLL_S = 0.02


@dataclass(frozen=True, slots=True)
class Record:
    """One entry as it goes to the topic."""

    key: bytes
    value: bytes
    parent: Context | None  # the trace context the send's span joins
    slo_class: str


class TopicLog(Generic[T]):
    """Entries of type T, sampled at `rate`, queued (at most `queue_max`) and produced
    to `topic` as `encode` makes them; `outcomes` counts them by outcome (queued, sent,
    dropped_queue_full, send_failed)."""

    def __init__(
        self,
        make_producer: Callable[[], AIOKafkaProducer],
        topic: str,
        rate: float,
        encode: Callable[[T], Record],
        outcomes: Counter,
        queue_max: int = 1000,
        rand: Callable[[], float] = random.random,
        linger_s: float = 0.0,
    ) -> None:
        """`linger_s`: how long a send waits, after its first entry, for more to
        join it: one send (a PRODUCER span, a producer batch, a broker request,
        a consumer fetch downstream) per that many seconds' entries instead of
        one per entry at low rates."""
        self._make_producer = make_producer
        self.topic = topic
        self.rate = rate
        self._encode = encode
        self._rand = rand
        self._linger_s = linger_s
        self._queue: asyncio.Queue[T] = asyncio.Queue(maxsize=queue_max)
        self._queued, self._sent, self._dropped, self._failed = (
            outcomes.labels(o) for o in ("queued", "sent", "dropped_queue_full", "send_failed")
        )
        self.sent = 0
        self.dropped = 0

    def sampled(self) -> bool:
        return self.rate > 0 and (self.rate >= 1 or self._rand() < self.rate)

    def put(self, entry: T) -> None:
        """Queue an entry (call only when `sampled()`); never blocks."""
        try:
            self._queue.put_nowait(entry)
        except asyncio.QueueFull:
            self.dropped += 1
            self._dropped.inc()
            return
        self._queued.inc()

    async def run(self, stop: asyncio.Event) -> None:
        """Produce queued entries until `stop`, then flush what is queued (bounded by the caller).
        What has queued up meanwhile goes in one send (at most SEND_BATCH): under load the
        per-send work (a PRODUCER span, the producer's bookkeeping) is paid once per batch."""
        producer = self._make_producer()
        started = await self._start(producer, stop)
        try:
            while started and not (stop.is_set() and self._queue.empty()):
                try:
                    entry = await asyncio.wait_for(self._queue.get(), 0.2)
                except TimeoutError:
                    continue
                batch = [entry]
                if self._linger_s > 0 and not stop.is_set():
                    await _linger(self._queue, stop, self._linger_s)
                while len(batch) < SEND_BATCH and not self._queue.empty():
                    batch.append(self._queue.get_nowait())
                await self._send(producer, batch)
        finally:
            if started:
                await producer.stop()

    async def _start(self, producer: AIOKafkaProducer, stop: asyncio.Event) -> bool:
        starting = asyncio.create_task(
            retry_until(producer.start, f"{self.topic} producer", retry_on=(KafkaError, OSError), stop=stop)
        )
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait({starting, stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        if starting.done() and starting.exception() is None:
            return True
        starting.cancel()
        return False

    async def _send(self, producer: AIOKafkaProducer, entries: list[T]) -> None:
        records = [self._encode(e) for e in entries]
        first = records[0]
        try:
            # Awaited only until the records are in the producer's batch, not for the
            # broker's acknowledgement; the span joins the first entry's trace.
            await produce(
                producer, self.topic, [(r.key, r.value) for r in records],
                wait=False, parent=first.parent, slo_class=first.slo_class,
            )  # fmt: skip
        except KafkaError as err:
            self._failed.inc(len(records))
            _log.warning("topic_log_send_failed", topic=self.topic, records=len(records), error=repr(err))
            return
        self.sent += len(records)
        self._sent.inc(len(records))


async def _linger(queue: asyncio.Queue[T], stop: asyncio.Event, linger_s: float) -> None:
    """Wait up to `linger_s` for more entries to queue, less when a send's worth
    is there or the log is stopping."""
    deadline = asyncio.get_running_loop().time() + linger_s
    while queue.qsize() < SEND_BATCH - 1 and not stop.is_set():
        left = deadline - asyncio.get_running_loop().time()
        if left <= 0:
            return
        await asyncio.sleep(min(left, LINGER_POLL_S))
