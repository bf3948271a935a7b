"""The one Kafka consumer factory, what a batch commits, and how far behind a consumer is.

Every consumer of the mesh (the ingest, attribution) commits by hand, after the
write its records guard (`enable_auto_commit=False`), starts a new group at the
earliest record, and takes its credentials from the environment
(recmesh.credentials.kafka_options).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaError

from recmesh.credentials import kafka_options


def make_consumer(
    topics: tuple[str, ...],
    bootstrap: str,
    group: str,
    max_batch: int,
    fetch_max_wait_ms: int,
    **overrides: Any,
) -> AIOKafkaConsumer:
    return AIOKafkaConsumer(
        *topics,
        bootstrap_servers=bootstrap,
        group_id=group,
        enable_auto_commit=False,
        auto_offset_reset="earliest",
        max_poll_records=max_batch,
        fetch_max_wait_ms=fetch_max_wait_ms,
        **kafka_options(),
        **overrides,
    )


def next_offsets(records: Sequence[ConsumerRecord]) -> dict[TopicPartition, int]:
    """What to commit once `records` are applied: per partition, the offset after the last one."""
    out: dict[TopicPartition, int] = {}
    for rec in records:
        tp = TopicPartition(rec.topic, rec.partition)
        out[tp] = max(out.get(tp, 0), rec.offset + 1)
    return out


async def consumer_lag(consumer: AIOKafkaConsumer) -> dict[TopicPartition, int]:
    """Records behind the high watermark, per assigned partition whose watermark is known."""
    out: dict[TopicPartition, int] = {}
    for tp in consumer.assignment():
        high = consumer.highwater(tp)
        if high is None:
            continue
        try:
            out[tp] = max(0, high - await consumer.position(tp))
        except KafkaError:
            continue
    return out


# A consumer that has had no record for this long fetches with its idle wait.
IDLE_AFTER_S = 1.0


class FetchWait:
    """How long a consumer's fetches wait at the broker for records: `busy_ms`
    while records come, `idle_ms` once none has come for IDLE_AFTER_S.

    A fetch that finds nothing is held by the broker up to fetch.max.wait.ms,
    then the consumer sends the next: an idle consumer costs a request per wait
    on both sides. Kafka answers a held fetch as soon as a record arrives, so a
    long wait costs nothing there; the embedded Tansu broker answers only when
    the wait is over, so the ingest keeps its wait short (50 ms: freshness) and
    an idle mesh paid for 20 empty fetches a second, about 55 % of its CPU
    (docs/architecture.md, *Idle cost*). Stretching the wait while idle keeps
    the short one under traffic; the first record after a quiet second waits
    up to `idle_ms`.

    aiokafka reads the wait from its fetcher for every request it builds; the
    attribute is private (aiokafka 0.14), and tests/integration/test_ingest.py
    fails if it moves."""

    def __init__(self, consumer: AIOKafkaConsumer, busy_ms: int, idle_ms: int) -> None:
        self._consumer = consumer
        self.busy_ms = busy_ms
        self.idle_ms = max(idle_ms, busy_ms)
        self.current_ms = busy_ms
        self._last_records = time.monotonic()

    def observe(self, got_records: bool, now: float | None = None) -> int:
        """After a poll: the wait the next fetches use."""
        now = time.monotonic() if now is None else now
        if got_records:
            self._last_records = now
            wanted = self.busy_ms
        elif now - self._last_records >= IDLE_AFTER_S:
            wanted = self.idle_ms
        else:
            wanted = self.current_ms
        if wanted != self.current_ms:
            fetcher = getattr(self._consumer, "_fetcher", None)  # None until the consumer starts
            if fetcher is not None:
                fetcher._fetch_max_wait_ms = wanted
                self.current_ms = wanted
        return self.current_ms
