"""The ingest consumer against a real Tansu broker and a real redis-server."""

from __future__ import annotations

import asyncio
import time

import orjson
import redis.asyncio as redis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from recmesh.redis_client import connect
from recmesh.settings import IngestSettings
from services.feature.ingest import running
from services.feature.recall_store import RecallStore
from services.feature.store import FeatureStore
from tests.helpers import poll_until


async def _produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all")
    await producer.start()
    try:
        for key, value in records:
            await producer.send_and_wait(topic, value=value, key=key)
    finally:
        await producer.stop()


async def _dlq_records(
    bootstrap: str, topic: str, expected: int
) -> list[tuple[bytes | None, dict[str, bytes]]]:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest",
                                group_id=f"reader-{topic}")  # fmt: skip
    await consumer.start()
    out: list[tuple[bytes | None, dict[str, bytes]]] = []
    try:
        deadline = time.monotonic() + 15
        while len(out) < expected and time.monotonic() < deadline:
            batch = await consumer.getmany(timeout_ms=500)
            for recs in batch.values():
                out.extend((r.value, dict(r.headers)) for r in recs)
    finally:
        await consumer.stop()
    return out


async def test_good_events_land_bad_ones_are_dead_lettered_and_offsets_commit(
    kafka_bootstrap: str, scratch_redis_url: str, redis_client: redis.Redis, topics: dict[str, str]
) -> None:
    now = int(time.time() * 1000)
    good = [
        {
            "event_id": f"k{i}",
            "user_id": "u1",
            "item_id": "i1",
            "behavior": "click",
            "event_time": now - i,
        }
        for i in range(50)
    ]
    bad: list[bytes] = [
        b"{nope",
        orjson.dumps({**good[0], "event_id": "b1", "behavior": "like"}),
        orjson.dumps({**good[0], "event_id": "b2", "event_time": now + 10 * 3600 * 1000}),
        orjson.dumps({"event_id": "b3", "user_id": "u1"}),
    ]
    records = [(b"u1", orjson.dumps(g)) for g in good[:25]] + [(b"u1", b) for b in bad]
    records += [(b"u1", orjson.dumps(g)) for g in good[25:]]
    await _produce(kafka_bootstrap, topics["events"], records)

    settings = IngestSettings(
        kafka_bootstrap=kafka_bootstrap, redis_url=scratch_redis_url, events_topic=topics["events"],
        dlq_topic=topics["dlq"], consumer_group=f"g-{topics['events']}",
    )  # fmt: skip
    client = connect(scratch_redis_url, 4)
    store = FeatureStore(client)
    async with running(settings, store) as ingestor:
        await poll_until(lambda: asyncio.sleep(0, ingestor.applied == 50), "50 events applied", 15)
        parts = [TopicPartition(topics["events"], p) for p in range(3)]

        async def committed_all() -> bool:
            ends = await ingestor.consumer.end_offsets(parts)
            committed = [await ingestor.consumer.committed(p) or 0 for p in parts]
            return bool(sum(committed) == sum(ends.values()) == len(records))

        await poll_until(committed_all, "offsets committed to the end", 10)

    lookup = await store.lookup("u1", ["i1"], now, timeout_s=1.0)
    assert lookup.items[0]["clicks_10m"][0] == 50
    dlq = await _dlq_records(kafka_bootstrap, topics["dlq"], 4)
    reasons = sorted(h["reason"].decode() for _, h in dlq)
    assert reasons == ["event_time_in_future", "invalid_event", "invalid_event", "not_json"]
    assert {v for v, _ in dlq} == set(bad)
    assert all(b"/" in h["source"] for _, h in dlq)
    await client.aclose()


async def test_the_consumer_learns_co_visits_once_per_event(
    kafka_bootstrap: str, scratch_redis_url: str, redis_client: redis.Redis, topics: dict[str, str]
) -> None:
    now = int(time.time() * 1000)
    views = [
        {"event_id": f"cv{n}", "user_id": "u9", "item_id": item, "behavior": "view", "event_time": now + n}
        for n, item in enumerate(["i1", "i2", "i3"])
    ]
    # Every event twice, as a redelivery would bring it.
    records = [(b"u9", orjson.dumps(v)) for v in views + views]
    await _produce(kafka_bootstrap, topics["events"], records)
    settings = IngestSettings(
        kafka_bootstrap=kafka_bootstrap, redis_url=scratch_redis_url, events_topic=topics["events"],
        dlq_topic=topics["dlq"], consumer_group=f"g-{topics['events']}",
    )  # fmt: skip
    client = connect(scratch_redis_url, 4)
    store = FeatureStore(client)
    async with running(settings, store) as ingestor:
        await poll_until(lambda: asyncio.sleep(0, ingestor.applied == 6), "6 events applied", 15)
    related = await RecallStore(client).related(["i1"], 10, 10)
    assert related == [("i2", 1.0), ("i3", 1.0)], "each co-visit counted once despite the duplicates"
    await client.aclose()
