"""Items' held real-time reads against a real Redis: look-ups answer exactly what a
look-up without them answers, the ingest's write drops what it changed (pub/sub),
ages stay true, and the ACL users of `recmesh up` may publish and follow."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import redis.asyncio as redis

from recmesh.credentials import aclfile
from recmesh.events import Event
from recmesh.features import keys
from recmesh.features.repository import FeatureSet
from recmesh.tools.localinfra import free_port, redis_process, wait_tcp
from services.feature.item_cache import LOOKUPS, ItemReadCache
from services.feature.store import FeatureStore
from services.feature.writer import EventWriter

ITEMS = [f"ic{n}" for n in range(8)]


@pytest.fixture
async def client(redis_url: str) -> AsyncIterator[redis.Redis]:
    base = redis_url.rsplit("/", 1)[0]
    c = redis.Redis.from_url(f"{base}/6", protocol=2)
    await c.flushdb()
    yield c
    await c.flushdb()
    await c.aclose()


def _event(n: int, item: str, at_ms: int, behavior: str = "view") -> Event:
    return Event(event_id=f"icache-{n}", user_id="icu", item_id=item, behavior=behavior, event_time=at_ms)


async def _until(check: object, what: str, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def _following(client: redis.Redis, cache: ItemReadCache) -> AsyncIterator[None]:
    task = asyncio.create_task(cache.follow(client))
    try:
        await _until(lambda: cache.serving, "the cache subscribes")
        yield
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


def _hits() -> float:
    return float(LOOKUPS.labels("hit")._value.get())


async def test_held_reads_answer_as_redis_does_until_the_ingest_writes(
    client: redis.Redis, demo_feature_set: FeatureSet
) -> None:
    now = int(time.time() * 1000)
    plain = FeatureStore(client, demo_feature_set)
    cache = ItemReadCache(bound_ms=10_000)  # long: what refreshes below is the ingest's word
    held = FeatureStore(client, demo_feature_set, item_reads=cache)
    writer = EventWriter(client, demo_feature_set, plain.offline.attributes)
    await writer.apply([_event(n, ITEMS[n % 4], now - 60_000 + n) for n in range(12)])
    async with _following(client, cache):
        first = await held.lookup("icu", ITEMS, now, 2.0)
        hits = _hits()
        again = await held.lookup("icu", ITEMS, now, 2.0)
        assert _hits() - hits == len(ITEMS), "the second look-up read no item from Redis"
        assert (
            again.item_columns
            == first.item_columns
            == (await plain.lookup("icu", ITEMS, now, 2.0)).item_columns
        )

        later = now + 3_000  # ages count from the look-up's own as_of
        aged = await held.lookup("icu", ITEMS, later, 2.0)
        assert aged.item_columns == (await plain.lookup("icu", ITEMS, later, 2.0)).item_columns
        ages = [a for c in aged.item_columns.values() for a in c.ages if a >= 0]
        assert ages and all(a >= 3_000 for a in ages)

        await writer.apply([_event(100, ITEMS[0], now - 10), _event(101, ITEMS[5], now - 10, "click")])
        expected = (await plain.lookup("icu", ITEMS, now, 2.0)).item_columns
        assert expected != first.item_columns, "the new events change the features"

        async def current() -> bool:
            return (await held.lookup("icu", ITEMS, now, 2.0)).item_columns == expected

        deadline = time.monotonic() + 2.0
        while not await current():
            assert time.monotonic() < deadline, "the write's items were not dropped within 2 s (bound: 10 s)"
            await asyncio.sleep(0.01)
    await held.aclose()
    await plain.aclose()


async def test_not_subscribed_serves_nothing_held(client: redis.Redis, demo_feature_set: FeatureSet) -> None:
    now = int(time.time() * 1000)
    cache = ItemReadCache(bound_ms=10_000)
    held = FeatureStore(client, demo_feature_set, item_reads=cache)
    await held.lookup("icu", ITEMS, now, 2.0)
    hits = _hits()
    await held.lookup("icu", ITEMS, now, 2.0)
    assert _hits() == hits
    await held.aclose()


async def test_the_acl_users_may_publish_and_follow(tmp_path: Path, demo_feature_set: FeatureSet) -> None:
    acl = tmp_path / "users.acl"
    acl.write_text(aclfile({"ingest": "pw-i", "feature": "pw-f"}))
    port = free_port()
    proc = redis_process(port, tmp_path / "redis", tmp_path, ["--aclfile", str(acl)])
    proc.start()
    try:
        await wait_tcp("127.0.0.1", port, 10, proc)
        feature = redis.Redis(port=port, username="feature", password="pw-f", protocol=2)
        ingest = redis.Redis(port=port, username="ingest", password="pw-i", protocol=2)
        cache = ItemReadCache(bound_ms=10_000)
        async with _following(feature, cache):
            cache.put(["x"], [(1, 1)], as_of_ms=0, read_at=time.monotonic())
            writer = EventWriter(
                ingest, demo_feature_set, FeatureStore(ingest, demo_feature_set).offline.attributes
            )
            await writer.apply([_event(1, "x", int(time.time() * 1000))])
            await _until(lambda: cache.get(["x"], 0, time.monotonic())[0] == {}, "the write dropped x")
        assert await ingest.publish(keys.ITEMS_CHANGED, "y") >= 0
        await feature.aclose()
        await ingest.aclose()
    finally:
        proc.stop()


async def test_on_a_cluster_the_cache_stays_off(redis_cluster_url: str) -> None:
    from recmesh.redis_client import connect

    client = connect(redis_cluster_url, 4)
    cache = ItemReadCache(bound_ms=10_000)
    await asyncio.wait_for(cache.follow(client), 5)  # returns at once: nothing to follow
    assert not cache.serving
    await client.aclose()
