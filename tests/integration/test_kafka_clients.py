"""Kafka clients users actually run, against the embedded Tansu broker: a
confluent-kafka (librdkafka) producer feeds the ingest consumer, which writes
features to a real redis-server that the feature store reads back; a malformed
event lands in the dead-letter topic, which a confluent-kafka consumer reads.

librdkafka's calls block, so they run in a worker thread."""

from __future__ import annotations

import asyncio
import time

import orjson
import redis.asyncio as redis
from aiokafka.partitioner import DefaultPartitioner
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Message, Producer, TopicPartition

from recmesh.features.repository import DEMO_REPOSITORY, load_feature_set
from recmesh.redis_client import connect
from recmesh.settings import IngestSettings
from services.feature.ingest import running
from services.feature.store import FeatureStore
from tests.helpers import poll_until

EVENT_PARTITIONS = 3  # the `topics` fixture's events topic


def _produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> list[int]:
    """Send with librdkafka, as the README's snippet does; the partition of each delivery."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "partitioner": "murmur2_random"})
    delivered: list[int] = []
    failed: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            failed.append(err)
        else:
            delivered.append(msg.partition() or 0)

    for key, value in records:
        producer.produce(topic, value=value, key=key, on_delivery=on_delivery)
    left = producer.flush(15)
    assert left == 0 and not failed, (left, failed)
    return delivered


def _read(consumer: Consumer, expected: int, timeout_s: float) -> list[Message]:
    out: list[Message] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) < expected and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            out.append(msg)
    finally:
        consumer.close()
    return out


def _read_assigned(bootstrap: str, topic: str, expected: int) -> list[Message]:
    """A DLQ reader by partition assignment (no consumer group join)."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"dlq-reader-{topic}", "enable.auto.commit": False}
    )
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    return _read(consumer, expected, 15)


def _read_subscribed(bootstrap: str, topic: str, expected: int) -> list[Message]:
    """A DLQ reader in a consumer group. Tansu 0.6.0 holds the first JoinGroup for
    about half of session.timeout.ms (23 s at librdkafka's default 45 s), so the
    README and this reader set it to 6 s."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"dlq-group-{topic}",
         "auto.offset.reset": "earliest", "session.timeout.ms": 6000}
    )  # fmt: skip
    consumer.subscribe([topic])
    return _read(consumer, expected, 20)


def _headers(msg: Message) -> dict[str, bytes]:
    """A consumed record's headers (librdkafka gives them as a list of pairs)."""
    pairs = msg.headers() or []
    assert isinstance(pairs, list)
    return {k: v for k, v in pairs if isinstance(v, bytes)}


async def test_confluent_kafka_events_become_features_and_dead_letters_read_back(
    kafka_bootstrap: str, scratch_redis_url: str, redis_client: redis.Redis, topics: dict[str, str]
) -> None:
    now = int(time.time() * 1000)
    clicks = [
        {"event_id": f"ck{n}", "user_id": f"u{n % 4}", "item_id": "i7", "behavior": "click",
         "event_time": now - n}
        for n in range(40)
    ]  # fmt: skip
    malformed = orjson.dumps({"event_id": "ck-bad", "user_id": "u1", "item_id": "i7", "behavior": "like",
                              "event_time": now})  # fmt: skip
    records = [(str(e["user_id"]).encode(), orjson.dumps(e)) for e in clicks] + [(b"u1", malformed)]
    partitions = await asyncio.to_thread(_produce, kafka_bootstrap, topics["events"], records)
    # With partitioner=murmur2_random a user's events land where the gateway's
    # (aiokafka, Java's murmur2) put them, so one partition keeps a user's order.
    java_partitioner = DefaultPartitioner()
    every = list(range(EVENT_PARTITIONS))
    assert sorted(partitions) == sorted(java_partitioner(key, every, every) for key, _ in records)

    settings = IngestSettings(
        kafka_bootstrap=kafka_bootstrap, redis_url=scratch_redis_url, events_topic=topics["events"],
        dlq_topic=topics["dlq"], consumer_group=f"g-{topics['events']}",
    )  # fmt: skip
    client = connect(scratch_redis_url, 4)
    store = FeatureStore(client, load_feature_set(DEMO_REPOSITORY))
    try:
        async with running(settings, store) as ingestor:
            await poll_until(lambda: asyncio.sleep(0, ingestor.applied == 40), "40 events applied", 15)
        lookup = await store.lookup("u1", ["i7"], now, timeout_s=1.0)
    finally:
        await client.aclose()
    assert lookup.items[0]["clicks_10m"][0] == 40
    assert lookup.user["clicks_5m"][0] == 10  # u1's share: n = 1, 5, 9, ...

    for reader in (_read_assigned, _read_subscribed):
        dead = await asyncio.to_thread(reader, kafka_bootstrap, topics["dlq"], 1)
        assert len(dead) == 1, reader.__name__
        assert dead[0].value() == malformed and dead[0].key() == b"u1"
        headers = _headers(dead[0])
        assert headers["reason"] == b"invalid_event", headers
        assert headers["source"].startswith(f"{topics['events']}/".encode())
