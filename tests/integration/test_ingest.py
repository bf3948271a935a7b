"""The ingest consumer against a real Tansu broker and a real redis-server."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import orjson
import redis.asyncio as redis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from recmesh.features.covisit import pair_increments
from recmesh.features.repository import DEMO_REPOSITORY, load_feature_set
from recmesh.redis_client import connect
from recmesh.settings import IngestSettings
from services.feature.ingest import running
from services.feature.recall_store import RecallStore
from services.feature.store import FeatureStore
from services.feature.writer import EventWriter, PreparedBatch, WriteResult
from tests.helpers import poll_until, produce_events

FEATURE_SET = load_feature_set(DEMO_REPOSITORY)


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
    store = FeatureStore(client, FEATURE_SET)
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
    store = FeatureStore(client, FEATURE_SET)
    async with running(settings, store) as ingestor:
        await poll_until(lambda: asyncio.sleep(0, ingestor.applied == 6), "6 events applied", 15)
        assert ingestor.duplicates == 3, "the second copy of each event id is dropped and counted"
    related = await RecallStore(client).related(["i1"], 10, 10)
    assert related == [("i2", 1.0), ("i3", 1.0)], "each co-visit counted once despite the duplicates"
    await client.aclose()


def _expected_covisits(views: Sequence[Mapping[str, object]]) -> dict[str, dict[str, int]]:
    """The co-visit rule applied to each user's views in event-time order."""
    pairs: list[tuple[str, str]] = []
    latest: dict[str, dict[str, int]] = {}  # per user, item -> its latest view so far
    roles = FEATURE_SET.roles
    for v in sorted(views, key=lambda v: int(str(v["event_time"]))):
        seen = latest.setdefault(str(v["user_id"]), {})
        t, item = int(str(v["event_time"])), str(v["item_id"])
        # the user's other items whose latest view is in (t - window, t), newest first
        inside = sorted(
            ((et, i) for i, et in seen.items() if t - roles.covisit_window_ms < et < t and i != item),
            reverse=True,
        )
        pairs += [(item, other) for _, other in inside[: roles.covisit_previous]]
        seen[item] = max(seen.get(item, -1), t)
    return pair_increments(pairs)


class _UnevenWriter(EventWriter):
    """The real writer, with every other write held back as a slow Redis would."""

    def __init__(self, store: FeatureStore) -> None:
        super().__init__(store.client, store.feature_set, store.offline.attributes)
        self.writes = 0

    async def write(self, plan: PreparedBatch) -> WriteResult:
        self.writes += 1
        if self.writes % 2:
            await asyncio.sleep(0.05)
        return await super().write(plan)


async def test_co_visits_over_many_small_batches_are_those_of_the_rule(
    kafka_bootstrap: str, scratch_redis_url: str, redis_client: redis.Redis, topics: dict[str, str]
) -> None:
    """The next batch is prepared while one is written, and co-visits read what
    earlier batches wrote: with writes of uneven duration, a batch written before
    its predecessor would lose pairs here."""
    now = int(time.time() * 1000) - 20 * 60_000
    views = [
        {"event_id": f"mb{n}", "user_id": f"u{n % 7}", "item_id": f"i{(n * 7919) % 23}",
         "behavior": "view" if n % 5 else "click", "event_time": now + n * 1000}
        for n in range(700)
    ]  # fmt: skip
    await produce_events(kafka_bootstrap, topics["events"], views)
    settings = IngestSettings(
        kafka_bootstrap=kafka_bootstrap, redis_url=scratch_redis_url, events_topic=topics["events"],
        dlq_topic=topics["dlq"], consumer_group=f"g-{topics['events']}", max_batch=20,
    )  # fmt: skip
    client = connect(scratch_redis_url, 4)
    store = FeatureStore(client, FEATURE_SET)
    writer = _UnevenWriter(store)
    async with running(settings, store, writer=writer) as ingestor:
        await poll_until(lambda: asyncio.sleep(0, ingestor.applied == 700), "700 events applied", 30)
    assert writer.writes >= 20
    expected = _expected_covisits(views)
    recall = RecallStore(client)
    for item, counts in expected.items():
        got = dict(await recall.related([item], 100, 100))
        assert got == {k: float(v) for k, v in counts.items()}, item
    await client.aclose()


async def test_the_consumer_waits_at_most_the_configured_fetch_wait(kafka_bootstrap: str) -> None:
    """The broker holds a fetch up to this wait (Tansu: always), so it bounds freshness."""
    from services.feature.ingest import make_consumer

    consumer = make_consumer(IngestSettings(kafka_bootstrap=kafka_bootstrap))
    assert consumer._fetch_max_wait_ms == 50 == IngestSettings().fetch_max_wait_ms
    slow = make_consumer(IngestSettings(fetch_max_wait_ms=300))
    assert slow._fetch_max_wait_ms == 300
    await consumer.stop()
    await slow.stop()


async def test_an_idle_consumer_fetches_with_its_longer_wait_and_shortens_it_with_records(
    kafka_bootstrap: str, scratch_redis_url: str, topics: dict[str, str]
) -> None:
    """aiokafka builds every fetch with its fetcher's wait (a private attribute,
    FetchWait): set on the running consumer, and back to the short one once
    records come."""
    from services.feature.ingest import FETCH_WAIT

    settings = IngestSettings(
        kafka_bootstrap=kafka_bootstrap, redis_url=scratch_redis_url, events_topic=topics["events"],
        dlq_topic=topics["dlq"], consumer_group=f"g-{topics['events']}",
    )  # fmt: skip
    assert (settings.fetch_max_wait_ms, settings.idle_fetch_max_wait_ms) == (50, 250)
    client = connect(scratch_redis_url, 4)
    store = FeatureStore(client, FEATURE_SET)

    def wait_ms(ingestor: object) -> int:
        return int(ingestor.consumer._fetcher._fetch_max_wait_ms)  # type: ignore[attr-defined]

    async with running(settings, store) as ingestor:
        await poll_until(lambda: asyncio.sleep(0, wait_ms(ingestor) == 250), "the idle wait", 10)
        assert FETCH_WAIT._value.get() == 250
        event = {"event_id": "w1", "user_id": "u1", "item_id": "i1", "behavior": "click",
                 "event_time": int(time.time() * 1000)}  # fmt: skip
        await _produce(kafka_bootstrap, topics["events"], [(b"u1", orjson.dumps(event))])
        await poll_until(lambda: asyncio.sleep(0, ingestor.applied == 1), "the event applied", 10)
        assert wait_ms(ingestor) == 50
        assert FETCH_WAIT._value.get() == 50
    await client.aclose()


def test_a_stop_during_start_up_gives_it_up_cleanly(redis_url: str, tmp_path: Path) -> None:
    """The ingest process stopped while it cannot start (no broker at its address: it
    retries) exits at once and cleanly: the signal is not asyncio's KeyboardInterrupt."""
    from recmesh.tools.localinfra import free_port

    log = tmp_path / "ingest.log"
    env = dict(os.environ, REDIS_URL=redis_url, KAFKA_BOOTSTRAP=f"127.0.0.1:{free_port()}",
               INGEST_METRICS_PORT=str(free_port()), RECMESH_STATE_SAMPLE_S="0")  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "services.feature.ingest"], env=env, stdout=out,
                                stderr=subprocess.STDOUT)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while b"kafka producer" not in log.read_bytes():  # retrying the broker
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        code = proc.wait(5)
    finally:
        proc.kill()
    text = log.read_text()
    assert code == 0, text
    assert "stopped_while_starting" in text and "Traceback" not in text, text
