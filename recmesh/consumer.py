"""The one Kafka consumer factory, what a batch commits, and how far behind a consumer is.

Every consumer of the mesh (the ingest, attribution) commits by hand, after the
write its records guard (`enable_auto_commit=False`), starts a new group at the
earliest record, and takes its credentials from the environment
(recmesh.credentials.kafka_options).
"""

from __future__ import annotations

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
