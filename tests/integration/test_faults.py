"""Faults with real processes: Redis stopped under the feature service and
under the consumer, the consumer SIGKILLed mid-stream, the broker restarted."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import redis.asyncio as redis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from recmesh.clients.feature import FeatureClient
from recmesh.clients.inference import InferenceClient
from recmesh.clients.ranker import RankerClient
from recmesh.features import keys
from recmesh.features.repository import DEMO_REPOSITORY, load_feature_set
from recmesh.redis_client import connect
from recmesh.settings import FeatureSettings, GatewaySettings, IngestSettings, RankerSettings
from recmesh.tools.demo.generate import make_catalog, offline_rows
from recmesh.tools.localinfra import ManagedProcess, broker_process, redis_process, wait_tcp
from recmesh.topics import ensure_topics
from services.feature.catalog import load_catalog
from services.feature.ingest import running
from services.feature.server import build_server as build_feature
from services.feature.store import FeatureStore
from services.gateway.app import GatewayDeps, create_app
from services.gateway.edge import ClassPolicy
from services.gateway.event_publisher import EventPublisher
from services.gateway.recommend import Recommender
from services.ranker.pipeline import build_pipeline
from services.ranker.server import build_server as build_ranker
from tests.helpers import free_port, poll_until, tile_events
from tests.integration.conftest import Mesh

ROOT = Path(__file__).resolve().parents[2]

FEATURE_SET = load_feature_set(DEMO_REPOSITORY)


class OwnRedis:
    """A redis-server this test may stop and start again on the same port,
    with an append-only file so its data survives the restart."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.dir = workdir
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.proc: ManagedProcess | None = None

    async def start(self) -> None:
        self.proc = redis_process(
            self.port, self.dir, self.dir, ["--appendonly", "yes", "--appendfsync", "always"]
        )
        self.proc.start()
        await wait_tcp("127.0.0.1", self.port, 10, self.proc)

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.stop()
            self.proc = None


@pytest.fixture
async def own_redis(tmp_path: Path) -> AsyncIterator[OwnRedis]:
    r = OwnRedis(tmp_path)
    await r.start()
    yield r
    r.stop()


def _equals(get: Callable[[], Awaitable[int]], want: int) -> Callable[[], Awaitable[bool]]:
    async def check() -> bool:
        return await get() == want

    return check


def _clicks(n: int, items: int, prefix: str) -> list[tuple[bytes, bytes]]:
    now = int(time.time() * 1000)
    return [
        (f"u{i % 50}".encode(), orjson.dumps({"event_id": f"{prefix}{i}", "user_id": f"u{i % 50}",
         "item_id": f"i{i % items}", "behavior": "click", "event_time": now - (n - i)}))
        for i in range(n)
    ]  # fmt: skip


async def _produce(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]]) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=5)
    await producer.start()
    try:
        futures = [await producer.send(topic, key=k, value=v) for k, v in records]
        await asyncio.gather(*futures)
    finally:
        await producer.stop()


async def _item_clicks(client: redis.Redis, items: int) -> int:
    pipe = client.pipeline(transaction=False)
    for i in range(items):
        pipe.zcard(keys.stream("item", f"i{i}", "click"))
    return sum(await pipe.execute())


async def _committed(bootstrap: str, topic: str, group: str) -> int:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    await consumer.start()
    try:
        return sum([await consumer.committed(TopicPartition(topic, p)) or 0 for p in range(3)])
    finally:
        await consumer.stop()


async def test_redis_down_while_serving_falls_back_without_5xx(own_redis: OwnRedis, mesh: Mesh) -> None:
    client = connect(own_redis.url, 8)
    store = FeatureStore(client, FEATURE_SET)
    await store.prepare()
    users, items = offline_rows(make_catalog())
    await load_catalog(client, FEATURE_SET, users, items)
    feature = build_feature(FeatureSettings(feature_port=free_port(), redis_url=own_redis.url), store)
    await feature.start()
    await feature.set_serving()
    fc = FeatureClient(feature.address, "ranker")
    ic = InferenceClient(mesh.inference.address, "ranker")
    ranker_settings = RankerSettings(ranker_port=free_port(), model_dir=own_redis.dir / "no-vectors")
    ranker = build_ranker(ranker_settings, build_pipeline(ranker_settings, fc, ic, FEATURE_SET))
    await ranker.start()
    await ranker.set_serving()
    rc, gw_fc = RankerClient(ranker.address, "gateway"), FeatureClient(feature.address, "gateway")
    recommender = Recommender(rc, gw_fc, 100)
    await recommender.refresh_popular()
    settings = GatewaySettings.model_validate({"RECMESH_ANONYMOUS_MAX_CLASS": "A"})
    app = create_app(
        settings,
        GatewayDeps(
            recommender,
            ClassPolicy.from_settings(settings),
            EventPublisher("127.0.0.1:1", "x", 0.1),
            {},
        ),
    )
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://gw") as http:

            async def warm() -> bool:
                # The first requests of a cold mesh on a busy box may run past a
                # node's share of class A's budget and degrade (the ladder at
                # work): warm until an answer comes back whole.
                resp = await http.post(
                    "/v1/recommend", json={"user_id": "u1", "count": 5}, headers={"x-slo-class": "A"}
                )
                return resp.status_code == 200 and resp.json()["degraded"] == []

            await poll_until(warm, "an undegraded answer before Redis stops", 10, interval=0.1)
            own_redis.stop()
            started = time.perf_counter()
            resp = await http.post(
                "/v1/recommend", json={"user_id": "u1", "count": 5}, headers={"x-slo-class": "A"}
            )
            elapsed = time.perf_counter() - started
            assert resp.status_code == 200, resp.text
            body = resp.json()
            assert "feature:realtime_store_unavailable" in body["degraded"]
            assert body["model_version"].startswith("ctr-"), "still scored, with offline features"
            assert len(body["items"]) == 5
            assert elapsed < 0.3, "inside class A's budget"
    finally:
        for c in (rc, gw_fc, fc, ic):
            await c.close()
        await ranker.stop(0.1)
        await feature.stop(0.1)
        await client.aclose()


async def test_redis_down_while_consuming_commits_nothing_and_loses_nothing(
    own_redis: OwnRedis, kafka_bootstrap: str, topics: dict[str, str]
) -> None:
    settings = IngestSettings(kafka_bootstrap=kafka_bootstrap, redis_url=own_redis.url,
                              events_topic=topics["events"], dlq_topic=topics["dlq"],
                              consumer_group=f"g-{topics['events']}")  # fmt: skip
    client = connect(own_redis.url, 4)
    group = settings.consumer_group
    try:
        async with running(settings, FeatureStore(client, FEATURE_SET)) as ingestor:
            await _produce(kafka_bootstrap, topics["events"], _clicks(100, 10, "a"))
            await poll_until(lambda: asyncio.sleep(0, ingestor.applied == 100), "first 100 applied", 20)
            await poll_until(
                _equals(lambda: _committed(kafka_bootstrap, topics["events"], group), 100), "commit 100", 10
            )

            own_redis.stop()
            await _produce(kafka_bootstrap, topics["events"], _clicks(100, 10, "b"))
            await asyncio.sleep(2.0)  # the consumer holds the batch and retries
            assert ingestor.applied == 100
            assert await _committed(kafka_bootstrap, topics["events"], group) == 100, (
                "nothing committed while down"
            )

            await own_redis.start()
            await poll_until(
                lambda: asyncio.sleep(0, ingestor.applied == 200), "second batch applied after restart", 30
            )
            await poll_until(
                _equals(lambda: _committed(kafka_bootstrap, topics["events"], group), 200), "commit 200", 10
            )
            fresh = redis.Redis.from_url(own_redis.url)
            assert await _item_clicks(fresh, 10) == 200
            await fresh.aclose()
    finally:
        await client.aclose()


def _ingest_process(env: dict[str, str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("ab") as fh:
        return subprocess.Popen([sys.executable, "-m", "services.feature.ingest"], env=env, stdout=fh,
                                stderr=subprocess.STDOUT, cwd=ROOT)  # fmt: skip


async def test_consumer_killed_mid_stream_ends_exact(
    own_redis: OwnRedis, kafka_bootstrap: str, topics: dict[str, str], tmp_path: Path
) -> None:
    n, items = 20_000, 20
    await _produce(kafka_bootstrap, topics["events"], _clicks(n, items, "k"))
    env = dict(os.environ, REDIS_URL=own_redis.url, KAFKA_BOOTSTRAP=kafka_bootstrap,
               RECMESH_EVENTS_TOPIC=topics["events"], RECMESH_DLQ_TOPIC=topics["dlq"],
               RECMESH_CONSUMER_GROUP=f"g-{topics['events']}", INGEST_METRICS_PORT=str(free_port()),
               RECMESH_INGEST_MAX_BATCH="500")  # fmt: skip
    client = redis.Redis.from_url(own_redis.url)
    proc = _ingest_process(env, tmp_path / "ingest.log")
    try:

        async def under_way() -> bool:
            return await _item_clicks(client, items) > 1000

        await poll_until(under_way, "consumer under way", 30)
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
        partial = await _item_clicks(client, items)
        assert partial < n, "killed before it finished"
        env["INGEST_METRICS_PORT"] = str(free_port())
        proc = _ingest_process(env, tmp_path / "ingest.log")
        await poll_until(_equals(lambda: _item_clicks(client, items), n), f"all {n} clicks applied once", 60)
        group = env["RECMESH_CONSUMER_GROUP"]
        committed = _equals(lambda: _committed(kafka_bootstrap, topics["events"], group), n)
        await poll_until(committed, "offsets committed to the end", 20)
        assert await _item_clicks(client, items) == n, "nothing counted twice"
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(15)
        await client.aclose()


async def test_broker_restart_consumer_carries_on(tmp_path: Path, own_redis: OwnRedis) -> None:
    port = free_port()
    bootstrap = f"127.0.0.1:{port}"
    broker = broker_process(port, tmp_path)
    broker.start()
    await wait_tcp("127.0.0.1", port, 10, broker)
    await ensure_topics(bootstrap, {"ub": 3, "ub.dlq": 1})
    settings = IngestSettings(kafka_bootstrap=bootstrap, redis_url=own_redis.url, events_topic="ub",
                              dlq_topic="ub.dlq", consumer_group="g-restart")  # fmt: skip
    client = connect(own_redis.url, 4)
    try:
        async with running(settings, FeatureStore(client, FEATURE_SET), metadata_max_age_ms=1000) as ingestor:
            await _produce(bootstrap, "ub", _clicks(50, 5, "before"))
            await poll_until(
                lambda: asyncio.sleep(0, ingestor.applied == 50), "applied before the restart", 20
            )
            broker.stop()
            broker = broker_process(port, tmp_path)  # memory storage: the topic comes back empty
            broker.start()
            await wait_tcp("127.0.0.1", port, 10, broker)
            await ensure_topics(bootstrap, {"ub": 3, "ub.dlq": 1})
            await _produce(bootstrap, "ub", _clicks(50, 5, "after"))
            await poll_until(
                lambda: asyncio.sleep(0, ingestor.applied >= 100), "applied after the restart", 60
            )
            fresh = redis.Redis.from_url(own_redis.url)
            assert await _item_clicks(fresh, 5) == 100
            await fresh.aclose()
    finally:
        await client.aclose()
        broker.stop()


# Tiled state (recmesh/features/tiles.py): no event ids are kept per tile, so a consumer
# killed mid-batch is made exact by the offsets its batch recorded: in the write script's
# applied hash on one Redis, in each tiles key's own marks on a cluster (whose writes are
# several pipelines).
TILED_REPOSITORY = """
[repository]
name = "faults-tiled"

[events]
behaviors = ["view", "click"]

[realtime.item_clicks_1h]
entity = "item"
aggregate = "count"
behaviors = ["click"]
window = "1h"
slide = "1m"

[realtime.user_clicks_10m]
entity = "user"
aggregate = "count"
behaviors = ["click"]
window = "10m"
slide = "30s"

[state]
dedup = "10m"
"""


async def _tile_clicks(client: Any, items: int) -> int:
    return await tile_events(client, [f"i{i}" for i in range(items)], "click@1m")


@pytest.mark.parametrize("backend", ["redis", "cluster"])
async def test_consumers_in_one_group_one_killed_mid_batch_end_exact(
    backend: str, request: pytest.FixtureRequest, kafka_bootstrap: str, redis_cluster_url: str,
    topics: dict[str, str], tmp_path: Path,
) -> None:  # fmt: skip
    """Three ingest processes share the topic's three partitions; one is SIGKILLed
    mid-stream while the others carry on and take its partitions over: every click
    counted once in the tiles, and every offset committed."""
    n, items = 15_000, 20
    if backend == "cluster":
        url = redis_cluster_url
    else:
        url = (await _started(OwnRedis(tmp_path / "redis"), request)).url
    repo = tmp_path / "recmesh.toml"
    repo.write_text(TILED_REPOSITORY)
    client = connect(url, 8)
    for i in range(items):  # a cluster fixture is shared by the session: start from nothing
        await client.delete(keys.stream("item", f"i{i}", "click@1m"))
    await _produce(kafka_bootstrap, topics["events"], _clicks(n, items, f"m{backend}"))
    group = f"g-{topics['events']}"
    env = dict(os.environ, REDIS_URL=url, KAFKA_BOOTSTRAP=kafka_bootstrap, RECMESH_REPOSITORY=str(repo),
               RECMESH_EVENTS_TOPIC=topics["events"], RECMESH_DLQ_TOPIC=topics["dlq"],
               RECMESH_CONSUMER_GROUP=group, RECMESH_INGEST_MAX_BATCH="300")  # fmt: skip
    procs = [
        _ingest_process({**env, "INGEST_METRICS_PORT": str(free_port())}, tmp_path / f"ingest-{k}.log")
        for k in range(3)
    ]
    try:

        async def under_way() -> bool:
            return await _tile_clicks(client, items) > 1500

        await poll_until(under_way, "consumers under way", 60)
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait(10)
        assert await _tile_clicks(client, items) < n, "killed before the end"
        await poll_until(_equals(lambda: _tile_clicks(client, items), n), f"all {n} clicks applied once", 120)
        committed = _equals(lambda: _committed(kafka_bootstrap, topics["events"], group), n)
        await poll_until(committed, "offsets committed to the end", 60)
        assert await _tile_clicks(client, items) == n, "nothing counted twice"
    finally:
        for p in procs[1:]:
            p.send_signal(signal.SIGTERM)
        for p in procs[1:]:
            p.wait(20)
        await client.aclose()


async def _started(r: OwnRedis, request: pytest.FixtureRequest) -> OwnRedis:
    await r.start()
    request.addfinalizer(r.stop)
    return r
